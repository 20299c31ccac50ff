"""The memory rules of a pipeline rank, from list order alone (planner.sim.stage_costs says
what each stage holds and why; planner.sim.pipeline_ranks replays the same rules in time):
model state and receive buffers from the start, what each micro-batch keeps from its F,
transients while a stage computes, releases when its backward ends.

Zero-bubble I/W (torch 2.13's _backward.py, stage_backward_input / stage_backward_weight;
measured per action on 2 gloo ranks): on every stage but the first, I stores the gradient at
each weight path's root until its W ends (`weight_pending_bytes`: the backward storages the
stage's weight-gradient nodes read from its other backward nodes; a received one is in its
receive buffer). W runs one autograd call per weight group (a module's parameters), each a
graph task of its own: a checkpoint rerun there keeps what that task does not unpack (the
recomputed roots an input-gradient node reads) until W ends, once per group
(`weight_rerun_residue_bytes`; `weight_rerun_bytes` for a micro-batch whose whole stage is
recomputed, planner.sim.stage_policies per recomputed unit). On the first stage I does nothing
and W runs the whole backward, one rerun per checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    @property
    def weight_pending_bytes(self) -> int: ...
    @property
    def weight_transient_bytes(self) -> int: ...
    @property
    def weight_rerun_bytes(self) -> int: ...
    @property
    def input_transient_bytes(self) -> int: ...
    @property
    def recompute_transient_bytes(self) -> int: ...
    @property
    def checkpoint_bytes(self) -> int: ...


# -- the memory rules of a pipeline rank (planner.sim.pipeline_ranks replays them in time) ------
def kept_bytes(sizes: StageSizes, recomputed: bool) -> int:
    """What a micro-batch keeps from its F: the saved bytes, or only the held ones (sent
    outputs, loss) when the stage recomputes it. The input gradient its B (or I) sends,
    which torch keeps to the step's end, is charged from that B's (I's) start. A recomputed
    one is a checkpoint call: it keeps `checkpoint_bytes` too, until its B (or W) ends."""
    return sizes.held_bytes + sizes.checkpoint_bytes if recomputed else sizes.saved_bytes


def released_bytes(sizes: StageSizes, recomputed: bool = False) -> int:
    """What a micro-batch frees when its B (or W) ends: the saved bytes torch does not hold,
    and a recomputed one's checkpoint state (`kept_bytes`)."""
    return sizes.saved_bytes - sizes.held_bytes + (sizes.checkpoint_bytes if recomputed else 0)


def compute_transient_bytes(sizes: StageSizes, op: PipelineOp, recomputed: bool) -> int:
    """What a compute holds on top of the rank's live bytes while it runs: a W its own
    (`weight_rerun_bytes` on a micro-batch the stage recomputes), an I its own (it keeps what
    W reads), a recomputed B or I the largest node's without what the backward frees (its
    saved bytes are made again: planner.sim.backward_release), any other the stage's."""
    if op is PipelineOp.backward_weight:
        return sizes.weight_rerun_bytes if recomputed else sizes.weight_transient_bytes
    if recomputed and op in _GRADIENT_OPS:
        return sizes.recompute_transient_bytes
    if op is PipelineOp.backward_input:
        return sizes.input_transient_bytes
    return sizes.transient_bytes


def weight_rerun_residue_bytes(groups: int, input_read_bytes: int, weight_read_bytes: int) -> int:
    """What a checkpoint's rerun leaves alive in a split W (`groups`: the weight groups it
    serves; planner.runtime.pipeline runs them as one autograd call, a graph task that reruns
    the checkpoint once and unpacks only its weight nodes' saved tensors): the recomputed roots
    an input-gradient node reads (freed with the graph when W ends), and the roots only weight
    nodes read (freed when their node has run)."""
    return input_read_bytes + weight_read_bytes if groups else 0


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
    sizes: StageSizes, inflight: int, stored: int | None = None, microbatches: int | None = None,
    split_backward: bool = False,
) -> int:
    """Peak of a rank running this stage alone over `microbatches` (None: `inflight`, a lower
    bound) with `inflight` micro-batches holding activations, `stored` of them in full (None:
    all; the others recomputed), when the schedule holds the most: the micro-batches before
    them finished, each still holding its held bytes and input gradient, a B (or I) running
    (its input gradient taken); or at the last B, when every other micro-batch is finished
    (more, where a stage sends more than it frees). Exact without recomputation, else an
    upper bound counting the rematerialised bytes once on top. Under zero-bubble I/W
    (`split_backward`) one I's gradients kept for its W are added, and the larger of the
    I's and W's transients: exact where each W follows its I (a rank holding several I's
    gradients at once peaks higher: planner.sim.rank_memory.rank_peak_bytes is exact)."""
    k = inflight
    m = max(k, microbatches if microbatches is not None else k)
    q = k if stored is None else min(stored, k)
    extra = released_bytes(sizes) if q < k else 0
    done = sizes.held_bytes + sizes.send_backward_bytes  # a finished micro-batch
    transient = sizes.recompute_transient_bytes if q < k else sizes.transient_bytes
    if split_backward:  # an I's gradients kept for its W, and the larger of the I's or W's
        weight = sizes.weight_rerun_bytes if q < k else sizes.weight_transient_bytes
        own = sizes.recompute_transient_bytes if q < k else sizes.input_transient_bytes
        transient = sizes.weight_pending_bytes + max(own, weight)
    filled = (m - k) * done + q * kept_bytes(sizes, False) + (k - q) * kept_bytes(sizes, True)
    last = (m - 1) * done + sizes.saved_bytes  # recomputed: its held bytes and the rerun's
    return (sizes.model_state_bytes + m * sizes.buffer_bytes + max(filled + extra, last)
            + sizes.send_backward_bytes + transient)


