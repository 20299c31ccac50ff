"""Module-level tracing: one forward and one backward node per leaf module or per block.

One eager training step runs under a dispatch mode that sees every aten op. An op belongs to
the unit (leaf module, or block matching `block_pattern`) entered most recently in forward
order; in the backward pass to the unit whose forward created the running autograd node
(autograd sequence numbers). Per unit this measures the Rotor quantities: x (output bytes),
x̄ (bytes kept for backward: saved tensors and the output, each storage once), forward and
backward temporary bytes (peak inside the unit above what is live at its end), and costs
(median op times over repeated steps, or a roofline estimate from FLOPs and bytes).
Data flow between units (skip connections) comes from which unit produced each storage read.
"""

from __future__ import annotations

import bisect
import fnmatch
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from planner.core.errors import InputError
from planner.tracing.memory import StorageTracker, _aliases_input
from planner.tracing.unit_graph import unit_graph


@dataclass
class Unit:
    name: str  # module path (with "#k" for the k-th extra call of a reused module)
    start_seq: int = 0
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    fwd_bytes_moved: int = 0
    bwd_bytes_moved: int = 0
    fwd_ops: int = 0
    bwd_ops: int = 0
    output_bytes: int = 0
    input_bytes: int = 0
    saved: dict[int, int] = field(default_factory=dict)  # storage ptr -> bytes
    output_storages: dict[int, int] = field(default_factory=dict)
    fwd_peak: int = 0
    fwd_end: int = 0
    bwd_peak: int = 0
    bwd_start: int = -1
    bwd_end: int = 0
    reads_from: set[int] = field(default_factory=set)  # units whose outputs it reads
    read_bytes: int = 0  # the largest floating tensor it reads in forward that a unit before made
    read_out: set[int] = field(default_factory=set)  # its storages another unit reads in forward
    dead_at_end: set[int] = field(default_factory=set)  # its outputs freed by its last forward op
    freed_outputs: dict[int, int] = field(default_factory=dict)  # see `freed_outputs`


def select_units(model: torch.nn.Module, block_pattern: str | None) -> list[str]:
    """Block FQNs matching the pattern (outermost) plus leaf modules outside them."""
    names = [n for n, _ in model.named_modules() if n]
    blocks: list[str] = []
    if block_pattern:
        for n in names:
            if fnmatch.fnmatchcase(n, block_pattern) and not any(
                n.startswith(b + ".") for b in blocks
            ):
                blocks.append(n)
        if not blocks:
            raise InputError(
                f"--block-pattern {block_pattern!r} matches no module (e.g. {', '.join(names[:4])})"
            )
    leaves = [
        n
        for n, m in model.named_modules()
        if n and not list(m.children()) and not any(n == b or n.startswith(b + ".") for b in blocks)
    ]
    return blocks + leaves


