"""A split with each stage's policies: the whole-job search's stage choices and candidates.

`WholeJob` keeps, per problem, each stage's choice (planner.solvers.pipeline.stage_menu: the
least-time policies that fit the stage's share of its rank under the schedule's in-flight count,
with a two-plan mix where faster, or the whole stage rerun), turns a contiguous split into a
`PolicySplit` (every stage's choice; host memory: the pool first, then an even share), and
judges it as a `Candidate` with the simulator's per-rank peaks and step. The search over splits
is planner.solvers.pipeline.whole_job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from planner.core.pipeline_actions import Partition, PipelineStage, StageVariant, UnitPolicy
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.stage_costs import StageCosts, one_stage_peak_bytes, rank_peak_bytes
from planner.sim.stage_policies import StageFacts, stage_facts
from planner.solvers.pipeline.problem import Candidate, PipelineProblem, Split, simulated_key
from planner.solvers.pipeline.proposals import Bounds, ProxyCosts
from planner.solvers.pipeline.schedules import stage_rank
from planner.solvers.pipeline.stage_items import Item, items
from planner.solvers.pipeline.stage_menu import StageChoice, choose, whole_stage
from planner.solvers.pipeline.stage_mix import best_mix


@dataclass(frozen=True)
class PolicySplit(Split):
    """A split with, per stage, its non-keep modules' policies."""

    policies: tuple[tuple[tuple[str, UnitPolicy], ...], ...] = ()
    host_cap: int = 0  # the host bytes each stage's knapsack had (the pool, or an even share)
    op_level: bool = True  # the knapsacks had op-level options (else whole-module only)
    rerun: frozenset[int] = frozenset()  # stages recomputed whole in every micro-batch
    mixed: bool = False  # stages whose choice has a two-plan mix run it (StageChoice.mix)
    fused: frozenset[int] = frozenset()  # zero-bubble stages planned to run one B a micro-batch
    cap: float | None = None  # each stage's device bytes when below its share (the search's
    # walk down a split's memory staircase, whole_job); None: the share


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
        self.choices: dict[tuple[int, int, int, int, bool, bool, float],
                           StageChoice | None] = {}
        # (i, j, stage, host cap, op level, I and W fused, device cap) -> the stage's choice
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

    @cached_property
    def fused_rules(self) -> PipelineProblem:
        """The problem under one full backward a micro-batch (1F1B's memory and time rules):
        a zero-bubble stage that runs B instead of I and W (PolicySplit.fused) is planned by
        them, at the schedule's own in-flight count."""
        return replace(self.p, schedule="1f1b")

    # -- one stage -------------------------------------------------------------------------------
    def choice(self, i: int, j: int, s: int, host_cap: int | None = None,
               op_level: bool = True, fused: bool = False,
               cap: float | None = None) -> StageChoice | None:
        """Stage s = units [i, j): its fastest policies within its share of device memory and
        `host_cap` host bytes (None: the whole pool); None: none fit. Without `op_level`: only
        whole-module policies (the DP proposals' stage costs: at least the op-level ones).
        `fused`: the stage runs one B a micro-batch under a zero-bubble schedule. `cap`: the
        stage's device bytes when below its share (None: the share)."""
        host_cap = self.host_caps[0] if host_cap is None else host_cap
        cap = self.cap if cap is None else min(cap, self.cap)
        key = (i, j, s, host_cap, op_level, fused, cap)
        if key not in self.choices:
            rules = self.fused_rules if fused else self.p
            base = self.p.costs(i, j, s)
            inflight = self.p.inflight[s]
            cheap = choose(rules, None, base, inflight, cap, host_cap)
            if cheap is None:  # the all-keep stage does not fit: its module facts
                facts = self.facts(i, j)
                res = self.p.resources
                host = res is not None and res.has_host_tier and host_cap > 0
                reruns = rules.plan_schedule.split_backward and not base.first_stage
                figures_key = (i, j, reruns, op_level, host)
                if figures_key not in self.figures:  # the same for every stage index
                    self.figures[figures_key] = items(self.p, facts, reruns, op_level, host,
                                                      self.deadline)
                cheap = choose(rules, facts, base, inflight, cap, host_cap,
                               op_level, self.deadline, best_mix if op_level else None,
                               self.figures[figures_key])  # quick: one plan
                rerun = whole_stage(rules, base, inflight, cap)
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
    def with_policies(self, bounds: Bounds, op_level: bool = True, host_tier: bool = True,
                      fused: frozenset[int] = frozenset(),
                      cap: float | None = None) -> PolicySplit | None:
        """The split with each stage's choice (None: some stage fits none); without
        `host_tier`: choices that copy nothing to the host; `fused`: zero-bubble stages
        planned to run one B a micro-batch (`fused_for_memory`); `cap`: each stage's device
        bytes when below its share (the plan the search finds at a smaller device memory)."""
        if cap is None and self.p.candidate(Split(bounds), simulate=False).fits:
            return PolicySplit(bounds)  # all-keep fits its ranks' exact peaks: nothing is faster
        caps = self.host_caps if host_tier else (0,)
        for host_cap in dict.fromkeys(caps):  # the pool first, then even shares
            picks = [self.choice(i, j, s, host_cap, op_level, s in fused, cap)
                     for s, (i, j) in enumerate(bounds)]
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
                                   mixed, fused, cap)
        return None

    def candidate(self, split: PolicySplit) -> Candidate:
        p = self.p
        if not (split.policies or split.rerun or split.fused):  # all-keep: the problem's own
            return p.candidate(Split(split.bounds))
        every = frozenset(range(p.microbatches))
        recompute = [every if s in split.rerun else frozenset() for s in range(p.stage_count)]
        stages = []
        costs: list[StageCosts] = []
        variant_costs: list[dict[int, StageCosts]] = []
        for s, (i, j) in enumerate(split.bounds):
            picked = self.choice(i, j, s, split.host_cap, split.op_level, s in split.fused,
                                 split.cap) if split.policies and split.policies[s] else None
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
        for fused in dict.fromkeys((split.fused, split.fused | reruns)):
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

    def fused_for_memory(self, bounds: Bounds) -> frozenset[int]:
        """Under zero-bubble, the stages whose all-keep peak is over their share but lower
        with one B a micro-batch: a W deferred into the bubbles holds its micro-batch's tensors,
        so fusing I and W can free more than recomputation would (GPT-24 on 2 ranks, ZB-H1:
        the last stage's all-keep peak 1.17x the memory with I and W, 0.89x fused)."""
        if not self.p.plan_schedule.split_backward:
            return frozenset()
        m = self.p.microbatches
        fused = set()
        for s, (i, j) in enumerate(bounds):
            base, k = self.p.costs(i, j, s), self.p.inflight[s]
            split_peak = one_stage_peak_bytes(base, k, microbatches=m, split_backward=True)
            if split_peak > self.cap and one_stage_peak_bytes(
                    base, k, microbatches=m, split_backward=False) < split_peak:
                fused.add(s)
        return frozenset(fused)

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



def _faster(a: Candidate, b: Candidate) -> bool:
    """Whether `a` beats `b`: fitting first, then the search's own order (simulated_key)."""
    if a.fits != b.fits:
        return a.fits
    return (a.simulation is not None and b.simulation is not None
            and simulated_key(a) < simulated_key(b))

