"""The fastest contiguous split by enumeration, where the count of splits is small.

Every split of the L-unit chain into S non-empty contiguous stages (C(L-1, S-1) of them, no
recomputation) gets a lower bound on its simulated step time (below); splits are examined in
increasing bound order, each one's exact per-rank peaks are computed (list order alone, no
simulation) and only the fitting ones are simulated. Once the next bound exceeds the fastest
simulated step found, no later split can be faster: the enumeration has *finished*, and its
split is proven fastest (in the simulator, ties: lower peak) among all contiguous splits without
recomputation. Past its budget (splits or seconds) it says so and hands back the best so far.

The bound holds for every schedule because each rank runs its actions in order on one compute
stream (planner.sim.pipeline_ranks): rank r (lowest stage r, stage s on rank s mod P) cannot
start before micro-batch 0's forwards of stages 0..r-1 ran, then computes m x (its stages'
F + B), and its last backward (B, or I under zero-bubble lists) is followed by the backwards of
stages r-1..0 of that micro-batch. Transfers only add time, so they are left out.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from planner.solvers.pipeline.problem import Candidate, PipelineProblem, Split
from planner.solvers.pipeline.schedules import stage_rank

MAX_SPLITS = 20_000  # the count the DP enumerates by default (about 10 s on one core at worst)
TIE_MS = 1e-9  # simulated times within this are equal (then the lower peak wins)


@dataclass(frozen=True)
class Enumeration:
    """What one enumeration found and whether it is a proof."""

    best: Candidate | None  # the fastest fitting split examined (None: none fits)
    finished: bool  # every split was examined or bounded out: `best` is proven fastest
    total_splits: int  # C(L-1, S-1)
    examined: int  # splits whose exact peaks were computed
    simulated: int  # fitting splits simulated
    wall_seconds: float
    reason: str = ""  # why it stopped early ("" when finished)


def split_count(length: int, stages: int) -> int:
    """How many contiguous splits of `length` units into `stages` non-empty stages exist."""
    return math.comb(length - 1, stages - 1) if 1 <= stages <= length else 0


def contiguous_splits(length: int, stages: int) -> Iterator[Split]:
    """Every split of [0, length) into `stages` non-empty contiguous ranges."""
    for cuts in itertools.combinations(range(1, length), stages - 1):
        edges = (0, *cuts, length)
        yield Split(tuple((edges[s], edges[s + 1]) for s in range(stages)))


def step_lower_bound_ms(problem: PipelineProblem, split: Split,
                        times: dict[tuple[int, int, int], tuple[float, float, float]] | None = None
                        ) -> float:
    """A lower bound on the simulated step time of `split` (no recomputation; module doc).
    `times` caches (forward, backward, backward-input) ms per (first, end, stage)."""
    m, ranks = problem.microbatches, problem.ranks
    cache = {} if times is None else times
    per_stage = []  # (F, B, I) ms per stage
    for s, (i, j) in enumerate(split.bounds):
        if (i, j, s) not in cache:
            c = problem.costs(i, j, s)
            cache[(i, j, s)] = (c.forward_ms, c.backward_ms, c.backward_input_ms)
        per_stage.append(cache[(i, j, s)])
    ranks_used = min(ranks, len(per_stage))
    busy_ms = [0.0] * ranks_used  # per rank: m x its stages' F + B
    to_last_i_ms = [0.0] * ranks_used  # per rank: m x its stages' F + I
    for s, (f, b, i_ms) in enumerate(per_stage):
        busy_ms[stage_rank(s, ranks)] += m * (f + b)
        to_last_i_ms[stage_rank(s, ranks)] += m * (f + i_ms)
    split_backward = problem.plan_schedule.split_backward
    best = head_ms = tail_ms = tail_i_ms = 0.0  # head/tail: stages before rank r's first
    for r in range(ranks_used):
        if split_backward:  # the last I is followed by the earlier stages' I; W may come after
            best = max(best, head_ms + max(busy_ms[r], to_last_i_ms[r] + tail_i_ms))
        else:
            best = max(best, head_ms + busy_ms[r] + tail_ms)
        f, b, i_ms = per_stage[r]
        head_ms, tail_ms, tail_i_ms = head_ms + f, tail_ms + b, tail_i_ms + i_ms
    return best


def simulated(problem: PipelineProblem, cand: Candidate) -> Candidate:
    """`cand` (built with simulate=False) with its simulation, without rebuilding its lists."""
    return problem.simulated(cand)


def makespan_ms(cand: Candidate) -> float:
    assert cand.simulation is not None, "simulate the candidate first"
    return cand.simulation.makespan_ms


def faster(a: Candidate, b: Candidate | None) -> bool:
    """`a` simulates faster than `b` (ties within TIE_MS: the lower largest peak)."""
    if b is None:
        return True
    ta, tb = makespan_ms(a), makespan_ms(b)
    if abs(ta - tb) > TIE_MS:
        return ta < tb
    return max(a.peaks) < max(b.peaks)


def enumerate_splits(
    problem: PipelineProblem, max_splits: int = MAX_SPLITS, time_limit_s: float | None = None
) -> Enumeration:
    """The fastest fitting contiguous split without recomputation, by enumeration in bound
    order, within `max_splits` splits and `time_limit_s` seconds (module doc)."""
    start = time.perf_counter()
    L, S = problem.length, problem.stage_count
    total = split_count(L, S)
    if total > max_splits:
        return Enumeration(None, False, total, 0, 0, time.perf_counter() - start,
                           f"{total:,} contiguous splits, more than the {max_splits:,} enumerated")
    times: dict[tuple[int, int, int], tuple[float, float, float]] = {}
    ordered = sorted(((step_lower_bound_ms(problem, split, times), split)
                      for split in contiguous_splits(L, S)), key=lambda pair: pair[0])
    best: Candidate | None = None
    best_ms = math.inf  # best's simulated step time
    examined = simulated_count = 0
    for bound_ms, split in ordered:
        if bound_ms > best_ms + TIE_MS:
            break  # every later split is bounded out: proven
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            return Enumeration(best, False, total, examined, simulated_count,
                               time.perf_counter() - start,
                               f"time limit {time_limit_s:g} s after {examined:,} of "
                               f"{total:,} splits")
        examined += 1
        cand = problem.candidate(split, simulate=False)
        if not cand.fits:
            continue
        cand = simulated(problem, cand)
        simulated_count += 1
        if faster(cand, best):
            best = cand
            best_ms = min(best_ms, makespan_ms(cand))
    return Enumeration(best, True, total, examined, simulated_count,
                       time.perf_counter() - start)