def mixed_stage_peak_bytes(
    own: StageSizes, variant: StageSizes, inflight: int, variant_slots: int,
    microbatches: int | None = None, split_backward: bool = False,
) -> int:
    """`one_stage_peak_bytes` (every micro-batch stored) of a stage that runs `variant`'s unit
    plan in `variant_slots` of every `inflight` consecutive micro-batches and its own in the
    others (planner.core.pipeline_actions.StageVariant): any window of in-flight micro-batches
    holds at most that many of each, so the window's kept bytes are at most the mix's; the
    larger transient and the larger last micro-batch of the two count. An upper bound where
    the one-plan figure is exact."""
    k = inflight
    q = min(max(variant_slots, 0), k)
    if q in (0, k):  # one plan only
        return one_stage_peak_bytes(own if q == 0 else variant, k, None, microbatches,
                                    split_backward)
    m = max(k, microbatches if microbatches is not None else k)

    def transient(sizes: StageSizes) -> int:
        if not split_backward:
            return sizes.transient_bytes
        return sizes.weight_pending_bytes + max(sizes.input_transient_bytes,
                                                sizes.weight_transient_bytes)

    done = max(own.held_bytes + own.send_backward_bytes,
               variant.held_bytes + variant.send_backward_bytes)
    filled = (m - k) * done + (k - q) * own.saved_bytes + q * variant.saved_bytes
    last = (m - 1) * done + max(own.saved_bytes, variant.saved_bytes)
    return (own.model_state_bytes + m * own.buffer_bytes + max(filled, last)
            + max(own.send_backward_bytes, variant.send_backward_bytes)
            + max(transient(own), transient(variant)))


def rank_peak_bytes(
    lists: Sequence[Sequence[PipelineAction]],
    stage_rank_of: Sequence[int],
    sizes: Sequence[StageSizes],
    recompute: Sequence[frozenset[int]],
    microbatches: int | None = None,
    variant_sizes: Sequence[Mapping[int, StageSizes]] | None = None,
) -> list[int]:
    """Each rank's peak as planner.sim.pipeline_ranks counts it, from list order alone (a rank's
    memory changes only at its own actions): model state and receive buffers for
    `microbatches` (None: as many as the lists run), `kept_bytes` per micro-batch from F, the
    input gradient from a B/I's start and the rest of saved too when it recomputes,
    `weight_pending_bytes` from an I to its W's end, a compute's transient while it runs
    (`compute_transient_bytes`), the released bytes when B (or W) ends. `variant_sizes`: per
    stage, the sizes of the micro-batches that run a variant's unit plan."""
    m = microbatch_count(lists) if microbatches is None else microbatches
    peaks = []
    for rank, row in enumerate(lists):
        live = peak = rank_start_bytes(sizes, stage_rank_of, rank, m)
        for a in row:
            c = sizes[a.stage_index]
            if variant_sizes is not None:
                c = variant_sizes[a.stage_index].get(a.microbatch_index, c)
            again = a.microbatch_index in recompute[a.stage_index]
            if a.op is PipelineOp.forward:
                live += kept_bytes(c, again)
            elif a.op in _GRADIENT_OPS:
                live += c.send_backward_bytes + (released_bytes(c) if again else 0)
            if a.op is PipelineOp.backward_input:
                live += c.weight_pending_bytes
            if a.is_compute:
                peak = max(peak, live + compute_transient_bytes(c, a.op, again))
            if a.op in _RELEASING_OPS:
                live -= released_bytes(c, again)
            if a.op is PipelineOp.backward_weight:
                live -= c.weight_pending_bytes
        peaks.append(peak)
    return peaks


_GRADIENT_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_input})
_RELEASING_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_weight})
