"""planner.runtime.pipeline: run a pipeline plan on a user's unmodified nn.Module.

    run = build_pipeline(model, plan, example_inputs)   # on every rank, after init_process_group
    loss = run.step(*inputs)                            # forward + backward of one step

`build_pipeline` splits the model into the plan's stages by module names
(`plan.partition.stages[].modules`; the rule and which models qualify:
planner.runtime.pipeline_split),
wraps this rank's stages in `torch.distributed.pipelining.PipelineStage`, and builds the
schedule from the plan's per-rank action lists: they are written as torch's CSV
(planner.core.pipeline_actions.rank_actions_to_csv) and loaded by
`_PipelineScheduleRuntime._load_csv`,
"compute_only" when the lists hold no SEND/RECV (torch adds the communication) and
"compute_comms" when they do (run as planned; the per-stage gradient scaling torch inserts after
a stage's last backward is added). `schedule="builtin"` runs torch's own class for the plan's
`resources.pipeline_schedule` instead (gpipe, 1f1b, interleaved-1f1b).

Recomputation: the plan's `PipelineStage.recompute_microbatches` (or every micro-batch of the
stages in `recompute_stages=`) run the stage's forward under non-reentrant
`torch.utils.checkpoint`: such a micro-batch keeps only the stage's inputs until its backward,
which reruns the forward first (RNG state replayed). Per unit, the stage's own plan
(`PipelineStage.unit_policies`: a module it names -> "keep", "recompute" or "offload") runs that
module checkpointed, or with its saved tensors in host memory, in every micro-batch but those of
a variant (`PipelineStage.variants`), which run the variant's unit plan instead
(planner.runtime.pipeline_units); `measure_step` reports the host bytes apart. Under
zero-bubble schedules a stage's W (weights' gradients) runs as one autograd call over torch's
weight groups, so a checkpoint reruns once in it, not once per group (a GPT block: six).

Losses: a model that returns a scalar loss needs no loss function (each micro-batch's loss is
the model's); otherwise pass `loss_fn(output, target)` and `target=` to `step`. Losses are
taken as means over the batch, so gradients are averaged over micro-batches (torch's
`scale_grads`); `loss_reduction="sum"` for summed losses. `step` returns the step's loss (the
mean, or the sum, of the micro-batch losses) on every rank. Gradients accumulate in the model's
`.grad` like `loss.backward()`; call `zero_grad()` between steps. Every rank passes the whole
batch to `step`: inputs of stage 0 are used on its rank, inputs that later stages read (such as
targets) on theirs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    _PipelineSchedule,
    _PipelineScheduleRuntime,
    get_schedule_class,
)

try:  # torch with REDUCE_GRAD actions (2.13); a runtime without them scales gradients itself
    from torch.distributed.pipelining.schedules import _add_reduce_grad
except ImportError:  # pragma: no cover - an older torch (the GPU machine has 2.11)
    _add_reduce_grad = None  # type: ignore[assignment]

from planner.core.errors import InputError
from planner.core.pipeline_actions import rank_actions_to_csv
from planner.core.plan import Plan, PlanKind, PlanStatus
from planner.runtime.pipeline_checks import (
    check_split_backward,
    check_variant_microbatches,
    has_weight_actions,
)
from planner.runtime.pipeline_memory import RankMemory
from planner.runtime.pipeline_memory import gather_gradients as gather_gradients
from planner.runtime.pipeline_memory import gather_memory as gather_memory
from planner.runtime.pipeline_memory import memory_table as memory_table
from planner.runtime.pipeline_split import SplitModel, check_plan_model, split_model
from planner.runtime.pipeline_stage import PlannedStage, StageModule
from planner.runtime.pipeline_units import (
    HostMemory,
    UnitSwitch,
    apply_unit_policies,
    check_unit_policies,
)
from planner.solvers.pipeline.schedules import SCHEDULE_CLASSES
from planner.tracing.allocator_events import allocator_events
from planner.tracing.cuda_allocator import use_exact_allocator
from planner.tracing.memory import StorageTracker


def _model_loss(output: Any, target: Any) -> Any:
    """The model computed its own loss; torch's schedule hands it here with a placeholder."""
    return output


