"""Apply an FSDP plan (`planner.sim.fsdp.FsdpPlan`) to a model and run it on torch.distributed.

`apply_fsdp_plan(model, plan)` does what torchtitan does, in its order: each block's activation
policy first (`planner.tracing.fsdp_blocks.apply_policy`: non-reentrant checkpoint, or a
selective-checkpoint context keeping matmul outputs), then `fully_shard(block,
reshard_after_forward=plan.reshard[i])` per block, then `fully_shard(model)` for the root, and
the plan's prefetch depth as explicit prefetch lists (`set_modules_to_forward_prefetch` /
`set_modules_to_backward_prefetch`: the next `prefetch` blocks, in each direction; the root
prefetches the first blocks in the forward and the last in the backward; prefetch 0 turns
FSDP2's default backward prefetch off).

`run_fsdp_ranks(spec, plan, world)` starts `world` gloo ranks on this machine
(`torch.multiprocessing.spawn`), each building the model from `spec` (a zoo factory and its
keywords: every rank the same weights), taking its slice of the batch, applying the plan, running
one warm-up step (FSDP2 initialises lazily) and one measured step: the allocator's peak over
forward and backward (planner.tracing.allocator_events: the step starts with gradients cleared,
so the sharded parameters are there before and not counted), the step's wall time, and every
gradient gathered to its full tensor and compared with one process's step on the whole batch
(the ranks' mean loss: FSDP2 averages the gradients over ranks).
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)

from planner.core.errors import InputError
from planner.core.plan import Plan, PlanStatus
from planner.sim.fsdp import FsdpPlan
from planner.tracing.allocator_events import allocator_events
from planner.tracing.fsdp_blocks import apply_policy, find_blocks

__all__ = ["ModelSpec", "RankResult", "apply_fsdp_plan", "build", "drain_collectives",
           "fsdp_plan_of", "run_fsdp_plans", "run_fsdp_ranks"]


@dataclass(frozen=True)
class ModelSpec:
    """A model every rank can build alike: `module:function` returning (model, inputs) whose
    inputs have the batch first (planner.zoo's factories), and its keywords."""

    factory: str = "planner.zoo:gpt"
    kwargs: tuple[tuple[str, Any], ...] = ()


def build(spec: ModelSpec) -> tuple[nn.Module, tuple[Any, ...]]:
    module, _, name = spec.factory.partition(":")
    model, inputs = getattr(importlib.import_module(module), name)(**dict(spec.kwargs))
    return model, tuple(inputs)


def apply_fsdp_plan(model: nn.Module, plan: FsdpPlan | Plan | str, mesh: Any = None
                    ) -> nn.Module:
    """Policies per block, then fully_shard per block and the root (see the module docstring).
    `plan`: an FsdpPlan, its text form, or a plan.json Plan of kind fsdp (`planner-cli solve
    --fsdp N`; its status must be feasible or optimal)."""
    plan = fsdp_plan_of(plan)
    named = find_blocks(model)
    if len(named) != len(plan.policies):
        raise ValueError(f"plan names {len(plan.policies)} blocks, the model has {len(named)} "
                         f"({named[0][0]} ...)")
    blocks = [m for _, m in named]
    for blk, policy in zip(blocks, plan.policies, strict=True):
        apply_policy(blk, policy)
    kw: dict[str, Any] = {} if mesh is None else {"mesh": mesh}
    for blk, reshard in zip(blocks, plan.reshard, strict=True):
        fully_shard(blk, reshard_after_forward=reshard, **kw)
    fully_shard(model, **kw)
    d = plan.prefetch
    sharded: list[FSDPModule] = [blk for blk in blocks if isinstance(blk, FSDPModule)]
    root = model
    assert isinstance(root, FSDPModule)
    for i, unit in enumerate(sharded):
        unit.set_modules_to_forward_prefetch(sharded[i + 1:i + 1 + d])
        # an empty backward list means FSDP2's default (prefetch one): for 0 the list names the
        # block itself, already unsharded when its pre-backward prefetches (a no-op)
        unit.set_modules_to_backward_prefetch(sharded[max(0, i - d):i][::-1] if d else [unit])
    root.set_modules_to_forward_prefetch(sharded[:d])
    root.set_modules_to_backward_prefetch(sharded[::-1][:d] if d else [root])
    return model


def fsdp_plan_of(plan: FsdpPlan | Plan | str) -> FsdpPlan:
    """The FsdpPlan in `plan` (InputError for a Plan that is not a runnable fsdp plan)."""
    if isinstance(plan, FsdpPlan):
        return plan
    if isinstance(plan, str):
        return FsdpPlan.parse(plan)
    if plan.fsdp is None:
        raise InputError(f"plan ({plan.method}): a {plan.kind} plan, not an fsdp plan: apply "
                         "it with planner.runtime.apply")
    if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
        raise InputError(f"plan ({plan.method}): status {plan.status.value}: only a feasible "
                         "or optimal plan can be applied")
    return FsdpPlan.parse(plan.fsdp.text)


SERIAL_GLOO = "gloo_serial"  # gloo with one worker thread (see _register_serial_gloo)


def _register_serial_gloo() -> None:
    """A gloo backend with one worker thread, for measuring: gloo's worker keeps a reference to
    a collective's tensors until it takes the next job, so with the default two threads the
    last reference to an all-gather output is dropped by the main thread on one rank and by the
    worker (a thread torch.profiler does not follow: the free is never seen) on another. With one
    thread and a trailing one-element all-reduce (`_Drained*`), every buffer FSDP frees is freed
    on the main thread, where FSDP drops it."""
    if SERIAL_GLOO in dist.Backend.backend_list:
        return

    def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        opts._threads = 1
        return dist.ProcessGroupGloo(store, rank, size, opts)

    dist.Backend.register_backend(SERIAL_GLOO, create, devices=["cpu"])


def _drain(group: Any) -> None:
    flag = torch.zeros(1)
    dist.all_reduce(flag, group=group)


class _DrainedAllGather(DefaultAllGather):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> Any:
        work = super().__call__(output_tensor, input_tensor, group, True)
        assert work is not None
        work.wait()
        _drain(group)  # the worker has let go of `work` now: the main thread drops it last
        del work
        return None


class _DrainedReduceScatter(DefaultReduceScatter):
    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 op: Any, async_op: bool = False) -> Any:
        work = super().__call__(output_tensor, input_tensor, group, op, True)
        work.wait()
        _drain(group)
        del work
        return None


