"""The partitioning problem and how a candidate split is built, measured and simulated.

A `Split` is the stage boundaries over the unit chain plus, per stage, how many of its
in-flight micro-batches keep their activations (`stored`; fewer than in flight: the others are
recomputed in the backward, micro-batches mb with mb mod in-flight >= stored, so any window of
in-flight micro-batches holds exactly `stored` full sets). `PipelineProblem.build` turns a split
into a Partition and the schedule's per-rank action lists (zero-bubble lists are generated on
the split's own stage times); `simulate` judges it with planner.sim.pipeline_ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineAction, PipelineOp, PipelineStage
from planner.core.resources import Resources
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.result import SimulationResult
from planner.sim.stage_costs import one_stage_peak_bytes, rank_peak_bytes
from planner.solvers.pipeline.schedules import (
    Schedule,
    StageTimes,
    schedule_class,
    stage_rank,
)
from planner.solvers.pipeline.units import RangeCosts, UnitChain


@dataclass(frozen=True)
class Split:
    bounds: tuple[tuple[int, int], ...]  # (first unit, end unit) per stage
    stored: tuple[int | None, ...] = ()  # per stage: micro-batches kept in full; None: all

    def stored_of(self, stage_index: int) -> int | None:
        return self.stored[stage_index] if self.stored else None


@dataclass(frozen=True)
class Candidate:
    """A split with its partition, action lists, exact per-rank peaks and simulation."""

    split: Split
    partition: Partition
    rank_actions: list[list[PipelineAction]]
    peaks: list[int]
    simulation: SimulationResult | None  # None: not simulated (does not fit)
    fits: bool


@dataclass
class PipelineProblem:
    graph: Graph
    chain: UnitChain
    ranks: int
    microbatches: int
    schedule: str
    memory_bytes: int | None  # per device; None: unbounded
    chunks: int = 2  # stages per rank, interleaved schedules only
    resources: Resources | None = None
    notes: list[str] = field(default_factory=list)
    # action lists by recomputed micro-batches, for schedules whose lists ignore stage times
    _lists: dict[tuple[frozenset[int], ...], list[list[PipelineAction]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    # the whole-job search's caches (its WholeJob: knapsacks, module figures, proxy costs),
    # kept so a second search of this problem (job choice's second round) goes on from them
    whole_job: Any = field(default=None, init=False, repr=False, compare=False)
    # simulated steps by split: the DP, the ILP and the whole-job search share them
    _simulations: dict[tuple[tuple[tuple[int, int], ...], tuple[int | None, ...]],
                       SimulationResult] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def stage_count(self) -> int:
        return self.ranks * schedule_class(self.schedule).stages_per_rank(self.chunks)

    @cached_property
    def plan_schedule(self) -> Schedule:
        """The schedule these numbers run (checked: InputError naming the field)."""
        return schedule_class(self.schedule)(self.ranks, self.microbatches, self.chunks)

    @property
    def length(self) -> int:
        return self.chain.length

    @cached_property
    def inflight(self) -> list[int]:
        """Per stage, the micro-batches holding activations at most under the schedule."""
        return self.plan_schedule.inflight_per_stage()

    # -- one stage ------------------------------------------------------------------------------
    def costs(self, first: int, end: int, stage_index: int) -> RangeCosts:
        return self.chain.range_costs(first, end, stage_index, self.stage_count)

    def transfer_ms(self, nbytes: int) -> float:
        link = self.resources.device_link if self.resources is not None else None
        return 0.0 if link is None or nbytes == 0 else link.transfer_ms(nbytes)

    def recomputed(self, stage_index: int, stored: int | None) -> frozenset[int]:
        k = self.inflight[stage_index]
        if stored is None or stored >= k:
            return frozenset()
        return frozenset(mb for mb in range(self.microbatches) if mb % k >= stored)

    def stage_memory(self, c: RangeCosts, stage_index: int, stored: int | None = None) -> int:
        """Peak of a rank running this stage alone over the step's micro-batches (with one
        stage a rank: the exact peak under GPipe and 1F1B; under zero-bubble lists exact where
        each W follows its I, as in ZB-H1's lists, and possibly below it where a rank holds
        several I's pending gradients; an upper bound with recomputation, whose rematerialised
        bytes are counted once on top). The exact figure is `peaks`."""
        return one_stage_peak_bytes(c, self.inflight[stage_index], stored, self.microbatches,
                                    self.plan_schedule.split_backward)

    def stage_time(self, c: RangeCosts, stage_index: int, stored: int | None = None) -> float:
        """Average busy time per micro-batch, plus the transfers of its boundaries: the
        partitioners' proxy (recomputed forwards averaged over the micro-batches), not a
        simulator rule; the simulator times each action on its own."""
        again = len(self.recomputed(stage_index, stored)) / self.microbatches
        return (c.compute_ms + again * c.forward_ms + self.transfer_ms(c.send_forward_bytes)
                + self.transfer_ms(c.send_backward_bytes))

    # -- a whole split --------------------------------------------------------------------------
    def partition(self, split: Split) -> Partition:
        stages = []
        for s, (i, j) in enumerate(split.bounds):
            stages.append(PipelineStage(
                stage_index=s, rank=stage_rank(s, self.ranks), modules=self.chain.modules(i, j),
                recompute_microbatches=sorted(self.recomputed(s, split.stored_of(s))),
            ))
        return Partition(stages=stages)

    def action_lists(self, split: Split,
                     fused: frozenset[int] = frozenset()) -> list[list[PipelineAction]]:
        """The split's rank lists; under zero-bubble, the stages in `fused` run one full
        backward (B) per micro-batch instead of I and W (a recomputed unit then reruns once,
        not for I and again for W)."""
        times = None
        if self.plan_schedule.split_backward:  # list-scheduled on the split's own stage times
            times = []
            for s, (i, j) in enumerate(split.bounds):
                c = self.costs(i, j, s)
                # the recomputed forwards averaged over the micro-batches, as in stage_time
                again = len(self.recomputed(s, split.stored_of(s))) / self.microbatches
                weight_ms = c.backward_weight_ms + (0.0 if c.first_stage else again * c.forward_ms)
                times.append(StageTimes(
                    forward_ms=c.forward_ms,
                    backward_input_ms=c.backward_input_ms + again * c.forward_ms
                    + (weight_ms if s in fused else 0.0),
                    backward_weight_ms=0.0 if s in fused else weight_ms,
                    send_forward_ms=self.transfer_ms(c.send_forward_bytes),
                    send_backward_ms=self.transfer_ms(c.send_backward_bytes),
                ))
        recompute = [self.recomputed(s, split.stored_of(s)) for s in range(self.stage_count)]
        if times is not None:
            every = frozenset(range(self.microbatches))  # a fused stage's W right after its I
            order = [every if s in fused else r for s, r in enumerate(recompute)]
            return fuse_backward(self.plan_schedule.rank_actions(times, order), fused)
        key = tuple(recompute)  # the same lists for every split: built once (enumeration)
        if key not in self._lists:
            self._lists[key] = self.plan_schedule.rank_actions(None, recompute)
        return [list(row) for row in self._lists[key]]

    def peaks(self, split: Split, lists: Sequence[Sequence[PipelineAction]]) -> list[int]:
        """Each rank's exact peak, by the simulator's memory rules (list order alone)."""
        return rank_peak_bytes(
            lists,
            [stage_rank(s, self.ranks) for s in range(self.stage_count)],
            [self.costs(i, j, s) for s, (i, j) in enumerate(split.bounds)],
            [self.recomputed(s, split.stored_of(s)) for s in range(self.stage_count)],
        )

    def candidate(self, split: Split, simulate: bool = True) -> Candidate:
        partition = self.partition(split)
        lists = self.action_lists(split)
        peaks = self.peaks(split, lists)
        fits = self.memory_bytes is None or max(peaks) <= self.memory_bytes
        cand = Candidate(split, partition, lists, peaks, None, fits)
        return self.simulated(cand) if simulate else cand

    def simulated(self, cand: Candidate) -> Candidate:
        """`cand` (built with simulate=False) with its simulation, without rebuilding its lists;
        a split simulated before is not simulated again."""
        key = (cand.split.bounds, cand.split.stored)
        sim = self._simulations.get(key)
        if sim is None:
            sim = self._simulations[key] = simulate_pipeline(
                self.graph, cand.partition, cand.rank_actions, self.resources)
        return replace(cand, simulation=sim)

    def best_simulated(self, splits: Sequence[Split]) -> Candidate | None:
        """The fitting split with the least simulated step time (ties: lower peak)."""
        best: Candidate | None = None
        seen: set[Split] = set()
        for split in splits:
            if split in seen:
                continue
            seen.add(split)
            cand = self.candidate(split, simulate=False)
            if not cand.fits:
                continue
            cand = self.simulated(cand)  # the lists already built are not rebuilt
            if best is None or simulated_key(cand) < simulated_key(best):
                best = cand
        return best


def simulated_key(c: Candidate) -> tuple[float, int]:
    """What orders simulated candidates: the step (to 1e-9 ms), then the largest rank peak."""
    assert c.simulation is not None
    return (round(c.simulation.makespan_ms, 9), max(c.peaks))


@dataclass(frozen=True)
class PartitionOutcome:
    """What a partitioner hands back (the engine builds the plan and judges it)."""

    method: str
    best: Candidate | None
    status: str  # optimal (proven fastest simulated step) / feasible / infeasible / timeout
    objective: float | None = None  # the simulated step time (ms) of `best`
    lower_bound: float | None = None  # a proven bound on the simulated step time; None: none
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    backend: str = "none"
    proxy_objective: float | None = None  # a model's own step-time proxy (ILP), not simulated
    proxy_bound: float | None = None  # the solver's bound on that proxy only


def fuse_backward(lists: list[list[PipelineAction]],
                  fused: frozenset[int]) -> list[list[PipelineAction]]:
    """Each I of a stage in `fused` as a full backward (B), its W (right after it) dropped."""
    if not fused:
        return lists
    out = []
    for row in lists:
        new = []
        for a in row:
            if a.stage_index in fused and a.op is PipelineOp.backward_weight:
                continue
            if a.stage_index in fused and a.op is PipelineOp.backward_input:
                a = PipelineAction(stage_index=a.stage_index, op=PipelineOp.backward,
                                   microbatch_index=a.microbatch_index)
            new.append(a)
        out.append(new)
    return out
