"""Whole-job planning: the split and every stage's per-module remat/offload, decided together.

For a contiguous split, each stage's policies (planner.sim.stage_policies: keep, recompute,
offload per module) are the least-time choice that fits the stage's share of its rank under
the schedule's in-flight count (planner.solvers.pipeline.stage_menu: an exact knapsack over
additive upper bounds, timed by the simulator's rule); the split search then judges every
candidate by `simulate_pipeline` (exact per-rank device peaks, the simulated step; host memory:
every rank's offloaded bytes together within `host_memory_bytes`, each stage's knapsack held to
an even share of it).

Candidates, best simulated step wins (ties: lower peak): today's `dp` and `ilp` answers, the
sequential baseline (the DP's split, or the least-memory split when nothing fits plainly, then
per-stage policy choice), the balanced splits, and then, until the time limit:
- every contiguous split when there are at most ENUMERATE_LIMIT: first, for a share of the
  time, those a proxy stage cost finds fastest (planner.solvers.pipeline.proposals), then the
  rest cheapest lower bound first (a split is skipped once its all-keep lower bound reaches the
  best step found: policies only lengthen actions, so with fixed action lists no policy can
  make it faster);
- else the DP's proposals on that proxy stage cost, then today's DP's boundary moves (single
  boundaries and sliding runs), from the best split and, past a local optimum, the next best.
Anytime: while no plan exists, a split is first judged with whole-module policies only (several
times quicker); one that none fits waits for its op-level knapsacks until every other split has
been tried, so the first plan does not wait behind splits that cannot hold one. With a host
tier, a split's plans that copy come last: judged where none without copies fits, else with
the time left (`_with_copies`).

Bound and status: with fixed action lists (every schedule but zero-bubble's time-driven ones) a
plan's step is at least its split's all-keep simulated step; the least of those over all splits
bounds every plan here. "optimal" only when every split was enumerated, every knapsack was exact
and the best plan is its split's all-keep plan at that bound; else "feasible".
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from planner.solvers.pipeline.enumerate import makespan_ms
from planner.solvers.pipeline.policy_splits import PolicySplit, WholeJob
from planner.solvers.pipeline.problem import (
    Candidate,
    PartitionOutcome,
    PipelineProblem,
    simulated_key,
)
from planner.solvers.pipeline.proposals import (
    Bounds,
    Current,
    Deadline,
    Offer,
    ProxyCosts,
    propose,
)
from planner.solvers.pipeline.stage_items import TimeUp

ENUMERATE_LIMIT = 10000  # contiguous splits simulated one by one (cheapest bound first)
PROMISING_SHARE = 0.5  # of the time left, the splits the proxy finds fastest go first
ILP_SHARE = 0.25  # of the time left given to today's ILP (a candidate); 0.5 when the DP has none
DP_SHARE = 0.3  # of the time limit given to today's DP (the first candidate)
DP_SHARE_NO_ILP = 0.6  # with several stages a rank (no ILP candidate)
MOVES_SHARE = 0.8  # the DP's moves continue to this share of the limit (several stages a rank)
ROOM_SHARE = 0.2  # at most this share of the limit is kept clear for the last split judged
MIN_ROOM_SHARE = 0.03  # and at least this (the last step's simulation; a GC pause): a GPT-48
# row answered in 5.1 s at a 5 s limit with room for the slowest split alone
OVERRUN = 0.8  # the DP and the ILP may run past the limit they are given (their last steps)


def whole_job_partition(problem: PipelineProblem, time_limit_s: float = 10.0,
                        threads: int = 2) -> PartitionOutcome:
    from planner.solvers.pipeline.dp import improve_by_moves

    search = _Search(problem, time_limit_s)
    dp = search.candidates(threads)
    complete, bound = search.every_split()
    if dp.best is not None and not complete and time.perf_counter() < search.closing():
        # the time left continues the DP's own boundary moves from its split (no policies)
        moved, count_moves = improve_by_moves(problem, dp.best, search.closing())
        if count_moves:
            search.offer(moved, "the DP's split moved further")
    return search.outcome(complete, bound)


class _Search:
    """One whole-job search: the best plan so far, the time kept, and how a split is judged."""

    def __init__(self, problem: PipelineProblem, time_limit_s: float) -> None:
        self.p = problem
        self.limit_s = time_limit_s
        self.start = time.perf_counter()
        self.deadline = self.start + time_limit_s
        self.job = WholeJob.of(problem)
        self.job.deadline = None
        self.notes: list[str] = []
        self.best: Candidate | None = None
        self.source = ""  # what found the best plan
        self.first_s: float | None = None  # when the first fitting plan was found
        self.fitting: dict[Bounds, float] = {}  # every split a plan fits: its fastest step (ms)
        self.slowest_s = 0.0  # the longest one split's judgement took (kept clear of the limit)
        self.sim_s = 0.0  # the longest one candidate's simulation took
        self.unfit: list[Bounds] = []  # splits no whole-module plan fits, not yet at op level
        self.late = False  # trying those now
        self.timed_out = False  # some split stayed unjudged (TimeUp)
        self.copied: set[Bounds] = set()  # splits judged with plans that may copy

    # -- judging one split ----------------------------------------------------------------------
    def current(self) -> Candidate | None:
        return self.best

    def closing(self) -> float:
        """The limit less room for the last split judged (as slow as any): no split begins
        later."""
        return self.deadline - min(max(self.slowest_s, MIN_ROOM_SHARE * self.limit_s),
                                   ROOM_SHARE * self.limit_s)

    def offer(self, cand: Candidate | None, name: str) -> None:
        if cand is None or not cand.fits or cand.simulation is None:
            return
        step = cand.simulation.makespan_ms
        bounds = cand.split.bounds
        self.fitting[bounds] = min(step, self.fitting.get(bounds, step))
        if self.best is None or simulated_key(cand) < simulated_key(self.best):
            self.best, self.source = cand, name
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.start

    def judged(self, split: PolicySplit) -> Candidate:
        began = time.perf_counter()
        cand = self.job.candidate(split)
        self.sim_s = max(self.sim_s, time.perf_counter() - began)
        return cand

    def offer_both(self, split: PolicySplit, name: str) -> None:
        self.offer(self.judged(split), name)
        if split.mixed and (self.best is None
                            or time.perf_counter() + self.sim_s < self.deadline):
            # a mix's mean stage time is not the step: its one plans too
            self.offer(self.judged(replace(split, mixed=False)), name)

    def try_bounds(self, bounds: Bounds, name: str) -> None:
        job = self.job
        began = time.perf_counter()
        # zero-bubble: stages over their share may run one B a micro-batch instead of I and W
        fused = job.fused_for_memory(bounds)
        if self.best is None and not self.late:  # anytime: whole-module knapsacks (quicker)
            job.deadline = None
            quick = job.with_policies(bounds, op_level=False)
            if quick is None and fused:
                quick = job.with_policies(bounds, op_level=False, fused=fused)
            if quick is None:  # op-level options seldom fit where whole modules do not:
                self.unfit.append(bounds)  # those wait until no split fits otherwise
                return
            self.offer(self.judged(quick), name)
        # once a plan exists, knapsacks stop in time for the split's two simulations
        job.deadline = self.deadline - 2 * self.sim_s if self.best is not None else None
        try:
            # with a host tier, plans that copy only where none without copies fits: the
            # split's plans that copy come last (`try_with_copies`)
            if not self._with_policies(bounds, name, fused, copies=False) and job.host_memory:
                self._with_policies(bounds, name + ", host copies", fused, copies=True)
                self.copied.add(bounds)
        except TimeUp:  # a knapsack ran past the limit: this split stays unjudged
            self.timed_out = True
            return
        self.slowest_s = max(self.slowest_s, time.perf_counter() - began)

    def _with_policies(self, bounds: Bounds, name: str, fused: frozenset[int],
                       copies: bool) -> bool:
        """The split with each stage's choice (`copies`: plans may copy to the host), and
        with the stages in `fused` running full backwards where some stage recomputes or none
        fits (TimeUp past the job's deadline). Returns whether some plan of it fits."""
        split = self.job.with_policies(bounds, host_tier=copies)
        found = split is not None
        if split is not None and (not copies or split.policies or split.rerun):
            self.offer_both(split, name)
        if fused and (split is None or split.policies):
            split = self.job.with_policies(bounds, host_tier=copies, fused=fused)
            if split is not None:
                found = True
                self.offer_both(split, name + ", I and W fused for memory")
        return found

    def try_with_copies(self, bounds: Bounds) -> bool:
        """The split with plans that may copy to the host; False: a knapsack ran past the
        limit."""
        if bounds in self.copied:  # judged so already (no plan without copies fits it)
            return True
        self.job.deadline = self.deadline - 2 * self.sim_s
        try:
            self._with_policies(bounds, "the split's plans with host copies",
                                self.job.fused_for_memory(bounds), copies=True)
        except TimeUp:
            return False
        self.copied.add(bounds)
        return True

    # -- the phases ------------------------------------------------------------------------------
    def candidates(self, threads: int) -> PartitionOutcome:
        """Today's DP and its split with policies, the balanced splits, today's ILP and its
        split (each judged here); returns the DP's outcome."""
        from planner.solvers.pipeline.baselines import BASELINES, baseline_split
        from planner.solvers.pipeline.dp import dp_partition, improve_by_moves, least_memory_split

        p, limit_s = self.p, self.limit_s
        # several stages a rank: no ILP candidate, so the DP gets the ILP's share too
        dp_share = DP_SHARE if p.stage_count == p.ranks else DP_SHARE_NO_ILP
        dp = dp_partition(p, time_limit_s=OVERRUN * dp_share * limit_s)
        self.offer(dp.best, "dp")
        seq = dp.best.split if dp.best is not None else least_memory_split(p)[1]
        self.try_bounds(seq.bounds, "the DP's split with per-stage policies")
        for name in BASELINES:  # each as slow as the slowest so far: none begun past the limit
            if self.best is not None and time.perf_counter() + self.slowest_s > self.deadline:
                break
            self.try_bounds(baseline_split(p, name).bounds, f"the {name} split with policies")
        if dp.best is not None and p.stage_count > p.ranks:
            # the DP's boundary moves go on first (its simulations are shared), until
            # MOVES_SHARE of the limit: with several stages a rank they find most faster splits
            moved, _ = improve_by_moves(p, dp.best, self.start + MOVES_SHARE * limit_s)
            self.offer(moved, "the DP's split moved further")
        self._ilp(threads, ILP_SHARE if dp.best is not None else 2 * ILP_SHARE)
        return dp

    def _ilp(self, threads: int, share: float) -> None:
        from planner.solvers.pipeline.ilp import ilp_partition

        left_s = self.deadline - time.perf_counter()
        if self.p.stage_count > self.p.ranks:  # interleaved: its model outgrows a short share
            self.notes.append("today's ILP not run (several stages a rank: its CP-SAT model "
                              "does not fit a share of the time limit)")
        elif time.perf_counter() > self.closing():  # building its model takes ~0.4 s, GPT-48
            self.notes.append("today's ILP not run (the candidates before it took the time "
                              "limit)")
        else:
            ilp = ilp_partition(self.p, time_limit_s=max(0.1, OVERRUN * share * left_s),
                                threads=threads)
            self.offer(ilp.best, "ilp")
            if ilp.best is not None and time.perf_counter() < self.closing():
                # its split with per-module policies, not whole-stage reruns
                self.try_bounds(ilp.best.split.bounds,
                                "the ILP's split with per-stage policies")

    def every_split(self) -> tuple[bool, float | None]:
        """Every contiguous split where few enough, else proposals; then the splits waiting
        for op-level knapsacks, and with a host tier the plans that may copy. Returns (every
        split judged, the least all-keep step over every split)."""
        p, job = self.p, self.job
        count = math.comb(p.length - 1, p.stage_count - 1)
        complete, bound = False, None
        if count <= ENUMERATE_LIMIT:
            until = time.perf_counter() + PROMISING_SHARE * max(
                0.0, self.closing() - time.perf_counter())
            complete, bound = _enumerate(job, self.try_bounds, self.current, self.closing,
                                         job.proxy, until)
            self.notes.append(f"{count} contiguous splits " + (
                "all judged" if complete else "partly judged (time limit)"))
        else:
            propose(p, job.proxy, self.try_bounds, self.current, self.closing,
                    lambda: self.fitting)
            self.notes.append(f"{count} contiguous splits: DP proposals and local moves")
        self.late = True  # the splits no whole-module plan fits, at op level (unless slower)
        for bounds in dict.fromkeys(self.unfit):
            if time.perf_counter() > self.closing():
                complete = False
                break
            if self.best is None or job.keep_step_ms(bounds) < makespan_ms(self.best) - 1e-9:
                self.try_bounds(bounds, "op-level options")
        if self.best is not None and job.host_memory and time.perf_counter() < self.closing():
            _with_copies(job, self.fitting, self.current, self.closing, self.try_with_copies)
        return complete and not self.timed_out, bound

    def outcome(self, complete: bool, bound: float | None) -> PartitionOutcome:
        wall = time.perf_counter() - self.start
        best, notes = self.best, self.notes
        if best is None:
            return PartitionOutcome("whole", None, "infeasible", wall_seconds=wall,
                                    notes=notes + ["no split fits with any per-module policy"])
        assert best.simulation is not None
        step = best.simulation.makespan_ms
        fixed_lists = not self.p.plan_schedule.split_backward
        proven = complete and fixed_lists and bound is not None and step <= bound + 1e-9
        if not self.job.exact:
            notes.append("some stage knapsacks were cut (frontier limit): not proven least")
        policies = sum(len(dict(ps)) for ps in getattr(best.split, "policies", ()))
        notes.insert(0, f"best from {self.source}; {policies} module(s) recompute or offload; "
                        f"first plan in {self.first_s or 0.0:.2f} s")
        return PartitionOutcome("whole", best, "optimal" if proven else "feasible",
                                objective=step, lower_bound=bound if fixed_lists else None,
                                wall_seconds=wall, notes=notes)


def _with_copies(job: WholeJob, fitting: dict[Bounds, float], current: Current,
                 deadline: Deadline, judge: Callable[[Bounds], bool]) -> None:
    """With a host tier, the time left judges the splits that fit without copies again with
    plans that may copy (`judge`; False: out of time), fastest first, while their all-keep
    bound is below the best step. Copies come last: on the stage's stream (as the runtime
    issues them) they cost several times a rerun freeing as much (a GPT-12 block: 1.35 ms out
    and back against a 175 us rerun), so they seldom make a faster plan, while a host tier's
    knapsack, up to 15 options a module, judged fewer splits in the time (23 of 100
    benchmark rows were slower with a host tier than without when copies came first)."""
    for bounds in sorted(fitting, key=fitting.__getitem__):
        best = current()
        if best is None or time.perf_counter() > deadline():
            return
        if job.keep_step_ms(bounds) < makespan_ms(best) - 1e-9 and not judge(bounds):
            return


def _splits(L: int, S: int) -> Iterator[Bounds]:
    for cuts in itertools.combinations(range(1, L), S - 1):
        edges = (0, *cuts, L)
        yield tuple((edges[s], edges[s + 1]) for s in range(S))


def _enumerate(job: WholeJob, try_bounds: Offer, current: Current, deadline: Deadline,
               proxy: ProxyCosts, promising_until: float) -> tuple[bool, float | None]:
    """Every split: first, until `promising_until`, those the proxy finds fastest (memory
    included, planner.solvers.pipeline.proposals); then the rest, least busy-time bound first,
    skipped once its bound reaches the best step. Returns (all judged, the least all-keep step
    over every split)."""
    p = job.p
    splits = list(_splits(p.length, p.stage_count))
    judged: set[Bounds] = set()
    for bounds in sorted(splits, key=proxy.split_key):
        if time.perf_counter() > min(promising_until, deadline()):
            break
        best = current()
        if best is not None and (job.cheap_bound_ms(bounds) >= makespan_ms(best) - 1e-9
                                 or job.keep_step_ms(bounds) >= makespan_ms(best) - 1e-9):
            continue  # no plan of it is faster (the proof comes with the bound order below)
        try_bounds(bounds, "enumeration")
        judged.add(bounds)
    order = sorted(splits, key=job.cheap_bound_ms)
    bound = math.inf
    for bounds in order:
        if time.perf_counter() > deadline():
            return False, None
        cheap = job.cheap_bound_ms(bounds)
        best = current()
        if best is not None and cheap >= makespan_ms(best) - 1e-9:
            return True, min(bound, cheap)  # every later split's bound is at least `cheap`
        keep = job.keep_step_ms(bounds)
        bound = min(bound, keep)
        if bounds in judged or best is not None and keep >= makespan_ms(best) - 1e-9:
            continue
        try_bounds(bounds, "enumeration")
    return True, bound