def drain_collectives(model: nn.Module) -> None:
    """Every FSDP module of `model` runs its collectives synchronously and drained (CPU
    measurement only; see _register_serial_gloo)."""
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_custom_all_gather(_DrainedAllGather())
            mod.set_custom_reduce_scatter(_DrainedReduceScatter())


@dataclass(frozen=True)
class RankResult:
    rank: int
    peak_bytes: int  # the allocator's peak over the measured step, above its start
    end_bytes: int
    step_ms: float
    loss: float
    max_grad_diff: float  # largest |FSDP gradient - one process's gradient|
    max_grad: float  # largest |reference gradient|, for scale


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, spec: ModelSpec, plan_texts: list[str],
               out_dir: str, threads: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    _register_serial_gloo()
    dist.init_process_group(SERIAL_GLOO, rank=rank, world_size=world)
    try:
        ref_grads, inputs = _reference(spec)
        local = _local(inputs, rank, world)
        runs = [_rank_step(rank, world, spec, FsdpPlan.parse(t), ref_grads, local)
                for t in plan_texts]
        # times: rounds over the plans, the least per plan (the machine may be shared)
        times: list[list[float]] = [[] for _ in runs]
        for _ in range(5):
            for k, (model, _) in enumerate(runs):
                times[k].append(_timed_step(model, local))
        results = [{**r.__dict__, "step_ms": min(t)} for (_, r), t in zip(runs, times,
                                                                          strict=True)]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _local(inputs: tuple[Any, ...], rank: int, world: int) -> tuple[Any, ...]:
    out = []
    for x in inputs:
        n = x.shape[0] // world
        if n * world != x.shape[0]:
            raise ValueError(f"batch {x.shape[0]} does not split over {world} ranks")
        out.append(x[rank * n:(rank + 1) * n])
    return tuple(out)


def _reference(spec: ModelSpec) -> tuple[dict[str, torch.Tensor], tuple[Any, ...]]:
    """One process's gradients on the whole batch, and the batch."""
    reference, inputs = build(spec)
    reference.zero_grad(set_to_none=True)
    reference(*inputs).backward()
    return ({n: p.grad.detach().clone() for n, p in reference.named_parameters()
             if p.grad is not None}, inputs)


def _rank_step(rank: int, world: int, spec: ModelSpec, plan: FsdpPlan,
               ref_grads: dict[str, torch.Tensor], local: tuple[Any, ...]
               ) -> tuple[nn.Module, RankResult]:
    model, _ = build(spec)  # the same weights (the factory seeds)
    apply_fsdp_plan(model, plan)
    drain_collectives(model)
    model.zero_grad(set_to_none=True)
    model(*local).backward()  # warm-up: FSDP2's lazy initialisation
    model.zero_grad(set_to_none=True)
    dist.barrier()
    with allocator_events("cpu") as events:
        loss = model(*local)
        loss.backward()
    diff = scale = 0.0
    compared = 0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        compared += 1
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        ref = ref_grads[name]
        diff = max(diff, float((g - ref).abs().max()))
        scale = max(scale, float(ref.abs().max()))
    if compared != len(ref_grads):
        raise RuntimeError(f"{compared} gradients after the FSDP step, {len(ref_grads)} in the "
                           "reference")
    model.zero_grad(set_to_none=True)
    return model, RankResult(rank, events.peak_bytes, events.end_bytes, 0.0,
                             float(loss.detach()), diff, scale)


def _timed_step(model: nn.Module, local: tuple[Any, ...]) -> float:
    """One step's wall time apart from the profiler (collectives drained: a CPU time only)."""
    model.zero_grad(set_to_none=True)
    dist.barrier()
    started = time.perf_counter()
    model(*local).backward()
    ms = (time.perf_counter() - started) * 1e3
    model.zero_grad(set_to_none=True)
    return ms


def run_fsdp_plans(spec: ModelSpec, plans: list[FsdpPlan], world: int = 2,
                   threads: int = 1) -> list[list[RankResult]]:
    """Run each plan (a fresh model each) on `world` gloo CPU ranks started once; per plan, one
    RankResult per rank (rank order)."""
    with tempfile.TemporaryDirectory(prefix="planner-fsdp-") as out_dir:
        mp.spawn(_rank_main, args=(world, _free_port(), spec, [p.text() for p in plans],
                                   out_dir, threads), nprocs=world, join=True)
        per_rank = []
        for r in range(world):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                per_rank.append([RankResult(**row) for row in json.load(f)])
    return [[per_rank[r][i] for r in range(world)] for i in range(len(plans))]


def run_fsdp_ranks(spec: ModelSpec, plan: FsdpPlan, world: int = 2,
                   threads: int = 1) -> list[RankResult]:
    """Run the plan on `world` gloo CPU ranks; one RankResult per rank (rank order)."""
    return run_fsdp_plans(spec, [plan], world, threads)[0]
