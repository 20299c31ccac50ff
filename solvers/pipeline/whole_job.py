"""Whole-job planning: the split and every stage's per-module remat/offload, decided together.

For a contiguous split, each stage's policies (planner.sim.stage_policies: keep, recompute,
offload per module) are the least-time choice that fits the stage's share of its rank under
the schedule's in-flight count (planner.solvers.pipeline.stage_menu: an exact knapsack over
additive upper bounds, timed by the simulator's rule); the split search then judges every
candidate by `simulate_pipeline` (exact per-rank device peaks, the simulated step; host memory:
every rank's offloaded bytes together within `host_memory_bytes`, each stage's knapsack held to
an even share of it).

Candidates, best simulated step wins (ties: lower peak), in a fixed order: today's `dp` answer,
today's `ilp` answer (one CP-SAT thread), the DP's split (or the least-memory split when
nothing fits plainly) and the ILP's with per-stage policy choice, the balanced splits, and
then, within the work budget (`_Search`: counted work at fixed estimated costs, so the answer
does not depend on the machine's speed; the wall clock only as a safety net):
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
the time left (`_with_copies`). Last, monotone in memory (`_Search.walk_down`): the fastest
splits are judged again with every stage held below their plan's peak, a few steps down.

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

from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.solvers.pipeline.enumerate import Work, makespan_ms
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
PROMISING_SHARE = 0.5  # of the work left, the splits the proxy finds fastest go first
ILP_SHARE = 0.25  # of the time limit given to today's ILP (a candidate, run second)
DP_SHARE = 0.3  # of the time limit given to today's DP (the first candidate)
DP_SHARE_NO_ILP = 0.6  # with several stages a rank (no ILP candidate)
MOVES_SHARE = 0.8  # the DP's moves continue to this share of the work (several stages a rank)
WORK_SHARE = 0.8  # of the limit, the deterministic work budget (the rest: the wall clock's
# margin for a loaded machine and the last judgement)
ROOM_S = 0.05  # the wall-clock safety net stops knapsacks this long before the limit
WALK_STEPS = 6  # plans down a split's memory staircase (`walk_down`) ...
WALK_SPLITS = 3  # ... for this many of the fastest splits
# Estimated seconds of each kind of work (deterministic: counted, never timed; measured on
# GPT-8 and GPT-48 graphs at op level and doubled for a loaded 2-core machine)
FIGURES_S_PER_NODE = (2e-4, 8e-4)  # a range's module figures, whole modules / op level
FACTS_S_PER_NODE = 5e-5  # a range's module facts
CHOICE_S_PER_NODE = 1e-4  # one stage knapsack
SIM_S_PER_NODE_MB = 1e-5  # one pipeline simulation, per node and micro-batch


def whole_job_partition(problem: PipelineProblem,
                        time_limit_s: float = DEFAULT_PIPELINE_TIME_LIMIT_S,
                        threads: int = 2) -> PartitionOutcome:
    from planner.solvers.pipeline.dp import improve_by_moves

    search = _Search(problem, time_limit_s)
    dp = search.candidates(threads)
    complete, bound = search.every_split()
    if dp.best is not None and not complete and search.working():
        # the work left continues the DP's own boundary moves from its split (no policies)
        moved, count_moves = improve_by_moves(problem, dp.best, search.closing(),
                                              search.moves_work(search.budget_s))
        search.charge_simulations()
        if count_moves:
            search.offer(moved, "the DP's split moved further")
    search.walk_down()
    return search.outcome(complete, bound)


class _Search:
    """One whole-job search: the best plan so far, the work done, and how a split is judged.

    Deterministic for a given request: every cut-off is a work budget (WORK_SHARE of the
    limit) charged with counted work at fixed estimated costs (FIGURES_S_PER_NODE ...), never
    with measured time, and the phases run in a fixed order. The wall clock is only the
    safety net: past `deadline` less ROOM_S nothing more begins and the best so far is the
    answer (on a machine slower than the estimates, answers may then differ)."""

    def __init__(self, problem: PipelineProblem, time_limit_s: float) -> None:
        self.p = problem
        self.limit_s = time_limit_s
        self.start = time.perf_counter()
        self.deadline = self.start + time_limit_s
        self.budget_s = WORK_SHARE * time_limit_s  # the deterministic work budget
        self.work_s = 0.0  # the work charged so far (estimated seconds)
        self.job = WholeJob.of(problem)
        self.job.deadline = None
        self.nodes = [0] * problem.length  # graph nodes per unit (the work estimates)
        for u in problem.chain.node_unit.values():
            self.nodes[u] += 1
        self.seen = (set(self.job.figures), set(self.job.choices), set(self.job.range_facts),
                     len(problem._simulations))  # the caches' state when last charged
        self.notes: list[str] = []
        self.best: Candidate | None = None
        self.source = ""  # what found the best plan
        self.first_s: float | None = None  # when the first fitting plan was found
        self.fitting: dict[Bounds, float] = {}  # every split a plan fits: its fastest step (ms)
        self.unfit: list[Bounds] = []  # splits no whole-module plan fits, not yet at op level
        self.late = False  # trying those now
        self.timed_out = False  # some split stayed unjudged (work budget or wall clock)
        self.copied: set[Bounds] = set()  # splits judged with plans that may copy

    # -- the work budget and the wall clock ------------------------------------------------------
    def working(self, more_s: float = 0.0) -> bool:
        """Whether `more_s` of estimated work fits the budget and the wall clock has room."""
        return (self.work_s + more_s <= self.budget_s
                and time.perf_counter() < self.deadline - ROOM_S)

    def closing(self) -> float:
        """A perf_counter time for the callees' loops: 0 once the work budget is spent (they
        stop at once), else the wall-clock safety net."""
        return self.deadline - ROOM_S if self.working() else 0.0

    def moves_work(self, until_s: float) -> Work:
        """The DP's boundary moves' budget: the work left up to `until_s` of this search's
        budget, counted at the moves' own rates (each neighbour's peaks and simulation), so
        how many moves are made does not depend on the machine's speed; the safety net as
        `closing`."""
        return Work(max(0.0, until_s - self.work_s), self.closing())

    def _range_nodes(self, i: int, j: int) -> int:
        return sum(self.nodes[i:j])

    def charge_simulations(self) -> None:
        """Charge the problem's simulations made since the last charge (the DP's, the ILP's,
        boundary moves: its cache of simulated splits)."""
        count = len(self.p._simulations)
        self.work_s += (count - self.seen[3]) * self._sim_s()
        self.seen = (*self.seen[:3], count)

    def _sim_s(self) -> float:
        return SIM_S_PER_NODE_MB * len(self.p.graph.nodes) * self.p.microbatches

    def charge(self) -> None:
        """Charge the knapsack work done since the last charge, counted from the caches."""
        job = self.job
        figures, choices, facts, _ = self.seen
        for key in set(job.figures) - figures:
            self.work_s += self._range_nodes(key[0], key[1]) * FIGURES_S_PER_NODE[key[3]]
        for ckey in set(job.choices) - choices:
            self.work_s += self._range_nodes(ckey[0], ckey[1]) * CHOICE_S_PER_NODE
        for i, j in set(job.range_facts) - facts:
            self.work_s += self._range_nodes(i, j) * FACTS_S_PER_NODE
        self.seen = (set(job.figures), set(job.choices), set(job.range_facts), self.seen[3])
        self.charge_simulations()

    def predicted_s(self, bounds: Bounds) -> float:
        """The most judging this split may cost: op-level figures and a knapsack for every
        stage whose all-keep peak is over its share, and two simulations."""
        p, job = self.p, self.job
        work = 2 * self._sim_s()
        for s, (i, j) in enumerate(bounds):
            if p.stage_memory(p.costs(i, j, s), s) <= job.cap:
                continue
            nodes = self._range_nodes(i, j)
            work += nodes * CHOICE_S_PER_NODE
            if not any(k[:2] == (i, j) for k in job.figures):
                work += nodes * (FIGURES_S_PER_NODE[1] + FACTS_S_PER_NODE)
        return work

    # -- judging one split ----------------------------------------------------------------------
    def current(self) -> Candidate | None:
        return self.best

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
        cand = self.job.candidate(split)
        self.work_s += 2 * self._sim_s()  # candidate() may simulate both I/W variants
        return cand

    def offer_both(self, split: PolicySplit, name: str) -> None:
        self.offer(self.judged(split), name)
        if split.mixed and (self.best is None or self.working()):
            # a mix's mean stage time is not the step: its one plans too
            self.offer(self.judged(replace(split, mixed=False)), name)

    def try_bounds(self, bounds: Bounds, name: str) -> None:
        """Judge the split with each stage's policies, where its predicted work fits the
        budget (the first plan is always sought)."""
        if self.best is not None and not self.working(self.predicted_s(bounds)):
            self.timed_out = True
            return
        try:
            self._try_bounds(bounds, name)
        finally:
            self.charge()

    def _try_bounds(self, bounds: Bounds, name: str) -> None:
        job = self.job
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
        # once a plan exists, knapsacks stop at the wall clock's safety net
        job.deadline = self.deadline - ROOM_S if self.best is not None else None
        try:
            # with a host tier, plans that copy only where none without copies fits: the
            # split's plans that copy come last (`try_with_copies`)
            if not self._with_policies(bounds, name, fused, copies=False) and job.host_memory:
                self._with_policies(bounds, name + ", host copies", fused, copies=True)
                self.copied.add(bounds)
        except TimeUp:  # a knapsack ran past the wall clock: this split stays unjudged
            self.timed_out = True

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
        """The split with plans that may copy to the host; False: out of work or time."""
        if bounds in self.copied:  # judged so already (no plan without copies fits it)
            return True
        if not self.working(self.predicted_s(bounds)):
            return False
        self.job.deadline = self.deadline - ROOM_S
        try:
            self._with_policies(bounds, "the split's plans with host copies",
                                self.job.fused_for_memory(bounds), copies=True)
        except TimeUp:
            return False
        finally:
            self.charge()
        self.copied.add(bounds)
        return True

    # -- the phases ------------------------------------------------------------------------------
    def candidates(self, threads: int) -> PartitionOutcome:
        """Today's DP, today's ILP, their splits with policies, the balanced splits (each
        judged here); returns the DP's outcome."""
        from planner.solvers.pipeline.baselines import BASELINES, baseline_split
        from planner.solvers.pipeline.dp import dp_partition, improve_by_moves, least_memory_split

        p, limit_s = self.p, self.limit_s
        # several stages a rank: no ILP candidate, so the DP gets the ILP's share too
        dp_share = DP_SHARE if p.stage_count == p.ranks else DP_SHARE_NO_ILP
        dp = dp_partition(p, time_limit_s=dp_share * limit_s)
        self.charge_simulations()  # its work: its simulations
        self.offer(dp.best, "dp")
        ilp = self._ilp()  # second: a strong plan, quick and deterministic (module doc)
        seq = dp.best.split if dp.best is not None else least_memory_split(p)[1]
        self.try_bounds(seq.bounds, "the DP's split with per-stage policies")
        if ilp is not None and ilp.split.bounds != seq.bounds:
            # its split with per-module policies, not whole-stage reruns
            self.try_bounds(ilp.split.bounds, "the ILP's split with per-stage policies")
        for name in BASELINES:
            self.try_bounds(baseline_split(p, name).bounds, f"the {name} split with policies")
        if dp.best is not None and p.stage_count > p.ranks:
            # the DP's boundary moves go on first (its simulations are shared), until
            # MOVES_SHARE of the work: with several stages a rank they find most faster splits
            moved, _ = improve_by_moves(p, dp.best, self.closing(),
                                        self.moves_work(MOVES_SHARE * self.budget_s))
            self.charge_simulations()
            self.offer(moved, "the DP's split moved further")
        return dp

    def _ilp(self) -> Candidate | None:
        """Today's ILP (one stage a rank), on one thread: CP-SAT then searches the same way
        every run and, where it proves its proxy optimal within its share (GPT-48 on 4 ranks:
        ~1 s), answers the same. Its share is charged as work whatever it took."""
        from planner.solvers.pipeline.ilp import ilp_partition

        if self.p.stage_count > self.p.ranks:  # interleaved: its model outgrows a short share
            self.notes.append("today's ILP not run (several stages a rank: its CP-SAT model "
                              "does not fit a share of the time limit)")
            return None
        share_s = ILP_SHARE * self.limit_s
        if not self.working(share_s):
            self.notes.append("today's ILP not run (the candidates before it took the time "
                              "limit)")
            return None
        ilp = ilp_partition(self.p, time_limit_s=share_s, threads=1)
        self.work_s += share_s
        self.seen = (*self.seen[:3], len(self.p._simulations))  # within its share
        self.offer(ilp.best, "ilp")
        return ilp.best

    def every_split(self) -> tuple[bool, float | None]:
        """Every contiguous split where few enough, else proposals; then the splits waiting
        for op-level knapsacks, and with a host tier the plans that may copy. Returns (every
        split judged, the least all-keep step over every split)."""
        p, job = self.p, self.job
        count = math.comb(p.length - 1, p.stage_count - 1)
        complete, bound = False, None
        if count <= ENUMERATE_LIMIT:
            promising_s = self.work_s + PROMISING_SHARE * max(0.0, self.budget_s - self.work_s)

            def promising() -> float:
                return self.closing() if self.work_s <= promising_s else 0.0

            complete, bound = _enumerate(job, self.try_bounds, self.current, self.closing,
                                         job.proxy, promising)
            self.charge()
            self.notes.append(f"{count} contiguous splits " + (
                "all judged" if complete else "partly judged (time limit)"))
        else:
            propose(p, job.proxy, self.try_bounds, self.current, self.closing,
                    lambda: self.fitting)
            self.charge()
            self.notes.append(f"{count} contiguous splits: DP proposals and local moves")
        self.late = True  # the splits no whole-module plan fits, at op level (unless slower)
        for bounds in dict.fromkeys(self.unfit):
            if self.best is not None and not self.working():
                complete = False
                break
            if self.best is None or job.keep_step_ms(bounds) < makespan_ms(self.best) - 1e-9:
                self.try_bounds(bounds, "op-level options")
        if self.best is not None and job.host_memory and self.working():
            _with_copies(job, self.fitting, self.current, self.closing, self.try_with_copies)
        return complete and not self.timed_out, bound

    def walk_down(self) -> None:
        """Monotone in memory: the fastest splits' plans the search finds at smaller device
        memories. A stage's knapsack picks the least added time per micro-batch, which is not
        the simulated step (a two-plan mix or a different op-level choice at less memory can
        simulate faster: GPT-8 on 4 ranks, 118.08 ms at 34.18 MB but 119.26 ms at 35.73 MB,
        same split); so from the best plan of each of the WALK_SPLITS fastest splits, the
        split is judged again with every stage held below that plan's largest rank peak, down
        to WALK_STEPS plans, and the fastest of them all is the answer."""
        v = self.p.stage_count // self.p.ranks
        for bounds in sorted(self.fitting, key=self.fitting.__getitem__)[:WALK_SPLITS]:
            peak = self._walk_start(bounds)
            for _ in range(WALK_STEPS):
                if peak is None or not self.working(self.predicted_s(bounds)):
                    break
                peak = self._walk_step(bounds, (peak - 1) / v)

    def _walk_start(self, bounds: Bounds) -> int | None:
        """The largest rank peak of the split's plan, where it has policies (None: all-keep,
        the fastest there is for it)."""
        best = self.best
        if best is not None and best.split.bounds == bounds:
            cand = best
        else:
            split = self.job.with_policies(bounds, host_tier=bounds in self.copied)
            if split is None:
                return None
            cand = self.judged(split)
        if not isinstance(cand.split, PolicySplit) or not (cand.split.policies
                                                           or cand.split.rerun):
            return None
        return max(cand.peaks)

    def _walk_step(self, bounds: Bounds, cap: float) -> int | None:
        """The split with every stage within `cap` bytes, judged; its largest rank peak (None:
        no plan fits that cap, or the wall clock's safety net)."""
        self.job.deadline = self.deadline - ROOM_S
        try:
            split = self.job.with_policies(bounds, host_tier=bounds in self.copied, cap=cap)
            if split is None:
                return None
            cand = self.judged(split)
            self.offer(cand, "the split at less memory (monotone in memory)")
            if split.mixed and self.working():
                self.offer(self.judged(replace(split, mixed=False)),
                           "the split at less memory (monotone in memory)")
        except TimeUp:
            return None
        finally:
            self.charge()
        return max(cand.peaks) if cand.fits else None

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
               proxy: ProxyCosts, promising: Deadline) -> tuple[bool, float | None]:
    """Every split: first, until `promising` (as `deadline`), those the proxy finds fastest (memory
    included, planner.solvers.pipeline.proposals); then the rest, least busy-time bound first,
    skipped once its bound reaches the best step. Returns (all judged, the least all-keep step
    over every split)."""
    p = job.p
    splits = list(_splits(p.length, p.stage_count))
    judged: set[Bounds] = set()
    for bounds in sorted(splits, key=proxy.split_key):
        if time.perf_counter() > min(promising(), deadline()):
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

