"""Two unit plans mixed over a stage's micro-batches (PipelineStage.variants): the partition's
checks, the simulator's per-micro-batch costs, the mixed peak bound, the whole-job planner's
mixes, and a host tier never making a stage's plan slower."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

import planner.solvers.pipeline.policy_splits as policy_splits
from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage, StageVariant
from planner.core.resources import Resources
from planner.engine.partition import make_problem
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.rank_memory import mixed_stage_peak_bytes, one_stage_peak_bytes
from planner.sim.result import PlanError
from planner.sim.stage_costs import StageCosts, rank_peak_bytes, stage_costs
from planner.sim.stage_policies import stage_facts, variant_unit_costs
from planner.solvers.pipeline import frontier, stage_menu
from planner.solvers.pipeline.dp import least_memory_split
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.stage_menu import StageChoice, variant_microbatches
from planner.solvers.pipeline.stage_mix import STAIR_POINTS, best_mix
from planner.solvers.pipeline.whole_job import whole_job_partition

HOST = Resources(host_memory_bytes=2**36, h2d="pcie-gen5-x16", d2h="pcie-gen5-x16",
                 device_count=2, microbatches=8)


@pytest.fixture(scope="module")
def op_gpt() -> Graph:
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    return trace(model, inputs).graph


def problem(g: Graph, level: float | None, ranks: int = 2, m: int = 8,
            resources: Resources | None = None) -> PipelineProblem:
    memory = None
    if level is not None:
        plain = make_problem(g, devices=ranks, memory_bytes=None, microbatches=m,
                             schedule="1f1b", resources=resources)
        memory = int(least_memory_split(plain)[0] * level)
    return make_problem(g, devices=ranks, memory_bytes=memory, microbatches=m,
                        schedule="1f1b", resources=resources)


@pytest.mark.parametrize("m", [8, 13])
def test_any_window_of_in_flight_micro_batches_holds_the_mix(m: int) -> None:
    for k in range(1, 9):
        for q in range(k + 1):
            heavy = set(variant_microbatches(m, k, q))
            for start in range(m):
                for length in range(1, k + 1):
                    window = range(start, min(m, start + length))
                    n = sum(j in heavy for j in window)
                    assert n <= q and len(window) - n <= k - q
                    if length == k and start + k <= m:
                        assert n == q


def test_variants_are_checked_in_one_line() -> None:
    def stage(*variants: StageVariant) -> Partition:
        return Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=["h.0", "h.1"],
                                               variants=list(variants))])

    with pytest.raises(ValueError, match=r"variants\[0\].unit_policies: 'h.9' is not one of"):
        stage(StageVariant(microbatches=[0], unit_policies={"h.9": "recompute"}))
    with pytest.raises(ValueError, match=r"variants\[1\].microbatches: 2 is negative or in an"):
        stage(StageVariant(microbatches=[2], unit_policies={"h.0": "recompute"}),
              StageVariant(microbatches=[2], unit_policies={"h.1": "recompute"}))
    with pytest.raises(ValueError, match=r"variants\[0\].unit_saved_ops: 'h.1' is not a "
                                         r"'recompute' module"):
        stage(StageVariant(microbatches=[0], unit_policies={"h.0": "recompute"},
                           unit_saved_ops={"h.1": ["aten.addmm#0"]}))


def _mixed(p: PipelineProblem, heavy: list[int]) -> tuple[Partition, Split]:
    """Stage 0 of the DP's split keeps in its own plan and recomputes every module in
    `heavy`."""
    cand = p.candidate(Split(((0, 3), (3, p.length))))
    first = cand.partition.stages[0]
    variants = [StageVariant(microbatches=heavy,
                             unit_policies=dict.fromkeys(first.modules, "recompute"))] \
        if heavy else []
    stages = [first.model_copy(update={"variants": variants}), *cand.partition.stages[1:]]
    return Partition(stages=stages), cand.split


def test_a_variant_micro_batch_runs_with_its_plans_costs(op_gpt: Graph) -> None:
    """The simulator charges each micro-batch its own plan: the peak changes with every
    recomputing micro-batch in the window (at dim 32 a rerun holds more than the module
    keeps), the step grows by their reruns, the list-order rule with the variants' sizes
    gives the same per-rank peaks, and the mix's bound holds over the rank's windows."""
    p = problem(op_gpt, None)
    lists = p.action_lists(Split(((0, 3), (3, p.length))))
    peaks, steps = [], []
    for q in (0, 1, 2):
        part, _ = _mixed(p, variant_microbatches(8, 2, q))
        sim = simulate_pipeline(op_gpt, part, lists)
        peaks.append(sim.per_rank_peak_bytes[0])
        steps.append(sim.compute_ms)  # busy time: every rerun counts
        costs = variant_unit_costs(op_gpt, part, stage_costs(op_gpt, part), None)
        own = [c.costs for c, _ in costs]
        sizes = [{mb: c.costs for mb, c in by.items()} for _, by in costs]
        assert rank_peak_bytes(lists, [0, 1], own, [frozenset()] * 2,
                               variant_sizes=sizes) == sim.per_rank_peak_bytes
        if q:  # the bound of the mix holds over the rank's real windows
            heavy = sizes[0][0]
            assert mixed_stage_peak_bytes(own[0], heavy, 2, q, 8) >= peaks[-1]
    assert peaks[1] != peaks[0]
    assert steps[0] < steps[1] < steps[2]
    part, _ = _mixed(p, [8])
    with pytest.raises(PlanError, match="stage 0's variants name micro-batch 8, but the rank "
                                        "actions run 8"):
        simulate_pipeline(op_gpt, part, lists)


def test_the_mixed_bound_is_the_one_plan_bound_without_a_variant(op_gpt: Graph) -> None:
    p = problem(op_gpt, None)
    part, _ = _mixed(p, [0])
    costs = variant_unit_costs(op_gpt, part, stage_costs(op_gpt, part), None)
    own, heavy = costs[0][0].costs, costs[0][1][0].costs
    for k in (1, 2, 4):
        assert mixed_stage_peak_bytes(own, heavy, k, 0, 8) == one_stage_peak_bytes(own, k, None, 8)
        assert mixed_stage_peak_bytes(heavy, own, k, k, 8) == one_stage_peak_bytes(own, k, None,
                                                                                   8)


def test_the_planner_mixes_where_that_is_faster(op_gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Below the plain least memory, stage 0 (two micro-batches in flight) recomputes in
    every other micro-batch only: the plan fits, its peaks are the simulator's, and it is
    faster than the best plan that runs one unit plan in every micro-batch."""
    # 0.88: with each checkpoint's RNG state charged (5,056 B on a CPU run) recomputing in
    # every other micro-batch pays at 0.88 of the plain least, no longer at 0.8-0.85
    p = problem(op_gpt, 0.88)
    got = whole_job_partition(p, time_limit_s=5, threads=1)
    cand = got.best
    assert cand is not None and cand.fits and p.memory_bytes is not None
    sim = simulate_pipeline(op_gpt, cand.partition, cand.rank_actions)
    assert sim.per_rank_peak_bytes == cand.peaks and max(cand.peaks) <= p.memory_bytes
    mixed = [s for s in cand.partition.stages if s.variants]
    assert mixed and mixed[0].variants[0].microbatches == [0, 2, 4, 6]
    monkeypatch.setattr(policy_splits, "best_mix", lambda *args, **kwargs: None)
    one = whole_job_partition(problem(op_gpt, 0.88), time_limit_s=5, threads=1)
    assert one.best is not None and not any(s.variants for s in one.best.partition.stages)
    assert sim.makespan_ms < one.best.simulation.makespan_ms


