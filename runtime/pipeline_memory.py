"""What a pipeline run measured, gathered from every rank: per-rank memory and gradients
(planner.runtime.pipeline measures; these collect and show)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from planner.runtime.pipeline import PipelineRun

__all__ = ["RankMemory", "gather_gradients", "gather_memory", "memory_table"]


@dataclass(frozen=True)
class RankMemory:
    """Measured memory of one rank over one step, the step's peak counted two ways.

    The live-storage tracker (planner.tracing.memory) counts what dispatched ops return; the
    allocator's records (planner.tracing.allocator_events) count every allocation. On CPU the
    tracker reads lower: a checkpointed micro-batch holds torch.utils.checkpoint's saved CPU RNG
    state (5,056 B, made by Generator.get_state, no op) until its backward, and autograd saves
    Python scalars as 0-dim tensors no dispatch mode sees (8 B per `x / float`); ops' internal
    workspaces are missed too. `peak_bytes` uses the larger count, so a test comparing it with a
    prediction cannot pass while the allocator was over."""

    rank: int
    parameters_bytes: int  # the rank's stage parameters
    gradients_bytes: int  # their .grad buffers (kept across steps, as zero_grad() keeps them)
    pipeline_buffers_bytes: int  # torch.distributed.pipelining's receive buffers (persistent)
    step_peak_bytes: int  # the most the step itself had allocated at once (live-storage tracker)
    duration_ms: float
    loss: float
    host_peak_bytes: int = 0  # the most host memory offloaded saved tensors held at once
    # the same from the allocator's own records (planner.tracing.allocator_events): also sees
    # what no dispatched op returns (an op's temporaries, autograd's and gloo's buffers)
    allocator_step_peak_bytes: int = 0

    @property
    def measured_step_peak_bytes(self) -> int:
        """The step's peak as the larger of both counts: a test trusting it is never fooled
        by an allocation one of them does not see."""
        return max(self.step_peak_bytes, self.allocator_step_peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return (self.parameters_bytes + self.gradients_bytes + self.pipeline_buffers_bytes
                + self.measured_step_peak_bytes)

    @property
    def tracker_peak_bytes(self) -> int:
        """The rank's peak by the live-storage tracker alone."""
        return (self.parameters_bytes + self.gradients_bytes + self.pipeline_buffers_bytes
                + self.step_peak_bytes)


def gather_gradients(run: PipelineRun) -> dict[str, torch.Tensor]:
    """Every rank's gradients, by parameter name, on every rank (all_gather_object)."""
    mine = {k: p.grad.detach().clone() for k, p in run.parameters().items() if p.grad is not None}
    gathered: list[Any] = [None] * dist.get_world_size(run.group)
    dist.all_gather_object(gathered, mine, group=run.group)
    out: dict[str, torch.Tensor] = {}
    for part in gathered:
        for k, g in part.items():
            if k in out:
                raise RuntimeError(f"parameter {k} has gradients on two ranks")
            out[k] = g
    return out


def gather_memory(run: PipelineRun, memory: RankMemory) -> list[RankMemory]:
    gathered: list[Any] = [None] * dist.get_world_size(run.group)
    dist.all_gather_object(gathered, memory, group=run.group)
    return sorted(gathered, key=lambda m: m.rank)


def memory_table(memory: Sequence[RankMemory], predicted: Sequence[int] | None) -> str:
    """Markdown table of measured per-rank peaks against predicted ones (e.g. the plan's
    `predicted.per_rank_peak_bytes`)."""
    lines = ["| rank | model state | torch buffers | step peak (tracker) | step peak (allocator) "
             "| measured peak | predicted peak | measured / predicted |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in memory:
        p = predicted[m.rank] if predicted is not None and m.rank < len(predicted) else None
        ratio = f"{m.peak_bytes / p:.3f}" if p else "-"
        lines.append(
            f"| {m.rank} | {m.parameters_bytes + m.gradients_bytes:,} | "
            f"{m.pipeline_buffers_bytes:,} | {m.step_peak_bytes:,} | "
            f"{m.allocator_step_peak_bytes:,} | {m.peak_bytes:,} | "
            f"{f'{p:,}' if p is not None else '-'} | {ratio} |"
        )
    return "\n".join(lines)
