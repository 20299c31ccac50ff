"""The memory rules of a pipeline rank, from list order alone (planner.sim.stage_costs says
what each stage holds and why; planner.sim.pipeline_ranks replays the same rules in time):
model state and receive buffers from the start, what each micro-batch keeps from its F,
transients while a stage computes, releases when its backward ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from planner.core.pipeline_actions import PipelineAction, PipelineOp


class StageSizes(Protocol):
    """What a stage holds (StageCosts, and the partitioners' RangeCosts)."""

    @property
    def saved_bytes(self) -> int: ...
    @property
    def input_bytes(self) -> int: ...
    @property
    def transient_bytes(self) -> int: ...
    @property
    def model_state_bytes(self) -> int: ...
    @property
    def send_backward_bytes(self) -> int: ...
    @property
    def held_bytes(self) -> int: ...
    @property
    def buffer_bytes(self) -> int: ...


# -- the memory rules of a pipeline rank (planner.sim.pipeline_ranks replays them in time) ------
def kept_bytes(sizes: StageSizes, recomputed: bool) -> int:
    """What a micro-batch keeps from its F: the saved bytes, or only the held ones (sent
    outputs, loss) when the stage recomputes it; plus the input gradient its backward will
    send, which torch keeps to the step's end: charged from the F (an upper bound until the
    backward ends) so that a rank's memory changes only at F and at a B/W's end, whatever
    the order of its I and W."""
    return (sizes.held_bytes if recomputed else sizes.saved_bytes) + sizes.send_backward_bytes


def released_bytes(sizes: StageSizes) -> int:
    """What a micro-batch frees when its B (or W) ends: the saved bytes torch does not hold."""
    return sizes.saved_bytes - sizes.held_bytes


def rank_base_bytes(sizes: Sequence[StageSizes], stage_rank_of: Sequence[int], rank: int) -> int:
    """A rank's model state: the sum over its stages."""
    return sum(c.model_state_bytes for s, c in enumerate(sizes) if stage_rank_of[s] == rank)


def rank_start_bytes(
    sizes: Sequence[StageSizes], stage_rank_of: Sequence[int], rank: int, microbatches: int
) -> int:
    """A rank's bytes for the whole step: model state and torch's receive buffers (one per
    micro-batch and stage, allocated at the first step and kept)."""
    buffers = sum(c.buffer_bytes for s, c in enumerate(sizes) if stage_rank_of[s] == rank)
    return rank_base_bytes(sizes, stage_rank_of, rank) + microbatches * buffers


def microbatch_count(lists: Sequence[Sequence[PipelineAction]]) -> int:
    """Micro-batches the action lists run (1 + the largest index)."""
    return 1 + max((a.microbatch_index for row in lists for a in row), default=0)


def one_stage_peak_bytes(
    sizes: StageSizes, inflight: int, stored: int | None = None, microbatches: int | None = None
) -> int:
    """Peak of a rank running this stage alone over `microbatches` (None: `inflight`, a lower
    bound) with `inflight` micro-batches holding activations, `stored` of them in full (None:
    all; the others recomputed), when the schedule holds the most: the micro-batches before
    them finished, each still holding its held bytes and input gradient. Exact without
    recomputation, else an upper bound counting the rematerialised bytes once on top."""
    k = inflight
    m = max(k, microbatches if microbatches is not None else k)
    q = k if stored is None else min(stored, k)
    extra = released_bytes(sizes) if q < k else 0
    finished = (m - k) * (sizes.held_bytes + sizes.send_backward_bytes)
    return (sizes.model_state_bytes + m * sizes.buffer_bytes + finished
            + q * kept_bytes(sizes, False) + (k - q) * kept_bytes(sizes, True) + extra
            + sizes.transient_bytes)


def rank_peak_bytes(
    lists: Sequence[Sequence[PipelineAction]],
    stage_rank_of: Sequence[int],
    sizes: Sequence[StageSizes],
    recompute: Sequence[frozenset[int]],
    microbatches: int | None = None,
) -> list[int]:
    """Each rank's peak as planner.sim.pipeline_ranks counts it, from list order alone (a rank's
    memory changes only at its own actions): model state and receive buffers for
    `microbatches` (None: as many as the lists run), `kept_bytes` per micro-batch from F, the
    rest of saved from a recomputing B/I, a stage's transient while its compute runs, the
    released bytes when B (or W) ends."""
    m = microbatch_count(lists) if microbatches is None else microbatches
    peaks = []
    for rank, row in enumerate(lists):
        live = peak = rank_start_bytes(sizes, stage_rank_of, rank, m)
        for a in row:
            c = sizes[a.stage_index]
            again = a.microbatch_index in recompute[a.stage_index]
            if a.op is PipelineOp.forward:
                live += kept_bytes(c, again)
            elif a.op in _GRADIENT_OPS and again:
                live += released_bytes(c)
            if a.is_compute:
                peak = max(peak, live + c.transient_bytes)
            if a.op in _RELEASING_OPS:
                live -= released_bytes(c)
        peaks.append(peak)
    return peaks


_GRADIENT_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_input})
_RELEASING_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_weight})