@pytest.mark.parametrize("limit", [
    # known gap (issue 47's session): cut to 8 states, the host tier's frontier loses the
    # plan without copies at 0.9 of the plain least, stage 1 of a cut at 4 (0.417 against
    # 0.367 ms); found once each checkpoint's RNG state was charged
    pytest.param(8, marks=pytest.mark.xfail(strict=True, reason="host frontier cut to 8")),
    12, 20])
def test_a_host_tier_never_makes_a_stage_plan_slower(op_gpt: Graph, monkeypatch,  # type: ignore[no-untyped-def]
                                                     limit: int) -> None:
    """With a host tier the knapsack's frontier is larger and is cut sooner, by a time that
    underestimates queued copies; the plans that offload nothing survive the cut, so a stage's
    plan is never slower than the one chosen without a host tier (same frontier limits)."""
    monkeypatch.setattr(stage_menu, "FRONTIER_WORK", limit)
    monkeypatch.setattr(stage_menu, "HOST_FRONTIER_WORK", limit)
    monkeypatch.setattr(stage_menu, "FRONTIER_LIMITS", (limit, limit))
    monkeypatch.setattr(stage_menu, "HOST_FRONTIER_MOST", limit)
    compared = 0
    for level, cut in itertools.product((0.95, 0.9, 0.85, 0.8, 0.7, 0.5), (2, 3, 4)):
        with_host = problem(op_gpt, level, resources=HOST)
        without = problem(op_gpt, level)
        for s, (i, j) in enumerate(((0, cut), (cut, with_host.length))):
            chain = with_host.chain
            nodes = [v for v, u in chain.node_unit.items() if i <= u < j]
            facts = stage_facts(op_gpt, nodes, chain.modules(i, j))
            picks = [stage_menu.choose(p, facts, p.costs(i, j, s), p.inflight[s],
                                       p.memory_bytes or 0, 2**36)
                     for p in (with_host, without)]
            if picks[1] is None or not picks[1].policies:
                continue
            assert picks[0] is not None and picks[0].added_ms <= picks[1].added_ms + 1e-9
            compared += 1
    assert compared >= 4


