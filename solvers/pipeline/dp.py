"""Memory-aware dynamic programme over (unit prefix, stages), after MadPipe / Beaumont et al.

best[j][s] = min over i of max(best[i][s-1], t(i, j, s)) where stage s = units [i, j) fits:
its model state + in-flight micro-batches x saved bytes + transient <= the device memory
(in-flight counts from the schedule's own action lists; with v interleaved stages a rank, each
stage gets a share of the device, from 1/v (always sufficient) up to all of it, and each split
found is checked against its ranks' exact peaks).
That minimises the bottleneck stage time t (compute plus boundary transfers). A second pass
minimises the sum of stage times under each of the few smallest bottlenecks above the optimum;
every resulting split is simulated (planner.sim.pipeline_ranks) and the fastest simulated step
wins, the balanced splits of planner.solvers.pipeline.baselines joining the candidates when they
fit:
the objective is the simulated step time, the DP proposes. O(L^2 S) per pass.

`least_memory_split` runs the same DP on memory: the least device memory any contiguous split
needs under the schedule, exact with one stage a rank (the proof when nothing fits).
"""

from __future__ import annotations

import math
import time

from planner.solvers.pipeline.chain_dp import Cost, minmax_dp, minsum_dp
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem, Split

THRESHOLDS = 8
INTERLEAVED_SHARES = 6


def memory_caps(problem: PipelineProblem) -> list[float]:
    """What one stage may hold: the device with one stage a rank; with v stages a rank, shares
    from 1/v of the device (always sufficient) up to all of it (each split is then checked
    against its ranks' exact peaks)."""
    if problem.memory_bytes is None:
        return [math.inf]
    v = problem.stage_count // problem.ranks
    if v == 1:
        return [float(problem.memory_bytes)]
    levels = INTERLEAVED_SHARES
    return [problem.memory_bytes * (1 / v + (1 - 1 / v) * k / (levels - 1)) for k in range(levels)]


def time_cost(problem: PipelineProblem, cap: float, stored: int | None = None) -> Cost:
    table: dict[tuple[int, int, int], float | None] = {}

    def cost(i: int, j: int, s: int) -> float | None:
        key = (i, j, s)
        if key not in table:
            c = problem.costs(i, j, s)
            fits = problem.stage_memory(c, s, stored) <= cap
            table[key] = problem.stage_time(c, s, stored) if fits else None
        return table[key]

    return cost


def proposals(
    problem: PipelineProblem, caps: list[float], stored: int | None = None
) -> tuple[list[Split], float | None]:
    """Splits the time DPs propose under each per-stage memory cap (the least bottleneck, then
    the least sum under the next THRESHOLDS bottlenecks), and the least bottleneck among the
    caps whose first split fits its ranks' exact peaks."""
    L, S = problem.length, problem.stage_count
    splits: list[Split] = []
    bottleneck: float | None = None
    for cap in caps:
        cost = time_cost(problem, cap, stored)
        first = minmax_dp(L, S, cost)
        if first is None:
            continue
        value, bounds = first
        splits.append(Split(tuple(bounds)))
        values = sorted({v for i in range(L) for j in range(i + 1, L + 1) for s in range(S)
                         if (v := cost(i, j, s)) is not None and v >= value})
        for limit in values[:THRESHOLDS]:
            found = minsum_dp(L, S, cost, limit)
            if found is not None:
                splits.append(Split(tuple(found)))
        if problem.candidate(splits[-1], simulate=False).fits:
            bottleneck = value if bottleneck is None else min(bottleneck, value)
    return splits, bottleneck


def dp_partition(problem: PipelineProblem) -> PartitionOutcome:
    start = time.perf_counter()
    splits, bottleneck = proposals(problem, memory_caps(problem))
    proposed = len(set(splits))
    from planner.solvers.pipeline.baselines import BASELINES, baseline_split

    if splits:  # the balanced splits join the candidates: the simulator picks among them all
        splits += [baseline_split(problem, name) for name in BASELINES]
    wall = time.perf_counter() - start
    if not splits:
        return PartitionOutcome("dp", None, "infeasible", wall_seconds=wall,
                                notes=["no contiguous split keeps every stage within memory"])
    best = problem.best_simulated(splits)
    notes = [f"{proposed} DP splits and 3 balanced ones simulated"]
    if best is not None and splits.index(best.split) >= len(splits) - len(BASELINES):
        name = BASELINES[splits.index(best.split) - (len(splits) - len(BASELINES))]
        notes.append(f"the {name} split fits and simulated fastest: kept")
    if best is None:  # a share above 1/v did not hold for the exact per-rank peak
        return PartitionOutcome("dp", None, "infeasible", wall_seconds=time.perf_counter() - start,
                                notes=notes + ["no split proposed fits its ranks' exact peaks"])
    if bottleneck is not None:
        notes.insert(0, f"bottleneck stage time {bottleneck:.4g} ms")
    return PartitionOutcome("dp", best, "feasible", objective=bottleneck,
                            wall_seconds=time.perf_counter() - start, notes=notes)


def least_memory_split(problem: PipelineProblem, recompute: bool = False) -> tuple[int, Split]:
    """The least per-stage peak over contiguous splits (every micro-batch recomputed when
    `recompute`), and a split reaching it; the rank's exact peak with one stage a rank."""
    L, S = problem.length, problem.stage_count
    stored = 0 if recompute else None

    def mem(i: int, j: int, s: int) -> float:
        return float(problem.stage_memory(problem.costs(i, j, s), s, stored))

    found = minmax_dp(L, S, mem)
    assert found is not None  # every split is allowed
    value, bounds = found
    split = Split(tuple(bounds), tuple([stored] * S) if recompute else ())
    v = problem.stage_count // problem.ranks
    if v > 1:  # the least exact peak among this split, the balanced ones and DP proposals
        from planner.solvers.pipeline.baselines import BASELINES, baseline_split

        stored_all = tuple([stored] * S) if recompute else ()

        def peak(c: Split) -> int:
            return max(problem.candidate(Split(c.bounds, stored_all), simulate=False).peaks)

        cands = [split] + [baseline_split(problem, name) for name in BASELINES]
        least = min(peak(c) for c in cands)
        caps = [least * share for share in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)]
        cands += proposals(problem, caps, stored)[0]
        best = min(cands, key=peak)
        return peak(best), Split(best.bounds, stored_all)
    return int(value), split
