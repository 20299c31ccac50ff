"""Memory-aware partitioner: exact enumeration where cheap, else a DP after MadPipe / Beaumont
et al. followed by position-aware local moves.

When the chain has at most `MAX_SPLITS` contiguous splits (planner.solvers.pipeline.enumerate),
every split is bounded, the fitting ones simulated in bound order, and the result is proven the
fastest simulated step among contiguous splits without recomputation: status "optimal". When it
does not finish (too many splits, or out of time), the DP proposes:
best[j][s] = min over i of max(best[i][s-1], t(i, j, s)) where stage s = units [i, j) fits:
its model state + in-flight micro-batches x saved bytes + transient <= the device memory
(in-flight counts from the schedule's own action lists; with v interleaved stages a rank, each
stage gets a share of the device, from 1/v (always sufficient) up to all of it, and each split
found is checked against its ranks' exact peaks).
That minimises the bottleneck stage time t (compute plus boundary transfers), which ignores where
a stage sits in the pipeline (fill, drain, forward/backward asymmetry). A second pass minimises
the sum of stage times under each of the few smallest bottlenecks above the optimum; those splits,
the balanced splits of planner.solvers.pipeline.baselines and the enumeration's best so far are
simulated (planner.sim.pipeline_ranks) and the fastest is then improved by moving stage
boundaries one unit (one boundary, or a run of them together) while the simulated step improves
and the split fits: status "feasible" (no proof). The objective is always the simulated step
time. O(L^2 S) per DP pass.

The time limit is a deterministic work budget (planner.solvers.pipeline.enumerate.Work): the
enumeration's bounds and peak checks, the DP passes, the simulations and the boundary moves are
charged at fixed estimated costs, never with measured time, so the same request gets the same
answer on a loaded machine (later); the wall clock is only a safety net.

`least_memory_split` runs the same DP on memory: the least device memory any contiguous split
needs under the schedule, exact with one stage a rank (the proof when nothing fits).
"""

from __future__ import annotations

import math
import time

from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.solvers.pipeline.chain_dp import Cost, minmax_dp, minsum_dp
from planner.solvers.pipeline.enumerate import (
    MAX_SPLITS,
    PEAKS_S_PER_ACTION,
    Enumeration,
    Work,
    enumerate_splits,
    faster,
    known_ranges,
    makespan_ms,
    simulate_counted,
)
from planner.solvers.pipeline.problem import Candidate, PartitionOutcome, PipelineProblem, Split

THRESHOLDS = 8
INTERLEAVED_SHARES = 6
ENUMERATION_SHARE = 0.7  # of the time limit; the DP and the local moves get the rest
DP_S_PER_CELL = 5e-7  # estimated seconds of one DP pass, per (first, end, stage) cell


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


def dp_partition(
    problem: PipelineProblem, time_limit_s: float | None = None, max_splits: int = MAX_SPLITS
) -> PartitionOutcome:
    """The fastest simulated split found (module doc): proven by enumeration when the count of
    contiguous splits is at most `max_splits` and it finishes in time, else the DP's.
    Deterministic for a given request: the time limit is a budget of counted work
    (planner.solvers.pipeline.enumerate.Work), the wall clock only its safety net."""
    return dp_search(problem, Work.within(
        DEFAULT_PIPELINE_TIME_LIMIT_S if time_limit_s is None else time_limit_s), max_splits)