class PipelineRun:
    """This rank's stages and the schedule that runs the plan (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        plan: Plan,
        example_inputs: tuple[Any, ...],
        *,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        group: dist.ProcessGroup | None = None,
        device: str | torch.device = "cpu",
        recompute_stages: Sequence[int] | None = None,
        schedule: Literal["plan", "builtin"] = "plan",
        loss_reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        if plan.kind is not PlanKind.pipeline or plan.partition is None or not plan.rank_actions:
            raise InputError(f"plan ({plan.method}): not a pipeline plan (kind {plan.kind})")
        if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
            raise InputError(f"plan ({plan.method}): status {plan.status.value}: cannot be run")
        check_plan_model(plan, model)  # a plan for another model: said before any fx tracing
        check_variant_microbatches(plan)
        if not dist.is_initialized():
            raise InputError(
                "planner.runtime.pipeline: call torch.distributed.init_process_group first"
            )
        self.plan = plan
        self.partition = plan.partition
        self.group = group
        self.rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        if world != self.partition.rank_count:
            raise InputError(
                f"plan: the partition runs on {self.partition.rank_count} ranks, the process "
                f"group has {world}"
            )
        self.microbatches = 1 + max(a.microbatch_index for row in plan.rank_actions for a in row)
        check_split_backward(plan)
        # stage -> its units' policies other than "keep", its variants' too (checked on every
        # rank before tracing)
        self.unit_policies = {s.stage_index: check_unit_policies(s) for s in self.partition.stages}
        self.split: SplitModel = split_model(model, self.partition, example_inputs)
        if loss_fn is None and not self.split.returns_loss:
            raise InputError(
                f"model {type(model).__name__}: returns no scalar loss; pass loss_fn(output, "
                "target) and step(..., target=...)"
            )
        self.loss_fn = loss_fn or _model_loss
        self.loss_reduction = loss_reduction
        self.device = torch.device(device)
        if self.device.type == "cuda":
            use_exact_allocator()  # allocated bytes = the plan's 512 B-rounded sizes
            if has_weight_actions(plan):
                warnings.warn(
                    "planner.runtime.pipeline: W actions (split backward) on CUDA are checked on "
                    "torch 2.11 only, where the weight gradients came out wrong "
                    "(docs/whole_job.md); compare a step's gradients with one process first",
                    RuntimeWarning, stacklevel=2)
        every = frozenset(range(self.microbatches))
        forced = set(recompute_stages or ())
        self.recompute: dict[int, frozenset[int]] = {
            s.stage_index: every if s.stage_index in forced
            else frozenset(s.recompute_microbatches)
            for s in self.partition.stages
        }
        self.stage_indices = sorted(
            s.stage_index for s in self.partition.stages if s.rank == self.rank
        )
        self.host = HostMemory()  # host bytes of offloaded saved tensors (unit_policies)
        self.modules = {s: self._stage_module(s) for s in self.stage_indices}
        self.stages = [
            PlannedStage(self.modules[s], s, self.partition.stage_count, self.device, group=group)
            for s in self.stage_indices
        ]
        self.schedule = self._schedule(schedule)
        self.steps = 0

    def _stage_module(self, s: int) -> StageModule:
        """Stage s's module, its units' policies applied (planner.runtime.pipeline_units)."""
        program = self.split.stages[s]
        switch = UnitSwitch()
        apply_unit_policies(program.module, self.unit_policies[s], switch, self.host)
        return StageModule(program, self.recompute[s], switch).to(self.device)

    # -- the schedule ------------------------------------------------------------------------
    def _schedule(self, kind: str) -> _PipelineSchedule:
        m = self.microbatches
        scale = self.loss_reduction == "mean"
        if kind == "builtin":
            return self._builtin(m, scale)
        if kind != "plan":
            raise InputError(f"schedule {kind!r}: use 'plan' or 'builtin'")
        sched = _PipelineScheduleRuntime(self.stages, m, loss_fn=self.loss_fn, scale_grads=scale)
        rows = self.plan.rank_actions or []
        comms = any(not a.is_compute for row in rows for a in row)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "schedule.csv"
            path.write_text(rank_actions_to_csv(rows))
            sched._load_csv(str(path), format="compute_comms" if comms else "compute_only")
        if comms and _add_reduce_grad is not None:
            # torch adds the gradient scaling only when it lowers compute_only lists
            order = sched.pipeline_order_with_comms
            for r in order:
                order[r] = [a for a in _add_reduce_grad(list(order[r]), m) if a is not None]
        mapping = sched.stage_index_to_group_rank
        for s in self.partition.stages:
            if mapping.get(s.stage_index, s.rank) != s.rank:
                raise InputError(
                    f"plan: stage {s.stage_index} is on rank {s.rank} in the partition but its "
                    f"actions are in rank {mapping[s.stage_index]}'s list"
                )
        return sched

    def _builtin(self, m: int, scale: bool) -> _PipelineSchedule:
        planned = self.plan.resources.pipeline_schedule if self.plan.resources else None
        ranks = self.partition.rank_count
        torch_rank = {s.stage_index: s.stage_index % ranks for s in self.partition.stages}
        if any(torch_rank[s.stage_index] != s.rank for s in self.partition.stages):
            raise InputError(
                "schedule builtin: torch's classes place stage s on rank s mod ranks; this "
                "partition does not (use schedule='plan')"
            )
        name = str(getattr(planned, "value", planned))
        ours = SCHEDULE_CLASSES.get(name)
        torch_cls = get_schedule_class(ours.torch_class) if ours and ours.torch_class else None
        if torch_cls is not None and issubclass(torch_cls, PipelineScheduleSingle) \
                and len(self.stages) == 1:
            return torch_cls(self.stages[0], m, loss_fn=self.loss_fn, scale_grads=scale)
        if torch_cls is not None and issubclass(torch_cls, PipelineScheduleMulti):
            stages: list[Any] = list(self.stages)
            return torch_cls(stages, m, loss_fn=self.loss_fn, scale_grads=scale)
        raise InputError(
            f"schedule builtin: no torch class for {name!r} with {len(self.stages)} stage(s) per "
            f"rank ({_builtin_choices()}); use schedule='plan'"
        )

    # -- steps -------------------------------------------------------------------------------
    def _arguments(self, inputs: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        names = self.split.input_names
        if len(inputs) != len(names):
            raise InputError(f"step: {len(inputs)} inputs given, the model takes {len(names)}")
        by_name = dict(zip(names, inputs, strict=True))
        batch = _batch_size(inputs)
        if batch is not None and batch % self.microbatches:
            raise InputError(
                f"step: batch of {batch} does not split into {self.microbatches} micro-batches"
            )
        args = tuple(by_name[n] for n in self.split.positional_inputs) if 0 in self.stage_indices \
            else ()
        mine = {k for s in self.stage_indices for k in self.split.stages[s].keyword_inputs}
        kwargs = {k: by_name[k] for k in self.split.keyword_inputs if k in mine}
        return args, kwargs

    def step(self, *inputs: Any, target: Any = None) -> float:
        """One training step (forward + backward of every micro-batch); the loss on all ranks."""
        args, kwargs = self._arguments(inputs)
        losses: list[torch.Tensor] = []
        last = self.partition.stage_count - 1
        holds_last = last in self.stage_indices
        if target is None and self.loss_fn is _model_loss and holds_last:
            # torch splits a target per micro-batch; this one holds no bytes (the plans do not
            # count it: a float per sample on every rank was 61 B over an all-keep rank 0)
            batch = _batch_size(inputs) or self.microbatches
            target = torch.zeros(batch, 0, device=self.device)
        self.schedule.step(*args, target=target if holds_last else None,
                           losses=losses if holds_last else None, return_outputs=False, **kwargs)
        self.steps += 1
        value = torch.zeros(1, dtype=torch.float64, device=self.device)  # nccl: on device
        if holds_last:
            total = torch.stack([x.detach().double() for x in losses]).sum()
            value[0] = total / len(losses) if self.loss_reduction == "mean" else total
        dist.broadcast(value, src=self._global_rank(self.partition.rank_of(last)),
                       group=self.group)
        return float(value[0].item())

    def _global_rank(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def parameters(self) -> dict[str, nn.Parameter]:
        """This rank's parameters, by their name in the user's model."""
        out: dict[str, nn.Parameter] = {}
        for s in self.stage_indices:
            out.update(dict(self.split.stages[s].module.named_parameters()))
        return out

    def zero_grad(self) -> None:
        """Zero the rank's gradients in place (allocating them once): .grad is kept across
        steps, as the plan's model state counts it."""
        for p in self.parameters().values():
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                else:
                    p.grad.zero_()

    def measure_step(self, *inputs: Any, target: Any = None) -> RankMemory:
        """One step with this rank's memory measured (a first, unmeasured step runs before it
        if none has: torch builds its buffers there). Gradients are zeroed first. The step's
        peak is counted twice, by the live-storage tracker and by the allocator's records
        (planner.runtime.pipeline_memory says why they differ); `peak_bytes` takes the larger."""
        if self.steps == 0:
            self.step(*inputs, target=target)
        self.zero_grad()
        dist.barrier(group=self.group)
        self.host.reset_peak()
        tracker = StorageTracker(keep_timeline=False)
        started = time.perf_counter()
        with allocator_events(self.device) as allocator, tracker:
            loss = self.step(*inputs, target=target)
        duration_ms = (time.perf_counter() - started) * 1e3
        params = self.parameters().values()
        return RankMemory(
            rank=self.rank,
            parameters_bytes=_storage_bytes(params),
            gradients_bytes=_storage_bytes(p.grad for p in params if p.grad is not None),
            pipeline_buffers_bytes=_storage_bytes(self._recv_buffers()),
            step_peak_bytes=tracker.peak_bytes,
            allocator_step_peak_bytes=allocator.peak_bytes,
            duration_ms=duration_ms,
            loss=loss,
            host_peak_bytes=self.host.peak_bytes,
        )

    def time_steps(self, *inputs: Any, target: Any = None, repeats: int = 3) -> float:
        """Median milliseconds of a step (ranks synchronised before each)."""
        times = []
        for _ in range(repeats):
            self.zero_grad()
            dist.barrier(group=self.group)
            started = time.perf_counter()
            self.step(*inputs, target=target)
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)

    def _recv_buffers(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for stage in self.stages:
            for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
                for info in infos:
                    buffer = getattr(info, "buffer", None)
                    if isinstance(buffer, torch.Tensor):
                        out.append(buffer)
        return out


def build_pipeline(
    model: nn.Module,
    plan: Any,
    example_inputs: tuple[Any, ...] | Any,
    **options: Any,
) -> PipelineRun:
    """This rank's part of `plan` (a Plan, plan.json dict or path) on `model`; `options` are
    PipelineRun's (loss_fn, group, device, recompute_stages, schedule, loss_reduction)."""
    from planner.runtime.apply import load

    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    return PipelineRun(model, load(plan), inputs, **options)


def _storage_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _batch_size(inputs: tuple[Any, ...]) -> int | None:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return None


def _builtin_choices() -> str:
    """'gpipe, 1f1b: one; interleaved-1f1b: several': the schedules torch has a class for."""
    single: list[str] = []
    multi: list[str] = []
    for name, cls in SCHEDULE_CLASSES.items():
        if cls.torch_class is not None:
            torch_cls = get_schedule_class(cls.torch_class)
            (multi if issubclass(torch_cls, PipelineScheduleMulti) else single).append(name)
    return f"{', '.join(single)}: one; {', '.join(multi)}: several"