def _sqrt_staircase(op_gpt: Graph) -> list[tuple[frontier.State, StageCosts]]:
    """200 plans of the whole GPT as one stage: each 10 bytes more than the last, its time
    falling as a square root (so the best mix need not sit at spread points)."""
    base = stage_costs(op_gpt, Partition(stages=[PipelineStage(
        stage_index=0, rank=0, modules=["tok", "pos", "h.0", "h.1", "h.2", "h.3", "ln_f",
                                        "head"])]))[0]
    return [(frontier.State(10 * i, 0, 0, 200.0 - 20 * math.sqrt(i), ()),
             replace(base, saved_bytes=base.saved_bytes + 10 * i)) for i in range(200)]


def test_the_mix_search_finds_the_best_pair_of_a_long_staircase(op_gpt: Graph) -> None:
    """A 200-plan staircase (each plan 10 bytes more than the last, time falling as a square
    root): the mix found is as fast as the best of every pair and slot count, though the first
    search tries only spread light plans (alone it finds 154.40 ms, not 153.14)."""
    p, k = problem(op_gpt, None, ranks=4), 4
    plans = _sqrt_staircase(op_gpt)
    assert len(plans) > STAIR_POINTS
    peak = {i: one_stage_peak_bytes(c, k, None, 8) for i, (_, c) in enumerate(plans)}
    cap = peak[0] + 222  # the best light plan lies between spread ones
    fits_alone = max(i for i in peak if peak[i] <= cap)
    uniform = StageChoice((), plans[fits_alone][1], 0, plans[fits_alone][0].ms,
                          peak[fits_alone], True)
    by_state = {id(st): (st, c) for st, c in plans}

    def exact_of(st: frontier.State) -> StageChoice:
        costs = by_state[id(st)][1]
        return StageChoice((), costs, 0, st.ms, one_stage_peak_bytes(costs, k, None, 8), True)

    found = best_mix(p, k, cap, 0, uniform, plans, exact_of)
    best = min(((8 - len(variant_microbatches(8, k, q))) * plans[a][0].ms
                + len(variant_microbatches(8, k, q)) * plans[b][0].ms) / 8
               for q in range(1, k) for a in range(200) for b in range(a)
               if mixed_stage_peak_bytes(plans[a][1], plans[b][1], k, q, 8) <= cap)
    assert found is not None and best < uniform.added_ms
    assert found.added_ms == pytest.approx(best)


def test_a_host_tier_does_not_hide_the_mixes_that_offload_nothing(op_gpt: Graph) -> None:
    """Offloading plans a little smaller and faster than each local one by the estimates fill
    the staircase, and the rule finds them slow (queued copies): the mix of two local plans is
    found all the same, as fast as without the offloading plans."""
    p, k = problem(op_gpt, None, ranks=4), 4
    local = _sqrt_staircase(op_gpt)
    offloading = [(frontier.State(10 * i - 5, 1000, 0, st.ms - 0.5, ()),
                   replace(c, saved_bytes=c.saved_bytes - 5)) for i, (st, c) in enumerate(local)]
    cap = one_stage_peak_bytes(local[0][1], k, None, 8) + 222
    fits_alone = max(i for i, (_, c) in enumerate(local)
                     if one_stage_peak_bytes(c, k, None, 8) <= cap)
    uniform = StageChoice((), local[fits_alone][1], 0, local[fits_alone][0].ms,
                          one_stage_peak_bytes(local[fits_alone][1], k, None, 8), True)
    by_state = {id(st): (st, c) for st, c in local + offloading}

    def exact_of(st: frontier.State) -> StageChoice:
        costs = by_state[id(st)][1]
        slow = 100.0 if st.offload_bytes else 0.0  # the copies queue on the link
        return StageChoice((), costs, st.offload_bytes, st.ms + slow,
                           one_stage_peak_bytes(costs, k, None, 8), True)

    alone = best_mix(p, k, cap, 2**36, uniform, local, exact_of)
    found = best_mix(p, k, cap, 2**36, uniform, local + offloading, exact_of)
    assert alone is not None and found is not None
    assert found.added_ms == pytest.approx(alone.added_ms)
