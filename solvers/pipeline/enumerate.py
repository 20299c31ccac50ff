"""The fastest contiguous split by enumeration, where the count of splits is small.

Every split of the L-unit chain into S non-empty contiguous stages (C(L-1, S-1) of them, no
recomputation) gets a lower bound on its simulated step time (below); splits are examined in
increasing bound order, each one's exact per-rank peaks are computed (list order alone, no
simulation) and only the fitting ones are simulated. Once the next bound exceeds the fastest
simulated step found, no later split can be faster: the enumeration has *finished*, and its
split is proven fastest (in the simulator, ties: lower peak) among all contiguous splits without
recomputation. Past its budget (splits or seconds) it says so and hands back the best so far.

The seconds are a deterministic work budget (`Work`): each bound, peak check and simulation is
charged at a fixed estimated cost (BOUND_S, PEAKS_S_PER_ACTION, SIM_S_PER_NODE_MB), never with
measured time, so a loaded machine takes longer but examines the same splits and answers the
same. The wall clock is only a safety net (WALL_SAFETY x the limit): past it the best so far is
the answer.

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
WALL_SAFETY = 3.0  # the wall-clock safety net, as a multiple of a work budget's seconds
# Estimated seconds of each kind of work (deterministic: counted, never timed): CPU seconds
# measured once on GPT-48 at op level (3,193 nodes, 53 units, 4 ranks, 8 micro-batches, 1F1B,
# Python 3.11) on a shared 2-core machine, about an idle machine's wall seconds
BOUND_S = 1e-5  # one split's step lower bound (the enumeration's ordering)
PEAKS_S_PER_ACTION = 5e-6  # one split's exact peaks (list order), per action of its lists
SIM_S_PER_NODE_MB = 1e-6  # one pipeline simulation, per graph node and micro-batch
RANGE_S_PER_NODE = 1e-6  # a unit range's costs, the first time, per graph node in it


class Work:
    """A deterministic work budget: counted work at the fixed estimated costs above is charged
    against `budget_s`; the wall clock (`deadline`, a perf_counter time; None: none) is only
    the safety net that stops a search on a machine far slower than the estimates."""

    def __init__(self, budget_s: float, deadline: float | None = None) -> None:
        self.budget_s = budget_s
        self.deadline = deadline
        self.spent_s = 0.0
        self.wall_out = False  # the safety net stopped something

    @classmethod
    def within(cls, budget_s: float, start: float | None = None) -> Work:
        """`budget_s` of work, the safety net WALL_SAFETY x that after `start` (now)."""
        begun = time.perf_counter() if start is None else start
        return cls(budget_s, begun + WALL_SAFETY * max(0.0, budget_s))

    @property
    def left_s(self) -> float:
        return max(0.0, self.budget_s - self.spent_s)

    def charge(self, seconds: float) -> None:
        self.spent_s += seconds

    def charge_peaks(self, cand: Candidate) -> None:
        """One split's exact peaks (`problem.candidate(split, simulate=False)`)."""
        self.charge(PEAKS_S_PER_ACTION * sum(len(row) for row in cand.rank_actions))

    def charge_simulation(self, problem: PipelineProblem) -> None:
        self.charge(SIM_S_PER_NODE_MB * len(problem.chain.node_unit) * problem.microbatches)

    def charge_ranges(self, problem: PipelineProblem, known: set[tuple[int, int]]) -> None:
        """The unit ranges whose costs were first computed since `known` (`known_ranges`),
        each by its graph nodes: a problem's first search pays for its range table."""
        memo = getattr(problem.chain, "_released_memo", None)
        if not isinstance(memo, dict):
            return
        new = memo.keys() - known
        if not new:
            return
        edges = [0] * (problem.length + 1)
        for u in problem.chain.node_unit.values():
            edges[u + 1] += 1
        for u in range(problem.length):
            edges[u + 1] += edges[u]
        self.charge(RANGE_S_PER_NODE * sum(edges[j] - edges[i] for i, j in new))

    def left(self) -> bool:
        """Whether work may go on: budget left and the safety net not reached."""
        if self.spent_s >= self.budget_s:
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            self.wall_out = True
            return False
        return True

    def sub(self, budget_s: float) -> Work:
        """A part of what is left (at most `budget_s`), with the same safety net; charge it
        back with `charge(part.spent_s)`."""
        return Work(min(budget_s, self.left_s), self.deadline)


def known_ranges(problem: PipelineProblem) -> set[tuple[int, int]]:
    """The unit ranges whose costs the problem's chain holds (for `Work.charge_ranges`)."""
    memo = getattr(problem.chain, "_released_memo", None)
    return set(memo) if isinstance(memo, dict) else set()


def simulate_counted(problem: PipelineProblem, cand: Candidate, work: Work | None) -> Candidate:
    """`cand` simulated, its simulation charged to `work` when it is new (the problem keeps
    the simulations: a split simulated before costs nothing)."""
    before = len(problem._simulations)
    out = problem.simulated(cand)
    if work is not None and len(problem._simulations) > before:
        work.charge_simulation(problem)
    return out


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
    problem: PipelineProblem, max_splits: int = MAX_SPLITS, time_limit_s: float | None = None,
    work: Work | None = None,
) -> Enumeration:
    """The fastest fitting contiguous split without recomputation, by enumeration in bound
    order, within `max_splits` splits and `time_limit_s` seconds of counted work (module doc;
    `work`: charge that budget instead, its safety net included)."""
    start = time.perf_counter()
    if work is None and time_limit_s is not None:
        work = Work.within(time_limit_s, start)
    L, S = problem.length, problem.stage_count
    total = split_count(L, S)
    if total > max_splits:
        return Enumeration(None, False, total, 0, 0, time.perf_counter() - start,
                           f"{total:,} contiguous splits, more than the {max_splits:,} enumerated")
    times: dict[tuple[int, int, int], tuple[float, float, float]] = {}
    known = known_ranges(problem) if work is not None else set()
    ordered = sorted(((step_lower_bound_ms(problem, split, times), split)
                      for split in contiguous_splits(L, S)), key=lambda pair: pair[0])
    if work is not None:
        work.charge(BOUND_S * total)
        work.charge_ranges(problem, known)
    best: Candidate | None = None
    best_ms = math.inf  # best's simulated step time
    examined = simulated_count = 0
    for bound_ms, split in ordered:
        if bound_ms > best_ms + TIE_MS:
            break  # every later split is bounded out: proven
        if work is not None and not work.left():
            why = ("the wall-clock safety net" if work.wall_out
                   else f"{work.budget_s:g} s of counted work")
            return Enumeration(best, False, total, examined, simulated_count,
                               time.perf_counter() - start,
                               f"time limit ({why}) after {examined:,} of {total:,} splits")
        examined += 1
        cand = problem.candidate(split, simulate=False)
        if work is not None:
            work.charge_peaks(cand)
        if not cand.fits:
            continue
        cand = simulate_counted(problem, cand, work)
        simulated_count += 1
        if faster(cand, best):
            best = cand
            best_ms = min(best_ms, makespan_ms(cand))
    return Enumeration(best, True, total, examined, simulated_count,
                       time.perf_counter() - start)