def dp_search(problem: PipelineProblem, work: Work, max_splits: int = MAX_SPLITS
              ) -> PartitionOutcome:
    """`dp_partition` within `work` (its budget and safety net), charging what it does."""
    start = time.perf_counter()
    listing = work.sub(ENUMERATION_SHARE * work.budget_s)
    found = enumerate_splits(problem, max_splits, work=listing)
    work.charge(listing.spent_s)
    work.wall_out |= listing.wall_out
    if found.finished:
        return _enumerated(found, start)
    known = known_ranges(problem)
    splits, bottleneck = proposals(problem, memory_caps(problem))
    work.charge_ranges(problem, known)
    work.charge(DP_S_PER_CELL * problem.length**2 * problem.stage_count
                * len(memory_caps(problem)) * (1 + THRESHOLDS))
    proposed, own = len(set(splits)), len(splits)  # distinct DP splits; the list's length
    from planner.solvers.pipeline.baselines import BASELINES, baseline_split

    if splits:  # the balanced splits join the candidates: the simulator picks among them all
        splits += [baseline_split(problem, name) for name in BASELINES]
    if found.best is not None:
        splits.append(found.best.split)
    notes = [f"not enumerated: {found.reason}"]
    if not splits:
        return PartitionOutcome("dp", None, "infeasible", wall_seconds=time.perf_counter() - start,
                                notes=notes + ["no contiguous split keeps every stage within "
                                               "memory"])
    before = len(problem._simulations)
    best = problem.best_simulated(splits)
    work.charge(PEAKS_S_PER_ACTION * 2 * problem.stage_count * problem.microbatches
                * len(set(splits)))
    for _ in range(len(problem._simulations) - before):
        work.charge_simulation(problem)
    notes.append(f"{proposed} DP splits and {len(BASELINES)} balanced ones simulated")
    if bottleneck is not None:
        notes.insert(0, f"bottleneck stage time {bottleneck:.4g} ms (the DP's proxy)")
    if best is not None and splits.index(best.split) >= own:
        index = splits.index(best.split) - own
        name = BASELINES[index] if index < len(BASELINES) else "enumeration's best so far"
        notes.append(f"the {name} split fits and simulated fastest among the proposals")
    if best is None:  # a share above 1/v did not hold for the exact per-rank peak
        return PartitionOutcome("dp", None, "infeasible", wall_seconds=time.perf_counter() - start,
                                notes=notes + ["no split proposed fits its ranks' exact peaks"])
    best, moves = improve_by_moves(problem, best, math.inf, work)
    if moves:
        notes.append(f"{moves} boundary move(s) made the simulated step faster")
    if work.wall_out:
        notes.append("the wall-clock safety net (a multiple of the time limit) stopped the "
                     "search: the answer may differ from an unloaded run's")
    return PartitionOutcome("dp", best, "feasible", objective=makespan_ms(best),
                            wall_seconds=time.perf_counter() - start, notes=notes)


def _enumerated(found: Enumeration, start: float) -> PartitionOutcome:
    """The outcome of a finished enumeration: a proof either way."""
    wall = time.perf_counter() - start
    how = (f"all {found.total_splits:,} contiguous splits enumerated ({found.examined:,} "
           f"peaks checked, {found.simulated:,} simulated, the rest bounded out)")
    if found.best is None:
        return PartitionOutcome("dp", None, "infeasible", wall_seconds=wall,
                                notes=[f"{how}: none fits its ranks' exact peaks"])
    step_ms = makespan_ms(found.best)
    return PartitionOutcome("dp", found.best, "optimal", objective=step_ms, lower_bound=step_ms,
                            wall_seconds=wall,
                            notes=[f"fastest simulated step without recomputation: {how}"])


def neighbours(split: Split) -> list[Split]:
    """The splits one move away: a run of consecutive stage boundaries (one boundary, or
    several: the stages between them keep their sizes and slide) shifted by one unit, every
    stage non-empty. Sliding runs reach what single moves cannot: moving the whole middle of
    the pipeline one unit towards the end, where 1F1B's first stage holds the most."""
    edges = [i for i, _ in split.bounds] + [split.bounds[-1][1]]
    out = []
    for k in range(1, len(edges) - 1):
        for last in range(k, len(edges) - 1):  # boundaries k..last move together
            for step in (-1, 1):
                e = edges[:k] + [b + step for b in edges[k:last + 1]] + edges[last + 1:]
                if all(a < b for a, b in zip(e[:-1], e[1:], strict=True)):
                    out.append(Split(tuple(zip(e[:-1], e[1:], strict=True)), split.stored))
    return out


def improve_by_moves(
    problem: PipelineProblem, cand: Candidate, deadline: float, work: Work | None = None
) -> tuple[Candidate, int]:
    """Steepest descent over single-boundary moves: the fastest fitting neighbour replaces
    `cand` while it simulates faster, until none does, `deadline` (perf_counter) passes or
    `work`'s budget is spent (each neighbour's peaks and new simulation charged; its safety
    net passed). With `work` the moves made do not depend on the machine's speed."""
    moves = 0
    seen = {cand.split}

    def going() -> bool:
        return time.perf_counter() < deadline and (work is None or work.left())

    while going():
        better: Candidate | None = None
        for split in neighbours(cand.split):
            if split in seen or not going():
                continue
            seen.add(split)
            trial = problem.candidate(split, simulate=False)
            if work is not None:
                work.charge_peaks(trial)
            if trial.fits:
                trial = simulate_counted(problem, trial, work)
                if faster(trial, better if better is not None else cand):
                    better = trial
        if better is None:
            break
        cand, moves = better, moves + 1
    return cand, moves


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
