"""Blocks of a model for FSDP plans: finding them, applying an activation policy to one, and
measuring the phases `planner.sim.fsdp` composes (one process, CPU, the allocator's records).

- `find_blocks(model)`: the model's chain of repeated blocks (the longest `nn.ModuleList` of
  modules of one class: GPT's `h`, Llama's `layers`) as (qualified name, module) pairs.
- `apply_policy(block, policy)`: `keep` leaves it alone; `full` runs its forward under
  non-reentrant `torch.utils.checkpoint` (saves the block's inputs, reruns it in the backward);
  `selective` does the same with a selective-checkpoint context
  (`create_selective_checkpoint_contexts`) that keeps every matmul's output (mm, addmm, bmm,
  attention kernels: torchtitan's "op" policy without its every-other-matmul rule) and reruns the
  rest. The block's own forward is wrapped on the instance, so parameter names do not change and
  `fully_shard` may be applied after it (torchtitan's order: activation checkpointing, then
  `fully_shard` per block, then the root).
- `profile_blocks(build, inputs, world_sizes)`: one forward and backward per policy (every block
  under it) with markers at the block boundaries; the allocator's records (planner.tracing.
  allocator_events' reading of torch.profiler) are split at the markers into phases: the head's
  forward, each block's forward, the tail's forward (after the last block, the loss included),
  the tail's backward, each block's backward, the head's backward; a phase's peak is above the
  bytes live at its start. Times come from unprofiled steps, the policies in turn, `repeats`
  rounds: the least per phase.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from planner.sim.fsdp import POLICIES, BlockCosts, FsdpModel, Phase

if TYPE_CHECKING:
    from planner.core.graph import Graph

__all__ = ["apply_policy", "find_blocks", "graph_with_fsdp_model", "padded_bytes",
           "profile_blocks", "SAVED_OPS"]

_aten = torch.ops.aten
SAVED_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}
_MARK = "fsdp_mark::"


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The longest ModuleList of same-class modules: the chain FSDP shards block by block."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 \
                and len({type(m) for m in mod}) == 1:
            if best is None or len(mod) > len(best[1]):
                best = (name, mod)
    if best is None:
        raise ValueError("no chain of blocks (an nn.ModuleList of one module class) in the model")
    prefix, blocks = best
    return [(f"{prefix}.{i}" if prefix else str(i), m) for i, m in enumerate(blocks)]


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_policy(block: nn.Module, policy: str) -> None:
    """Wrap `block`'s forward for `policy` (see the module docstring); `keep` does nothing."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    if policy == "keep":
        return
    inner = type(block).forward.__get__(block)
    selective = policy == "selective"

    def forward(*args: Any, **kwargs: Any) -> Any:
        if selective:
            return checkpoint(inner, *args, use_reentrant=False,
                              context_fn=lambda: create_selective_checkpoint_contexts(
                                  _selective_policy), **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def padded_bytes(params: Sequence[torch.Tensor], world: int) -> int:
    """Bytes of `params` unsharded with dim 0 padded to a multiple of `world` (FSDP2's shards)."""
    total = 0
    for p in params:
        if p.dim() == 0:
            rows, rest = 1, 1
        else:
            rows, rest = p.shape[0], p[0].numel() if p.shape[0] else 0
        padded_rows = -(-rows // world) * world
        total += padded_rows * rest * p.element_size()
    return total


class _Mark(torch.autograd.Function):
    """Identity that leaves a profiler mark when its forward and its backward run."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tag: str, clock: list[tuple[str, float]] | None
                ) -> torch.Tensor:
        ctx.tag, ctx.clock = tag, clock
        _stamp(f"f{tag}", clock)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        _stamp(f"b{ctx.tag}", ctx.clock)
        return grad, None, None


def _stamp(name: str, clock: list[tuple[str, float]] | None) -> None:
    if clock is not None:
        clock.append((name, time.perf_counter()))
    with record_function(_MARK + name):
        pass


def _marked(model: nn.Module, blocks: list[nn.Module],
            clock: list[tuple[str, float]] | None) -> list[Any]:
    handles = []
    n = len(blocks)
    for i, blk in enumerate(blocks):
        def pre(mod: nn.Module, args: tuple[Any, ...], tag: str = str(i)) -> tuple[Any, ...]:
            return (_Mark.apply(args[0], tag, clock), *args[1:])
        handles.append(blk.register_forward_pre_hook(pre))
    def post(mod: nn.Module, args: Any, out: Any) -> Any:
        return _Mark.apply(out, str(n), clock)
    handles.append(blocks[-1].register_forward_hook(post))
    return handles


def _phases_of(records: list[tuple[int, int]], marks: dict[str, int], n: int
               ) -> list[tuple[str, Phase]]:
    """Split (time, delta) allocator records at the marks into named phases."""
    bounds = [("head forward", "start", "f0")]
    bounds += [(f"block {i} forward", f"f{i}", f"f{i + 1}") for i in range(n)]
    bounds += [("tail forward", f"f{n}", "loss"), ("tail backward", "loss", f"b{n}")]
    bounds += [(f"block {i} backward", f"b{i + 1}", f"b{i}") for i in range(n - 1, -1, -1)]
    bounds += [("head backward", "b0", "end")]
    times = {"start": -1, "end": 2**63, **marks}
    out = []
    for name, lo, hi in bounds:
        t0, t1 = times[lo], times[hi]
        live = peak = 0
        for t, delta in records:
            if t0 <= t < t1:
                live += delta
                peak = max(peak, live)
        out.append((name, Phase(peak, live)))
    return out


def _allocator_records(prof: Any) -> tuple[list[tuple[int, int]], dict[str, int]]:
    records: list[tuple[int, int]] = []
    marks: dict[str, int] = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        kind, fields = event.typed
        if kind == _EventType.Allocation:
            if fields.device.type == "cpu":
                records.append((event.start_time_ns, fields.alloc_size))
            continue
        if event.name.startswith(_MARK):
            marks[event.name[len(_MARK):]] = event.start_time_ns
        stack.extend(event.children)
    records.sort()
    return records, marks


def _one_step(model: nn.Module, inputs: Sequence[Any]) -> None:
    loss = model(*inputs)
    _stamp("loss", _CLOCK[-1] if _CLOCK else None)
    loss.backward()


_CLOCK: list[list[tuple[str, float]]] = []


def _memory_phases(model: nn.Module, inputs: Sequence[Any]) -> list[tuple[str, Phase]]:
    """The allocator's phases of one step (after a warm-up step), blocks marked."""
    blocks = [m for _, m in find_blocks(model)]
    handles = _marked(model, blocks, None)
    try:
        model.zero_grad(set_to_none=True)
        _one_step(model, inputs)  # warm up (lazy allocations, kernels)
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _one_step(model, inputs)
        model.zero_grad(set_to_none=True)
    finally:
        for h in handles:
            h.remove()
    records, marks = _allocator_records(prof)
    return _phases_of(records, marks, len(blocks))


def _timed_phases(model: nn.Module, inputs: Sequence[Any]) -> dict[str, float]:
    """One unprofiled step with wall-clock stamps at the block marks: ms per phase."""
    blocks = [m for _, m in find_blocks(model)]
    clock: list[tuple[str, float]] = []
    handles = _marked(model, blocks, clock)
    _CLOCK.append(clock)
    try:
        t0 = time.perf_counter()
        _one_step(model, inputs)
        t1 = time.perf_counter()
    finally:
        _CLOCK.pop()
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    return _phase_ms({"start": t0, "end": t1, **dict(clock)}, len(blocks))


def _phase_ms(stamps: dict[str, float], n: int) -> dict[str, float]:
    def gap(a: str, b: str) -> float:
        return max(0.0, (stamps[b] - stamps[a]) * 1e3)
    out = {"head forward": gap("start", "f0"), "tail forward": gap(f"f{n}", "loss"),
           "tail backward": gap("loss", f"b{n}"), "head backward": gap("b0", "end")}
    for i in range(n):
        out[f"block {i} forward"] = gap(f"f{i}", f"f{i + 1}")
        out[f"block {i} backward"] = gap(f"b{i + 1}", f"b{i}")
    return out


def profile_blocks(build: Callable[[], tuple[nn.Module, Sequence[Any]]],
                   world_sizes: Sequence[int] = (2,), policies: Sequence[str] = POLICIES,
                   repeats: int = 5, optimizer_bytes_per_param_byte: float = 2.0
                   ) -> FsdpModel:
    """The model's FSDP summary for `planner.sim.fsdp`: `build()` returns a fresh (model,
    inputs) for one rank's micro-batch (the model in training mode on CPU, returning its loss)."""
    template, inputs = build()
    named = find_blocks(template)
    block_names = [n for n, _ in named]
    models = {}
    for policy in policies:
        models[policy] = copy.deepcopy(template)
        for _, blk in find_blocks(models[policy]):
            apply_policy(blk, policy)
    memory = {policy: _memory_phases(m, inputs) for policy, m in models.items()}
    # times: rounds over the policies, the least per phase (a shared machine slows a whole
    # round, not one policy)
    rounds = [{policy: _timed_phases(m, inputs) for policy, m in models.items()}
              for _ in range(repeats)]
    per_policy = {policy: (memory[policy],
                           {k: min(r[policy][k] for r in rounds) for k in rounds[0][policy]})
                  for policy in models}
    in_blocks: set[int] = set()
    block_params: list[list[torch.Tensor]] = []
    for _, blk in named:
        ps: list[torch.Tensor] = [p for p in blk.parameters() if p.requires_grad]
        in_blocks.update(id(p) for p in ps)
        block_params.append(ps)
    root_params = [p for p in template.parameters() if id(p) not in in_blocks and p.requires_grad]

    def phase(policy: str, name: str) -> Phase:
        phases, ms = per_policy[policy]
        ph = dict(phases)[name]
        return Phase(ph.peak, ph.delta, ms[name])

    base = "keep" if "keep" in per_policy else next(iter(per_policy))
    blocks = []
    for i, (name, ps) in enumerate(zip(block_names, block_params, strict=True)):
        blocks.append(BlockCosts(
            name=name,
            param_bytes=sum(p.numel() * p.element_size() for p in ps),
            padded_bytes={w: padded_bytes(ps, w) for w in world_sizes},
            forward={pol: phase(pol, f"block {i} forward") for pol in per_policy},
            backward={pol: phase(pol, f"block {i} backward") for pol in per_policy},
        ))
    return FsdpModel(
        root_param_bytes=sum(p.numel() * p.element_size() for p in root_params),
        root_padded_bytes={w: padded_bytes(root_params, w) for w in world_sizes},
        head_forward=phase(base, "head forward"),
        tail_forward=phase(base, "tail forward"),
        tail_backward=phase(base, "tail backward"),
        head_backward=phase(base, "head backward"),
        blocks=tuple(blocks),
        optimizer_bytes_per_param_byte=optimizer_bytes_per_param_byte,
    )


def graph_with_fsdp_model(graph: Graph, model: nn.Module, inputs: Sequence[Any],
                          world_sizes: Sequence[int], loss_fn: Any = None,
                          repeats: int = 5) -> Graph:
    """`graph` with the model's FSDP block profile (`profile_blocks` on copies of `model` and
    the loss, `inputs` being one rank's batch) in `metadata.extra["fsdp_model"]`: what the
    `fsdp` method plans with (`planner-cli trace --fsdp-ranks 2,4`). InputError when the model
    has no chain of repeated blocks."""
    from planner.core.errors import InputError
    from planner.sim.fsdp_plans import FSDP_MODEL_KEY
    from planner.tracing.capture import LossWrapper

    try:
        find_blocks(model)
    except ValueError:
        raise InputError("FSDP profile: the model has no nn.ModuleList of repeated blocks to "
                         "shard one by one (GPT's h, Llama's layers)") from None

    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        fresh = copy.deepcopy(model)
        for p in fresh.parameters():  # gradients left by tracing would change the backward's
            p.grad = None
        return LossWrapper(fresh, loss_fn).train(), tuple(inputs)

    profile = profile_blocks(build, world_sizes=tuple(world_sizes), repeats=repeats)
    extra = {**graph.metadata.extra, FSDP_MODEL_KEY: profile.to_dict()}
    return graph.model_copy(update={"metadata": graph.metadata.model_copy(
        update={"extra": extra})})


def iter_block_params(model: nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """Parameters of the model's blocks with their qualified names."""
    for prefix, blk in find_blocks(model):
        for n, p in blk.named_parameters():
            yield f"{prefix}.{n}", p
