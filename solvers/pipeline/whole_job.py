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
been tried, so the first plan does not wait behind splits that cannot hold one.

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
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from planner.core.pipeline_actions import Partition, PipelineStage, StageVariant, UnitPolicy
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.stage_costs import StageCosts, rank_peak_bytes
from planner.sim.stage_policies import StageFacts, stage_facts
from planner.solvers.pipeline.enumerate import makespan_ms
from planner.solvers.pipeline.problem import (
    Candidate,
    PartitionOutcome,
    PipelineProblem,
    Split,
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
from planner.solvers.pipeline.schedules import stage_rank
from planner.solvers.pipeline.stage_menu import (
    Item,
    StageChoice,
    TimeUp,
    choose,
    items,
    whole_stage,
)
from planner.solvers.pipeline.stage_mix import best_mix

ENUMERATE_LIMIT = 10000  # contiguous splits simulated one by one (cheapest bound first)
PROMISING_SHARE = 0.5  # of the time left, the splits the proxy finds fastest go first
ILP_SHARE = 0.25  # of the time left given to today's ILP (a candidate); 0.5 when the DP has none
DP_SHARE = 0.3  # of the time limit given to today's DP (the first candidate)
DP_SHARE_NO_ILP = 0.6  # with several stages a rank (no ILP candidate)
MOVES_SHARE = 0.8  # the DP's moves continue to this share of the limit (several stages a rank)
ROOM_SHARE = 0.2  # at most this share of the limit is kept clear for the last split judged
OVERRUN = 0.8  # the DP and the ILP may run past the limit they are given (their last steps)


@dataclass(frozen=True)
class PolicySplit(Split):
    """A split with, per stage, its non-keep modules' policies."""

    policies: tuple[tuple[tuple[str, UnitPolicy], ...], ...] = ()
    host_cap: int = 0  # the host bytes each stage's knapsack had (the pool, or an even share)
    op_level: bool = True  # the knapsacks had op-level options (else whole-module only)
    rerun: frozenset[int] = frozenset()  # stages recomputed whole in every micro-batch
    mixed: bool = False  # stages whose choice has a two-plan mix run it (StageChoice.mix)


class WholeJob:
    def __init__(self, problem: PipelineProblem) -> None:
        self.p = problem
        v = problem.stage_count // problem.ranks
        mem = problem.memory_bytes
        self.cap = math.inf if mem is None else mem / v  # a stage's share of its rank
        res = problem.resources
        host = res.host_memory_bytes if res is not None and res.has_host_tier else 0
        # each stage may first use the whole host pool; where the stages' plans together
        # overflow it, every stage gets an even share
        self.host_caps = (host or 0, (host or 0) // problem.stage_count)
        self.host_memory = host or 0
        self.exact = True  # every knapsack solved on an uncut frontier
        self.deadline: float | None = None  # once a plan exists: knapsacks stop (TimeUp) past it
        self.keep_time: dict[Bounds, float] = {}
        self.choices: dict[tuple[int, int, int, int, bool], StageChoice | None] = {}  # (i,
        # j, stage, host cap, op level) -> the stage's choice
        self.range_facts: dict[tuple[int, int], StageFacts] = {}
        # (i, j, W reruns, op level, host tier) -> the knapsack's module figures
        self.figures: dict[tuple[int, int, bool, bool, bool], list[Item]] = {}

    @classmethod
    def of(cls, problem: PipelineProblem) -> WholeJob:
        """The problem's whole-job caches, made on its first search."""
        if problem.whole_job is None:
            problem.whole_job = cls(problem)
        job: WholeJob = problem.whole_job
        return job

    @cached_property
    def proxy(self) -> ProxyCosts:
        """The split proposals' stage costs (made once per problem)."""
        return ProxyCosts(self.p, self.cap, self.facts)

    # -- one stage -------------------------------------------------------------------------------
    def choice(self, i: int, j: int, s: int, host_cap: int | None = None,
               op_level: bool = True) -> StageChoice | None:
        """Stage s = units [i, j): its fastest policies within its share of device memory and
        `host_cap` host bytes (None: the whole pool); None: none fit. Without `op_level`: only
        whole-module policies (the DP proposals' stage costs: at least the op-level ones)."""
        host_cap = self.host_caps[0] if host_cap is None else host_cap
        key = (i, j, s, host_cap, op_level)
        if key not in self.choices:
            base = self.p.costs(i, j, s)
            cheap = choose(self.p, None, base, self.p.inflight[s], self.cap, host_cap)
            if cheap is None:  # the all-keep stage does not fit: its module facts
                facts = self.facts(i, j)
                res = self.p.resources
                host = res is not None and res.has_host_tier and host_cap > 0
                reruns = self.p.plan_schedule.split_backward and not base.first_stage
                figures_key = (i, j, reruns, op_level, host)
                if figures_key not in self.figures:  # the same for every stage index
                    self.figures[figures_key] = items(self.p, facts, reruns, op_level, host,
                                                      self.deadline)
                cheap = choose(self.p, facts, base, self.p.inflight[s], self.cap, host_cap,
                               op_level, self.deadline, best_mix if op_level else None,
                               self.figures[figures_key])  # quick: one plan
                rerun = whole_stage(self.p, base, self.p.inflight[s], self.cap)
                if rerun is not None and (cheap is None or (rerun.added_ms, rerun.peak_bytes)
                                          < (cheap.mean_added_ms, cheap.peak_bytes)):
                    cheap = rerun
            if cheap is not None and not cheap.exact:
                self.exact = False
            self.choices[key] = cheap
        return self.choices[key]

    def facts(self, i: int, j: int) -> StageFacts:
        """Units [i, j) as one stage's module facts (made once per range)."""
        if (i, j) not in self.range_facts:
            chain = self.p.chain
            nodes = [v for v, u in chain.node_unit.items() if i <= u < j]
            self.range_facts[(i, j)] = stage_facts(self.p.graph, nodes, chain.modules(i, j))
        return self.range_facts[(i, j)]

    # -- one split -------------------------------------------------------------------------------
    def with_policies(self, bounds: Bounds, op_level: bool = True,
                      host_tier: bool = True) -> PolicySplit | None:
        """The split with each stage's choice (None: some stage fits none); without
        `host_tier`: choices that copy nothing to the host."""
        if self.p.candidate(Split(bounds), simulate=False).fits:
            return PolicySplit(bounds)  # all-keep fits its ranks' exact peaks: nothing is faster
        caps = self.host_caps if host_tier else (0,)
        for host_cap in dict.fromkeys(caps):  # the pool first, then even shares
            picks = [self.choice(i, j, s, host_cap, op_level) for s, (i, j) in enumerate(bounds)]
            if any(c is None for c in picks):
                return None  # an even share is smaller: nothing more fits
            on_host = sum(self.p.inflight[s] * c.host_bytes
                          for s, c in enumerate(picks) if c is not None)
            # the mixes' host bytes: each window's light and heavy micro-batches
            mixed = any(c is not None and c.mix is not None for c in picks) and sum(
                self.p.inflight[s] * c.host_bytes if c.mix is None else c.mix.window_host_bytes
                for s, c in enumerate(picks) if c is not None) <= self.host_memory
            if mixed or on_host <= self.host_memory:
                return PolicySplit(bounds, (), tuple(c.policies for c in picks if c is not None),
                                   host_cap, op_level, frozenset(
                                       s for s, c in enumerate(picks) if c and c.whole_stage),
                                   mixed)
        return None

    def candidate(self, split: PolicySplit) -> Candidate:
        p = self.p
        if not split.policies and not split.rerun:  # all-keep: the problem's own (shared)
            return p.candidate(Split(split.bounds))
        every = frozenset(range(p.microbatches))
        recompute = [every if s in split.rerun else frozenset() for s in range(p.stage_count)]
        stages = []
        costs: list[StageCosts] = []
        variant_costs: list[dict[int, StageCosts]] = []
        for s, (i, j) in enumerate(split.bounds):
            picked = self.choice(i, j, s, split.host_cap, split.op_level) \
                if split.policies and split.policies[s] else None
            mix = picked.mix if picked is not None and split.mixed else None
            own = mix.light if mix is not None else picked
            variants = []
            if mix is not None:
                heavy = mix.heavy_microbatches(p.microbatches)
                variants.append(StageVariant(microbatches=heavy, **_unit_plan(mix.heavy)))
                variant_costs.append(dict.fromkeys(heavy, mix.heavy.costs))
            else:
                variant_costs.append({})
            stages.append(PipelineStage(stage_index=s, rank=stage_rank(s, p.ranks),
                                        modules=p.chain.modules(i, j),
                                        recompute_microbatches=sorted(recompute[s]),
                                        variants=variants, **_unit_plan(own)))
            costs.append(own.costs if own is not None else p.costs(i, j, s))
        partition = Partition(stages=stages)
        # under zero-bubble a stage whose W reruns recomputed units may run B instead of I+W
        # (one rerun, W no longer deferred): both judged, the faster kept
        reruns = frozenset(s for s, (i, j) in enumerate(split.bounds) if p.plan_schedule.
                           split_backward and costs[s].backward_weight_ms
                           > p.costs(i, j, s).backward_weight_ms + 1e-9)
        best: Candidate | None = None
        for fused in dict.fromkeys((frozenset(), reruns)):
            cand = self._judged(split, partition, p.action_lists(Split(split.bounds), fused),
                                costs, recompute, variant_costs)
            if best is None or _faster(cand, best):
                best = cand
        assert best is not None
        return best

    def _judged(self, split: PolicySplit, partition: Partition, lists: list[list[Any]],
                costs: list[StageCosts], recompute: list[frozenset[int]],
                variant_costs: list[dict[int, StageCosts]]) -> Candidate:
        p = self.p
        peaks = rank_peak_bytes(lists, [stage_rank(s, p.ranks) for s in range(p.stage_count)],
                                costs, recompute, variant_sizes=variant_costs)
        fits = p.memory_bytes is None or max(peaks) <= p.memory_bytes
        sim = simulate_pipeline(p.graph, partition, lists, p.resources) if fits else None
        if sim is not None and sim.host_peak_bytes > self.host_memory:
            fits = False
        return Candidate(split, partition, lists, peaks, sim, fits)

    def keep_step_ms(self, bounds: Bounds) -> float:
        """The split's all-keep simulated step (memory aside): a bound on its every plan."""
        if bounds not in self.keep_time:
            cand = self.p.candidate(Split(bounds))
            assert cand.simulation is not None
            self.keep_time[bounds] = cand.simulation.makespan_ms
        return self.keep_time[bounds]

    def cheap_bound_ms(self, bounds: Bounds) -> float:
        """A rank's busy time over the step: no plan of this split is faster."""
        busy = [0.0] * self.p.ranks
        for s, (i, j) in enumerate(bounds):
            busy[stage_rank(s, self.p.ranks)] += self.p.costs(i, j, s).compute_ms
        return max(busy) * self.p.microbatches


def _unit_plan(choice: StageChoice | None) -> dict[str, Any]:
    """A stage choice's unit plan as PipelineStage / StageVariant fields."""
    if choice is None:
        return {}
    return {"unit_policies": dict(choice.policies),
            "unit_saved_ops": {m: list(ops) for m, ops in choice.saved_ops},
            "unit_offload_ops": {m: list(ops) for m, ops in choice.offload_ops}}


def whole_job_partition(problem: PipelineProblem, time_limit_s: float = 10.0,
                        threads: int = 2) -> PartitionOutcome:
    from planner.solvers.pipeline.baselines import BASELINES, baseline_split
    from planner.solvers.pipeline.dp import dp_partition, improve_by_moves, least_memory_split
    from planner.solvers.pipeline.ilp import ilp_partition

    start = time.perf_counter()
    deadline = start + time_limit_s
    job = WholeJob.of(problem)
    job.deadline = None
    notes: list[str] = []
    best: Candidate | None = None
    source = ""
    first_s: float | None = None  # when the first fitting plan was found

    fitting: dict[Bounds, float] = {}  # every split a plan fits: its fastest step (ms)

    def offer(cand: Candidate | None, name: str) -> None:
        nonlocal best, source, first_s
        if cand is None or not cand.fits or cand.simulation is None:
            return
        step = cand.simulation.makespan_ms
        fitting[cand.split.bounds] = min(step, fitting.get(cand.split.bounds, step))
        if best is None or simulated_key(cand) < simulated_key(best):
            best, source = cand, name
        if first_s is None:
            first_s = time.perf_counter() - start

    slowest_s = 0.0  # the longest one split's judgement took (kept clear of the deadline)
    sim_s = 0.0  # the longest one candidate's simulation took
    unfit: list[Bounds] = []  # splits no whole-module plan fits, not yet tried at op level
    late = False  # trying them now
    timed_out = False  # some split stayed unjudged (TimeUp)

    def judged(split: PolicySplit) -> Candidate:
        nonlocal sim_s
        began = time.perf_counter()
        cand = job.candidate(split)
        sim_s = max(sim_s, time.perf_counter() - began)
        return cand

    def try_bounds(bounds: Bounds, name: str) -> None:
        nonlocal slowest_s, timed_out
        began = time.perf_counter()
        if best is None and not late:  # anytime: whole-module knapsacks first (quicker)
            job.deadline = None
            quick = job.with_policies(bounds, op_level=False)
            if quick is None:  # op-level options seldom fit where whole modules do not:
                unfit.append(bounds)  # those wait until no split fits otherwise
                return
            offer(judged(quick), name)
        # once a plan exists, knapsacks stop in time for the split's two simulations
        job.deadline = start + time_limit_s - 2 * sim_s if best is not None else None
        try:
            split = job.with_policies(bounds)
        except TimeUp:  # a knapsack ran past the limit: this split stays unjudged
            timed_out = True
            return
        if split is not None:
            offer_both(split, name)
        slowest_s = max(slowest_s, time.perf_counter() - began)

    def try_without_host(bounds: Bounds) -> bool:
        """The split with plans that copy nothing; False: a knapsack ran past the limit."""
        job.deadline = start + time_limit_s - 2 * sim_s
        try:
            split = job.with_policies(bounds, host_tier=False)
        except TimeUp:
            return False
        if split is not None and (split.policies or split.rerun):
            offer_both(split, "the split's plans without host copies")
        return True

    def offer_both(split: PolicySplit, name: str) -> None:
        offer(judged(split), name)
        if split.mixed and (best is None or time.perf_counter() + sim_s < deadline):
            # a mix's mean stage time is not the step: its one plans too
            offer(judged(replace(split, mixed=False)), name)

    # several stages a rank: no ILP candidate, so the DP gets the ILP's share too
    dp_share = DP_SHARE if problem.stage_count == problem.ranks else DP_SHARE_NO_ILP
    dp = dp_partition(problem, time_limit_s=OVERRUN * dp_share * time_limit_s)
    offer(dp.best, "dp")
    seq_bounds = dp.best.split.bounds if dp.best is not None else \
        least_memory_split(problem)[1].bounds
    try_bounds(seq_bounds, "the DP's split with per-stage policies")
    for name in BASELINES:  # each as slow as the slowest so far: none started past the limit
        if best is not None and time.perf_counter() + slowest_s > deadline:
            break
        try_bounds(baseline_split(problem, name).bounds, f"the {name} split with policies")
    if dp.best is not None and problem.stage_count > problem.ranks:
        # the DP's boundary moves go on first (its simulations are shared), until MOVES_SHARE
        # of the time limit: with several stages a rank they find most of the faster splits
        moved, _ = improve_by_moves(problem, dp.best, start + MOVES_SHARE * time_limit_s)
        offer(moved, "the DP's split moved further")

    def closing() -> float:  # the limit less room for the last split judged (as slow as any)
        return deadline - min(slowest_s, ROOM_SHARE * time_limit_s)

    left_s = deadline - time.perf_counter()
    share = ILP_SHARE if dp.best is not None else 2 * ILP_SHARE
    if problem.stage_count > problem.ranks:  # interleaved: its model outgrows a short share
        notes.append("today's ILP not run (several stages a rank: its CP-SAT model does not "
                     "fit a share of the time limit)")
    elif time.perf_counter() > closing():  # building its model alone takes ~0.4 s at GPT-48
        notes.append("today's ILP not run (the candidates before it took the time limit)")
    else:
        ilp = ilp_partition(problem, time_limit_s=max(0.1, OVERRUN * share * left_s),
                            threads=threads)
        offer(ilp.best, "ilp")
        if ilp.best is not None and time.perf_counter() < closing():
            # its split with per-module policies, not whole-stage reruns
            try_bounds(ilp.best.split.bounds, "the ILP's split with per-stage policies")
    L, S = problem.length, problem.stage_count
    count = math.comb(L - 1, S - 1)
    fixed_lists = not problem.plan_schedule.split_backward
    complete = False
    bound: float | None = None

    proxy = job.proxy
    if count <= ENUMERATE_LIMIT:
        until = time.perf_counter() + PROMISING_SHARE * max(0.0, closing() - time.perf_counter())
        complete, bound = _enumerate(job, try_bounds, lambda: best, closing, proxy, until)
        notes.append(f"{count} contiguous splits " + ("all judged" if complete else
                                                     "partly judged (time limit)"))
    else:
        propose(problem, proxy, try_bounds, lambda: best, closing, lambda: fitting)
        notes.append(f"{count} contiguous splits: DP proposals and local moves")
    late = True  # the splits no whole-module plan fits, at op level (unless no faster)
    for bounds in dict.fromkeys(unfit):
        if time.perf_counter() > closing():
            complete = False
            break
        if best is None or job.keep_step_ms(bounds) < makespan_ms(best) - 1e-9:
            try_bounds(bounds, "op-level options")
    if best is not None and job.host_memory and time.perf_counter() < closing():
        _without_host(job, fitting, lambda: best, closing, try_without_host)
    complete = complete and not timed_out
    if dp.best is not None and not complete and time.perf_counter() < closing():
        # the time left continues the DP's own boundary moves from its split (no policies)
        moved, count_moves = improve_by_moves(problem, dp.best, closing())
        if count_moves:
            offer(moved, "the DP's split moved further")
    wall = time.perf_counter() - start
    if best is None:
        return PartitionOutcome("whole", None, "infeasible", wall_seconds=wall,
                                notes=notes + ["no split fits with any per-module policy"])
    assert best.simulation is not None
    step = best.simulation.makespan_ms
    proven = complete and fixed_lists and bound is not None and step <= bound + 1e-9
    if not job.exact:
        notes.append("some stage knapsacks were cut (frontier limit): not proven least")
    policies = sum(len(dict(ps)) for ps in getattr(best.split, "policies", ()))
    notes.insert(0, f"best from {source}; {policies} module(s) recompute or offload; first "
                    f"plan in {first_s or 0.0:.2f} s")
    return PartitionOutcome("whole", best, "optimal" if proven else "feasible",
                            objective=step, lower_bound=bound if fixed_lists else None,
                            wall_seconds=wall, notes=notes)


def _without_host(job: WholeJob, fitting: dict[Bounds, float], current: Callable[[], Candidate],
                  deadline: Deadline, judge: Callable[[Bounds], bool]) -> None:
    """With a host tier, the time left judges the splits that fit again with plans that copy
    nothing (`judge`; False: out of time), fastest first, while their all-keep bound is below
    the best step: a host tier's knapsacks are cut sooner (a larger frontier) and may miss the
    plan without one (GPT-24 on 2 ranks, 1F1B, 0.7x: 65.43 ms with a host tier, 65.29
    without, on the same split)."""
    for bounds in sorted(fitting, key=fitting.__getitem__):
        if time.perf_counter() > deadline():
            return
        if job.keep_step_ms(bounds) < makespan_ms(current()) - 1e-9 and not judge(bounds):
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


def _faster(a: Candidate, b: Candidate) -> bool:
    """Whether `a` beats `b`: fitting first, then the search's own order (simulated_key)."""
    if a.fits != b.fits:
        return a.fits
    return (a.simulation is not None and b.simulation is not None
            and simulated_key(a) < simulated_key(b))
