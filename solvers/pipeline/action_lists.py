"""Reading and completing per-rank action lists, whatever schedule made them.

`with_communication` adds SEND/RECV (a RECV right before the compute that needs it, a SEND right
after the compute that makes it); `inflight_counts` reads from the lists how many micro-batches
each stage holds at most, which with a stage's sizes gives its rank's exact peak
(planner.sim.stage_costs.rank_peak_bytes: a rank's memory changes only at its own actions, in
list order).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.core.pipeline_actions import PipelineAction, PipelineOp, pipeline_action

F, B, I_, W = PipelineOp.forward, PipelineOp.backward, PipelineOp.backward_input, \
    PipelineOp.backward_weight
RankLists = list[list[PipelineAction]]


def stage_rank(stage_index: int, ranks: int) -> int:
    """Stage s runs on rank s mod P (one stage a rank, or interleaved chunks in a loop)."""
    return stage_index % ranks


def with_communication(lists: Sequence[Sequence[PipelineAction]], ranks: int) -> RankLists:
    """Add SEND_F/RECV_F/SEND_B/RECV_B between stages on different ranks (stage s on rank
    s mod P; the last stage is the largest stage index in the lists)."""
    last = max(a.stage_index for row in lists for a in row)
    out: RankLists = []
    for rank, row in enumerate(lists):
        new: list[PipelineAction] = []
        for a in row:
            s, mb = a.stage_index, a.microbatch_index
            if a.op is F and s > 0 and stage_rank(s - 1, ranks) != rank:
                new.append(pipeline_action(s, "RECV_F", mb))
            if a.op in (B, I_) and s < last and stage_rank(s + 1, ranks) != rank:
                new.append(pipeline_action(s, "RECV_B", mb))
            new.append(a)
            if a.op is F and s < last and stage_rank(s + 1, ranks) != rank:
                new.append(pipeline_action(s, "SEND_F", mb))
            if a.op in (B, I_) and s > 0 and stage_rank(s - 1, ranks) != rank:
                new.append(pipeline_action(s, "SEND_B", mb))
        out.append(new)
    return out


def inflight_counts(lists: Sequence[Sequence[PipelineAction]], stage_count: int) -> list[int]:
    """Per stage, the most micro-batches holding activations at once (F to B, or F to W)."""
    most = [0] * stage_count
    for row in lists:
        live = [0] * stage_count
        for a in row:
            s = a.stage_index
            if a.op is F:
                live[s] += 1
                most[s] = max(most[s], live[s])
            elif a.op in (B, W):
                live[s] -= 1
    return most