class _UnitMode(StorageTracker):
    """Storage tracking plus per-unit attribution of op time, FLOPs and memory."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__(keep_timeline=False)
        self.rec = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rec = self.rec
        self.sweep()
        unit = rec.current_unit()
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if rec.cuda:
            torch.cuda.synchronize()
        t0 = rec.now()
        out = func(*args, **(kwargs or {}))
        if rec.cuda:
            torch.cuda.synchronize()
        ms = (rec.now() - t0) * 1e3
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not _aliases_input(func):
            ins = {a.untyped_storage().data_ptr() for a in flat_in}
            for t in outs:
                if t.untyped_storage().data_ptr() not in ins:
                    self.add(t)
                    if not rec.backward and unit is not None:
                        rec.producer[t.untyped_storage().data_ptr()] = unit
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if unit is not None:
            rec.account(unit, func, args, kwargs, out, flat_in, outs, ms, self.live_bytes)
        return out


class _Recorder:
    def __init__(self, units: list[Unit], cuda: bool, clock: str = "wall") -> None:
        from planner.tracing.costs import clock_fn

        self.units = units
        self.cuda = cuda
        self.now = time.perf_counter if cuda else clock_fn(clock)
        self.backward = False
        self.order: list[int] = []  # unit indices in forward order of their start
        self.starts: list[int] = []  # autograd sequence numbers where they start
        self.producer: dict[int, int] = {}  # storage ptr -> unit that made it in forward
        self.tracker: _UnitMode | None = None

    def current_unit(self) -> int | None:
        if not self.order:
            return None
        if not self.backward:
            return self.order[-1]
        node = torch._C._current_autograd_node()
        if node is None:
            return self.order[-1]
        k = bisect.bisect_right(self.starts, node._sequence_nr()) - 1
        return self.order[max(k, 0)]

    def account(
        self,
        u: int,
        func: Any,
        args: Any,
        kwargs: Any,
        out: Any,
        flat_in: list[torch.Tensor],
        outs: list[torch.Tensor],
        ms: float,
        live: int,
    ) -> None:
        from planner.tracing.records import dense_bytes

        unit = self.units[u]
        flops = _flops(func, args, kwargs, out)
        moved = 0 if _aliases_input(func) else dense_bytes(flat_in) + dense_bytes(outs)
        if self.backward:
            unit.bwd_ms += ms
            unit.bwd_flops += flops
            unit.bwd_bytes_moved += moved
            unit.bwd_ops += 1
            if unit.bwd_start < 0:
                unit.bwd_start = live
            unit.bwd_peak = max(unit.bwd_peak, live)
            unit.bwd_end = live
        else:
            unit.fwd_ms += ms
            unit.fwd_flops += flops
            unit.fwd_bytes_moved += moved
            unit.fwd_ops += 1
            unit.fwd_peak = max(unit.fwd_peak, live)
            unit.fwd_end = live
            for a in flat_in:
                ptr = a.untyped_storage().data_ptr()
                p = self.producer.get(ptr)
                if p is not None and p != u:
                    unit.reads_from.add(p)
                    self.units[p].read_out.add(ptr)
                    if a.is_floating_point():  # its gradient crosses back from this unit
                        unit.read_bytes = max(unit.read_bytes, a.numel() * a.element_size())
            if unit.output_storages and self.tracker is not None:
                storages = self.tracker.storages
                unit.dead_at_end = {k for k in unit.output_storages if k not in storages}


def _flops(func: Any, args: Any, kwargs: Any, out: Any) -> float:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(getattr(func, "overloadpacket", None))
    if formula is None:
        return 0.0
    try:
        return float(formula(*args, **(kwargs or {}), out_val=out))
    except Exception:
        return 0.0


def instrumented_step(
    model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: Any, unit_names: list[str],
    clock: str = "wall",
) -> list[Unit]:
    """One eager step with per-unit attribution; units in forward call order."""
    from planner.tracing.capture import compute_loss

    modules = dict(model.named_modules())
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    units: list[Unit] = []
    rec = _Recorder(units, device.type == "cuda", clock)
    calls: dict[str, int] = {}
    leaves = {p.untyped_storage().data_ptr() for p in model.parameters()}
    leaves |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    leaves |= {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}

    def pre_hook(name: str) -> Any:
        def hook(_m: Any, args: Any) -> None:
            k = calls.get(name, 0)
            calls[name] = k + 1
            unit = Unit(name if k == 0 else f"{name}#{k}")
            unit.start_seq = torch._C._autograd._get_sequence_nr()
            unit.input_bytes = _tensor_bytes(args)
            units.append(unit)
            rec.order.append(len(units) - 1)
            rec.starts.append(unit.start_seq)

        return hook

    def post_hook(_m: Any, _args: Any, out: Any) -> None:
        unit = units[rec.order[-1]]
        unit.output_bytes = _tensor_bytes(out)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                unit.output_storages[s.data_ptr()] = s.nbytes()

    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if rec.order and not rec.backward:
            s = t.untyped_storage()
            u = rec.order[-1]
            # x̄ counts what this unit made; saved inputs belong to their producer's x.
            if s.data_ptr() not in leaves and rec.producer.get(s.data_ptr()) == u:
                units[u].saved[s.data_ptr()] = s.nbytes()
        kept.append(t)
        return t

    handles = []
    for name in unit_names:
        handles.append(modules[name].register_forward_pre_hook(pre_hook(name)))
        handles.append(modules[name].register_forward_hook(post_hook))
    model.zero_grad(set_to_none=True)
    mode = _UnitMode(rec)
    rec.tracker = mode
    try:
        with mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = compute_loss(model(*inputs), loss_fn)
            kept.clear()
            mode.sweep()
            freed_outputs(units, rec.producer, mode)
            rec.backward = True
            loss.backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    if not units:
        raise InputError("no module ran in the forward pass: nothing to trace at module level")
    return units


def freed_outputs(units: list[Unit], producer: dict[int, int], mode: StorageTracker) -> None:
    """Per unit (when the forward has ended) the output storages it made that no other unit
    reads in forward and that are gone before the backward starts: torch frees them (a GPT's
    logits once the loss's log-softmax has read them; a position embedding's output once
    added), so the graph does not keep them for the backward (`graph_forward_sizes`)."""
    for k, u in enumerate(units):
        u.freed_outputs = {
            ptr: n for ptr, n in u.output_storages.items()
            if producer.get(ptr) == k and ptr not in u.read_out and ptr not in mode.storages
            and ptr not in u.saved
        }


def graph_forward_sizes(u: Unit, saved_bytes: int, tmp_bytes: int) -> tuple[int, int]:
    """(bytes kept, transient bytes) of a unit's forward node in the graph: the chain's x̄
    less its `freed_outputs`, and its transient plus those of them still alive at its last
    forward op (the transient is measured above what is alive there). Measured on 2 gloo
    ranks (GPT, vocab 32,768): the head's logits, charged to the end of the backward, made
    the last rank's prediction 1.14x torch's."""
    freed = sum(u.freed_outputs.values())
    alive = sum(n for k, n in u.freed_outputs.items() if k not in u.dead_at_end)
    return max(0, saved_bytes - freed), tmp_bytes + alive


def _tensor_bytes(value: Any) -> int:
    return sum(
        int(t.numel() * t.element_size())
        for t in tree_flatten(value)[0]
        if isinstance(t, torch.Tensor)
    )


def trace_modules(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    *,
    loss_fn: Any,
    block_pattern: str | None,
    costs: str,
    device_profile: str,
    optimizer: str,
    repeats: int,
    warmup: int,
    model_name: str,
    progress: Any = None,
    clock: str = "wall",
) -> Any:
    from planner.tracing.profiles import load_profile
    from planner.tracing.step_state import TraceResult, batch_size, dtype_name, fixed_memory

    profile = load_profile(device_profile) if costs == "estimate" else None
    names = select_units(model, block_pattern)
    runs = warmup + repeats if costs == "measure" else 1
    samples: list[list[Unit]] = []
    for i in range(runs):
        samples.append(instrumented_step(model, inputs, loss_fn, names, clock))
        if progress:
            progress("module step", i + 1, runs)
    units = samples[-1]
    timed = samples[warmup:] if costs == "measure" else samples
    if any(len(s) != len(units) for s in timed):
        raise InputError("the model ran a different set of modules in each step; use --level op")
    stages = []
    forward: list[tuple[Unit, int, int]] = []  # (unit, x̄, forward transient) for the graph
    for k, u in enumerate(units):
        if profile is not None:
            dtype = dtype_name(model) or "float32"
            fwd = (
                profile.roofline_ms(u.fwd_flops, u.fwd_bytes_moved, dtype)
                + (u.fwd_ops - 1) * profile.op_overhead_ms
            )
            bwd = (
                profile.roofline_ms(u.bwd_flops, u.bwd_bytes_moved, dtype)
                + (max(u.bwd_ops, 1) - 1) * profile.op_overhead_ms
            )
        else:
            fwd = statistics.median(s[k].fwd_ms for s in timed)
            bwd = statistics.median(s[k].bwd_ms for s in timed)
        kept = dict(u.saved)
        kept.update(u.output_storages)
        saved = max(sum(kept.values()), u.output_bytes)
        forward.append((u, saved, max(0, u.fwd_peak - u.fwd_end)))
        stages.append(
            {
                "name": u.name,
                "forward_ms": fwd,
                "backward_ms": bwd,
                "output_bytes": u.output_bytes,
                "saved_bytes": saved,
                "forward_tmp_bytes": max(0, u.fwd_peak - u.fwd_end),
                "backward_tmp_bytes": max(0, u.bwd_peak - max(u.bwd_end, u.bwd_start, 0)),
                # the gradient it sends back: of its input, or of a larger tensor an earlier
                # unit made that its glue reads (`tok(idx) + pos(p)`, run after pos: pos's
                # input is the positions, the gradient it sends is of tok's output)
                "grad_input_bytes": max(u.input_bytes, u.read_bytes),
            }
        )
    graph = unit_graph(
        model,
        inputs,
        units,
        stages,
        [graph_forward_sizes(u, saved, tmp) for u, saved, tmp in forward],
        optimizer,
        costs,
        model_name,
        block_pattern,
        profile.name if profile else "measured",
        batch_size(inputs),
        dtype_name(model),
        fixed_memory,
    )
    non_chain = [
        (units[j].name, u.name) for i, u in enumerate(units) for j in u.reads_from if j != i - 1
    ]
    chain = {
        "schema_version": "chain-1",
        "name": model_name,
        "input_bytes": stages[0]["grad_input_bytes"],
        "fixed_bytes": graph.fixed_bytes,
        "stages": stages,
    }
    return TraceResult(
        graph=graph,
        level="module",
        details={"chain": chain, "skip_edges": non_chain, "is_chain": not non_chain},
    )
