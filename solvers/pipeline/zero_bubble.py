"""Zero-bubble action lists (Qi et al. 2024) by list scheduling on the stages' own times.

The backward is split into I (input gradient, on the critical path) and W (weight gradient,
deferred to fill bubbles). A free rank runs a ready I first, else a forward while fewer than
its `limit` micro-batches hold activations, else a pending W; actions are committed in order of
start time across ranks. Activations are held from F to W. One stage a rank (stage r on rank r).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.pipeline_actions import PipelineAction, PipelineOp, pipeline_action

F, I_, W = PipelineOp.forward, PipelineOp.backward_input, PipelineOp.backward_weight
RankLists = list[list[PipelineAction]]


@dataclass(frozen=True)
class StageTimes:
    """What list scheduling (zero-bubble) needs of a stage: its F, I and W times and the
    transfer time of its boundary to the next stage (forward) and the previous (backward)."""

    forward_ms: float = 1.0
    backward_input_ms: float = 1.0
    backward_weight_ms: float = 1.0
    send_forward_ms: float = 0.0
    send_backward_ms: float = 0.0


def zero_bubble_lists(
    limits: Sequence[int],
    microbatches: int,
    times: Sequence[StageTimes] | None = None,
    recompute: Sequence[frozenset[int]] | None = None,
) -> RankLists:
    """F/I/W actions per rank (one stage a rank, `limits[r]` micro-batches in flight at most on
    rank r). `times` per stage (default unit times); `recompute` per stage, the micro-batches
    recomputed: their rematerialised activations live from I to W, so their W runs right after
    their I (and pending Ws before it): one at a time a rank."""
    p = len(limits)
    t = list(times) if times is not None else [StageTimes()] * p
    if len(t) != p:
        raise ValueError(f"times: {len(t)} stages for {p} ranks")
    again = list(recompute) if recompute is not None else [frozenset()] * p
    return _list_schedule(p, microbatches, list(limits), t, again)


def _list_schedule(
    p: int, m: int, limits: list[int], t: list[StageTimes], again: list[frozenset[int]]
) -> RankLists:
    """List scheduling, committing actions in order of start time across ranks."""
    free = [0.0] * p
    next_f = [0] * p
    next_i = [0] * p
    next_w = [0] * p
    f_end: dict[tuple[int, int], float] = {}
    i_end: dict[tuple[int, int], float] = {}
    out: RankLists = [[] for _ in range(p)]
    remaining = 3 * m * p
    while remaining:
        best: tuple[float, int, int, PipelineOp] | None = None  # (start, policy, rank, op)
        for r in range(p):
            options: list[tuple[float, int, PipelineOp]] = []  # (ready, policy rank, op)
            k = next_i[r]
            if k < m and (r, k) in f_end:
                grad = 0.0 if r == p - 1 else (
                    i_end[(r + 1, k)] + t[r + 1].send_backward_ms if (r + 1, k) in i_end else None)
                if grad is not None:
                    options.append((max(f_end[(r, k)], grad), 0, I_))
            k = next_f[r]
            if k < m and k - next_w[r] < limits[r]:
                src = 0.0 if r == 0 else (
                    f_end[(r - 1, k)] + t[r - 1].send_forward_ms if (r - 1, k) in f_end else None)
                if src is not None:
                    options.append((src, 1, F))
            if next_w[r] < next_i[r]:
                options.append((0.0, 2, W))
                if next_i[r] - 1 in again[r] or (next_i[r] < m and next_i[r] in again[r]):
                    options = [(0.0, 0, W)]  # finish a recomputed I's W, or flush before one
            if not options:
                continue
            now = [o for o in options if o[0] <= free[r]]
            pick = min(now, key=lambda o: o[1]) if now else min(options)
            start = max(free[r], pick[0])
            cand = (start, pick[1], r, pick[2])
            if best is None or cand < best:
                best = cand
        assert best is not None, "zero-bubble list scheduling stalled"  # limits >= 1
        start, _, r, op = best
        if op is F:
            k = next_f[r]
            next_f[r] += 1
            free[r] = f_end[(r, k)] = start + t[r].forward_ms
        elif op is I_:
            k = next_i[r]
            next_i[r] += 1
            free[r] = i_end[(r, k)] = start + t[r].backward_input_ms
        else:
            k = next_w[r]
            next_w[r] += 1
            free[r] = start + t[r].backward_weight_ms
        out[r].append(pipeline_action(r, op.value, k))
        remaining -= 1
    return out
