"""Whole-job planning: split + per-stage remat/offload (planner.sim.stage_policies,
planner.solvers.pipeline.{stage_menu,whole_job}) against dp and ilp, and the simulator's rules."""

from __future__ import annotations

import itertools

import pytest

import planner.sim.pipeline_ranks as pipeline_ranks
import planner.solvers.pipeline.policy_splits as policy_splits
import planner.solvers.pipeline.whole_job as whole_job
from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage
from planner.core.resources import Link, Resources
from planner.engine.partition import make_problem, partition_plan
from planner.sim.ledger import MemoryLedger
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.result import PlanError
from planner.sim.stage_costs import StageCosts, stage_costs, stage_of_nodes
from planner.sim.stage_policies import (
    PolicyCosts,
    StageFacts,
    apply_unit_policies,
    policy_stage_costs,
    stage_facts,
)
from planner.sim.unit_times import copies_ms
from planner.solvers.pipeline import stage_items, stage_menu
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.pipeline.dp import dp_partition, least_memory_split
from planner.solvers.pipeline.ilp import ilp_partition
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.whole_job import whole_job_partition

# a host link fast enough that copying some modules beats recomputing them (Grace Hopper)
HOST = Resources(host_memory_bytes=2**36, h2d="nvlink-c2c", device_count=4, microbatches=8)
# PCIe Gen5: copies cost more than most reruns
PCIE_HOST = Resources(host_memory_bytes=2**36, h2d="pcie-gen5-x16", device_count=4, microbatches=8)


@pytest.fixture(scope="module")
def gpt() -> Graph:
    """A GPT-8 as module-level chain figures (torch-free; slow compute, so copies can hide)."""
    return chain_graph(transformer_layers(8, 1024, 16, 32000, 512, 2, tflops=10),
                       optimizer="adam")


@pytest.fixture(scope="module")
def op_gpt() -> Graph:
    """A small traced GPT at op level (module paths 'h.3.attn.qkv')."""
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    return trace(model, inputs).graph


def problem(g: Graph, memory: int | None, resources: Resources | None = None,
            schedule: str = "1f1b", ranks: int = 4, m: int = 8) -> PipelineProblem:
    return make_problem(g, devices=ranks, memory_bytes=memory, microbatches=m,
                        schedule=schedule, resources=resources)


def plain_least(g: Graph, resources: Resources | None = None, schedule: str = "1f1b") -> int:
    return least_memory_split(problem(g, None, resources, schedule))[0]


def check_plan(p: PipelineProblem, got) -> float:  # type: ignore[no-untyped-def]
    """The plan fits every rank, and its peaks are the simulator's; returns its step ms."""
    cand = got.best
    assert cand is not None and cand.fits
    assert p.memory_bytes is None or max(cand.peaks) <= p.memory_bytes
    sim = simulate_pipeline(p.graph, cand.partition, cand.rank_actions, p.resources)
    assert sim.per_rank_peak_bytes == cand.peaks
    assert sim.makespan_ms == pytest.approx(cand.simulation.makespan_ms)
    return sim.makespan_ms


# -- the simulator's rules ---------------------------------------------------------------------
def test_no_unit_policies_simulate_as_before(gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p = problem(gpt, None)
    for bounds in [((0, 2), (2, 5), (5, 8), (8, 10)), ((0, 3), (3, 6), (6, 8), (8, 10))]:
        cand = p.candidate(Split(bounds))
        with_keep = Partition(stages=[s.model_copy(update={"unit_policies": dict.fromkeys(
            s.modules, "keep")}) for s in cand.partition.stages])
        costs = stage_costs(gpt, cand.partition)
        assert [c.costs for c in apply_unit_policies(gpt, with_keep, costs, None)] == costs
        monkeypatch.setattr(pipeline_ranks, "variant_unit_costs",
                            lambda g, part, c, r: [(PolicyCosts(x, 0), {}) for x in c])
        before = simulate_pipeline(gpt, cand.partition, cand.rank_actions)
        monkeypatch.undo()
        assert simulate_pipeline(gpt, cand.partition, cand.rank_actions) == before
        assert simulate_pipeline(gpt, with_keep, cand.rank_actions) == before


def test_recompute_and_offload_change_what_the_rules_say(gpt: Graph) -> None:
    p = problem(gpt, None, HOST)
    cand = p.candidate(Split(((0, 3), (3, 6), (6, 8), (8, 10))))
    stage = cand.partition.stages[1]
    base = stage_costs(gpt, cand.partition)[1]

    def stage1(policies: dict) -> PolicyCosts:  # type: ignore[type-arg]
        part = Partition(stages=[s.model_copy(update={"unit_policies": policies})
                                 if s.stage_index == 1 else s for s in cand.partition.stages])
        return apply_unit_policies(gpt, part, stage_costs(gpt, part), HOST)[1]

    unit = stage.modules[1]
    rec = stage1({unit: "recompute"})
    forward_of_unit = next(n.compute_ms for n in gpt.nodes if n.name == unit)
    assert rec.costs.backward_ms == pytest.approx(base.backward_ms + forward_of_unit)
    assert rec.costs.saved_bytes < base.saved_bytes and rec.host_bytes == 0
    off = stage1({unit: "offload"})
    assert off.costs.saved_bytes < base.saved_bytes and off.host_bytes > 0
    assert off.costs.forward_ms >= base.forward_ms
    with pytest.raises(PlanError, match="host tier"):
        part = Partition(stages=[s.model_copy(update={"unit_policies": {unit: "offload"}})
                                 if s.stage_index == 1 else s for s in cand.partition.stages])
        apply_unit_policies(gpt, part, stage_costs(gpt, part), None)


def _op_stage(op_gpt: Graph, s: int) -> tuple[Partition, StageFacts, StageCosts]:
    """Stage s of a 2-stage split of the op-level GPT (h.0, h.1 | h.2, h.3, ln_f, head)."""
    mods = [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]]
    part = Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(mods)])
    nodes = [v for v, i in stage_of_nodes(op_gpt, part).items() if i == s]
    return part, stage_facts(op_gpt, nodes, mods[s]), stage_costs(op_gpt, part)[s]


@pytest.mark.parametrize("s", [0, 1])
def test_the_menus_additive_figures_bound_the_simulators_rule(op_gpt: Graph, s: int) -> None:
    """For every policy choice of a stage's blocks (selective checkpoints and partial offloads
    included): the knapsack's saved and transient bytes are at least the simulator's, its host
    bytes equal them (so what it accepts fits)."""
    _, facts, base = _op_stage(op_gpt, s)
    p = problem(op_gpt, None, HOST, ranks=2)
    figures = stage_items.items(p, facts)
    forward = stage_items.forward_bytes(p, facts)
    blocks = [i for i, u in enumerate(facts.units) if u.name.startswith("h.")]
    menus = [("keep", "recompute", "offload", *(f"op{k}" for k in range(len(figures[i].ops))))
             for i in blocks]
    kinds = {o.policy for i in blocks for o in figures[i].ops}
    assert kinds == {"recompute", "offload"}  # selective checkpoints and partial offloads
    for picked in itertools.product(*menus):
        choice = ["keep"] * len(facts.units)
        for i, policy in zip(blocks, picked, strict=True):
            choice[i] = policy
        st = stage_menu.additive_state(figures, tuple(choice))
        policies, saved_ops, offload_ops = stage_menu._policies(figures, tuple(choice))
        exact = policy_stage_costs(op_gpt, facts, base, dict(policies), HOST, dict(saved_ops),
                                   dict(offload_ops))
        bound = stage_menu.bound_costs(base, forward, st)
        assert bound.saved_bytes >= exact.costs.saved_bytes, picked
        assert bound.transient_bytes >= exact.costs.transient_bytes, picked
        assert st.offload_bytes == exact.host_bytes, picked


def test_a_recomputed_unit_keeps_its_inputs_unless_torch_buffers_them(op_gpt: Graph) -> None:
    """Stage 1's first block reads the received tensor (in torch's receive buffer: nothing
    more to keep), the second the first's output (kept while the checkpoint holds it); sent
    outputs and the loss stay whatever the policies; host copies: one per saving edge (a
    root saved by two backward nodes is copied twice)."""
    _, facts, base = _op_stage(op_gpt, 1)
    size = MemoryLedger.of(op_gpt).storage_bytes
    h2, h3 = facts.units[0], facts.units[1]
    first = policy_stage_costs(op_gpt, facts, base, {"h.2": "recompute"}, HOST).costs
    second = policy_stage_costs(op_gpt, facts, base, {"h.3": "recompute"}, HOST).costs
    others = facts.held | h3.saved | facts.units[2].saved | facts.units[3].saved
    # a checkpoint call keeps its RNG state too (CPU run: stage_costs.checkpoint_state_bytes)
    assert base.checkpoint_bytes == 5056
    assert first.saved_bytes == base.saved_bytes + base.checkpoint_bytes - sum(
        size[r] for r in h2.saved - others - facts.rest_saved)
    (made_input,) = h3.inputs
    assert second.saved_bytes == base.saved_bytes + base.checkpoint_bytes - sum(
        size[r] for r in h3.saved - {made_input} - facts.units[2].saved - facts.held
        - facts.rest_saved)
    every = {u.name: "recompute" for u in facts.units}
    assert policy_stage_costs(op_gpt, facts, base, every, HOST).costs.saved_bytes >= \
        base.held_bytes
    offload = policy_stage_costs(op_gpt, facts, base, {"h.2": "offload"}, HOST)
    assert offload.host_bytes == h2.host_bytes >= sum(size[r] for r in h2.saved) > 0


def test_copies_hold_the_stage_for_their_transfer(op_gpt: Graph) -> None:
    """The runtime copies a saved tensor to the host when autograd saves it and back when a
    backward node unpacks it, in the stage's own stream: each copy adds its transfer and the
    link's latency to the F and to the B (or I), and a split W reloads what its weight-gradient
    nodes read. The knapsack's figure for the module is that time."""
    _, facts, base = _op_stage(op_gpt, 1)
    h2 = facts.units[0]
    d2h, h2d = PCIE_HOST.d2h, PCIE_HOST.h2d
    assert d2h is not None and h2d is not None

    def moved_ms(link: Link, roots: frozenset[int] | None) -> float:
        return (h2.host_bytes_of(roots, MemoryLedger.of(op_gpt).storage_bytes)
                / link.bandwidth_bytes_per_s * 1e3 + h2.copies_of(roots) * link.latency_s * 1e3)

    out, back = moved_ms(d2h, None), moved_ms(h2d, None)
    weight = moved_ms(h2d, h2.weight_read)
    assert h2.copies_of(None) > 1 and weight > 0
    got = policy_stage_costs(op_gpt, facts, base, {"h.2": "offload"}, PCIE_HOST).costs
    assert got.forward_ms == pytest.approx(base.forward_ms + out)
    assert got.backward_ms == pytest.approx(base.backward_ms + back)
    assert got.backward_input_ms == pytest.approx(base.backward_input_ms + back)
    assert got.backward_weight_ms == pytest.approx(base.backward_weight_ms + weight)
    (figure,) = [it for it in stage_items.items(problem(op_gpt, None, PCIE_HOST, ranks=2), facts)
                 if it.name == "h.2"]
    assert figure.offload_ms == pytest.approx(out + back)
    assert copies_ms(h2d, 0, 0) == 0.0  # nothing to reload: no latency either


# -- the planner -------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [1.3, 1.0, 0.9])
def test_whole_fits_and_is_never_slower_than_dp_and_ilp(gpt: Graph, level: float) -> None:
    memory = int(plain_least(gpt) * level)
    p = problem(gpt, memory)
    whole = whole_job_partition(p, time_limit_s=5)
    step = check_plan(p, whole)
    for other in (dp_partition(problem(gpt, memory)),
                  ilp_partition(problem(gpt, memory), time_limit_s=2)):
        if other.best is not None and other.best.fits:
            assert other.best.simulation is not None
            assert step <= other.best.simulation.makespan_ms + 1e-9
    if level < 1.0:  # below the least any plain split needs: only remat fits
        assert dp_partition(problem(gpt, memory)).best is None
        assert any(s.unit_policies for s in whole.best.partition.stages)


def test_host_tier_brings_offload_within_host_memory(gpt: Graph) -> None:
    memory = int(plain_least(gpt, HOST) * 0.85)
    p = problem(gpt, memory, HOST)
    whole = whole_job_partition(p, time_limit_s=5)
    check_plan(p, whole)
    policies = [v for s in whole.best.partition.stages for v in s.unit_policies.values()]
    assert "offload" in policies
    sim = whole.best.simulation
    assert 0 < sim.host_peak_bytes <= (HOST.host_memory_bytes or 0)
    small = HOST.model_copy(update={"host_memory_bytes": sim.host_peak_bytes // 4})
    tight = problem(gpt, memory, small)
    got = whole_job_partition(tight, time_limit_s=5)
    if got.best is not None:
        assert got.best.simulation.host_peak_bytes <= sim.host_peak_bytes // 4


def test_one_stage_may_use_more_than_an_even_share_of_the_host_pool(gpt: Graph) -> None:
    """Host memory is one pool: a stage's plan may hold more than pool / stages while the
    stages' plans together fit it (the even share is the fallback)."""
    memory = int(plain_least(gpt, HOST) * 0.85)
    roomy = whole_job_partition(problem(gpt, memory, HOST), time_limit_s=5)
    per_rank = [r.host_peak_bytes for r in roomy.best.simulation.ranks]
    pool = int(1.1 * sum(per_rank))
    assert max(per_rank) > pool // len(per_rank)  # more than an even share would give
    p = problem(gpt, memory, HOST.model_copy(update={"host_memory_bytes": pool}))
    got = whole_job_partition(p, time_limit_s=5)
    check_plan(p, got)
    held = [r.host_peak_bytes for r in got.best.simulation.ranks]
    assert max(held) > pool // len(held) and sum(held) <= pool
    assert makespan(got) <= makespan(roomy) + 1e-9


def test_a_host_tier_is_never_slower_than_none_where_every_split_is_judged(
        gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A host tier's knapsacks are cut sooner (here: two states a module), so its plan for a
    split may be slower than the one without a host tier; each split is judged first with
    plans that copy nothing, and with copies only where none fits without or, with time left,
    again (fastest first): the answer is never slower than the search without a host tier."""
    monkeypatch.setattr(stage_menu, "HOST_FRONTIER_WORK", 1)
    monkeypatch.setattr(stage_menu, "HOST_FRONTIER_MOST", 2)
    monkeypatch.setattr(stage_menu, "FRONTIER_LIMITS", (2, 3000))
    memory = int(plain_least(gpt, PCIE_HOST) * 0.9)
    p = problem(gpt, memory, PCIE_HOST)
    with_host = whole_job_partition(p, time_limit_s=10)
    check_plan(p, with_host)
    without = whole_job_partition(problem(gpt, memory), time_limit_s=10)
    assert makespan(with_host) <= makespan(without) + 1e-9
    # the host tier's own plans were slower on this split: the plan without copies won
    job = policy_splits.WholeJob(p)
    own = job.candidate(job.with_policies(with_host.best.split.bounds))
    assert own.simulation.makespan_ms > makespan(with_host) + 1e-6
    assert "host copies" not in with_host.notes[0]


def test_zero_bubble_stages_may_run_full_backwards_to_fit(gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Under ZB-H1 a W deferred into the bubbles holds its micro-batch's tensors: a stage over
    its memory may instead run one B a micro-batch (planned under 1F1B's rules at its
    in-flight count). Here that is the only way to fit, and the plan's peaks are the
    simulator's."""
    memory = int(plain_least(gpt) * 0.8)
    p = problem(gpt, memory, schedule="zb-h1")
    got = whole_job_partition(p, time_limit_s=5)
    check_plan(p, got)
    ops = {(a.stage_index, a.op.value) for row in got.best.rank_actions for a in row}
    fused = {s for s, op in ops if op == "B"}
    assert fused and fused < {s for s, _ in ops}  # I and W on the others
    assert got.best.split.fused and got.best.split.fused <= fused
    from planner.engine.partition import stage_rows

    assert {r.stage_index for r in stage_rows(p, got.best) if r.full_backward} == fused
    monkeypatch.setattr(policy_splits.WholeJob, "fused_for_memory",
                        lambda self, bounds: frozenset())
    assert whole_job_partition(problem(gpt, memory, schedule="zb-h1"), time_limit_s=5).best \
        is None


def test_status_is_optimal_only_with_a_proof(gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p = problem(gpt, None)
    full = whole_job_partition(p, time_limit_s=5)
    # unbounded memory: the fastest all-keep split meets the bound over every split
    assert full.status == "optimal" and full.lower_bound is not None
    assert full.best.simulation.makespan_ms == pytest.approx(full.lower_bound)
    monkeypatch.setattr(whole_job, "ENUMERATE_LIMIT", 0)  # enumeration cut: proposals only
    cut = whole_job_partition(problem(gpt, int(plain_least(gpt) * 0.9)), time_limit_s=2)
    assert cut.status == "feasible" and cut.best is not None


def test_the_method_runs_through_the_engine(gpt: Graph) -> None:
    memory = int(plain_least(gpt) * 0.9)
    report = partition_plan(gpt, devices=4, device_memory_bytes=memory, microbatches=8,
                            method="whole", time_limit_s=3)
    assert report.fits and report.plan.method == "whole"
    assert report.plan.partition is not None
    assert any(s.unit_policies for s in report.plan.partition.stages)


@pytest.mark.slow
def test_op_level_gpt(op_gpt: Graph) -> None:
    """Traced op-level GPT: per-module facts, fits, never slower, peaks equal the simulator's."""
    least = plain_least(op_gpt)
    for level in (1.2, 0.9):
        memory = int(least * level)
        p = problem(op_gpt, memory, HOST)
        whole = whole_job_partition(p, time_limit_s=5)
        step = check_plan(p, whole)
        dp = dp_partition(problem(op_gpt, memory, HOST))
        if dp.best is not None:
            assert step <= dp.best.simulation.makespan_ms + 1e-9
        else:
            assert any(s.unit_policies for s in whole.best.partition.stages)


def test_selective_checkpoints_are_chosen_where_they_beat_whole_modules(
        op_gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Below the plain least memory without a host tier, the per-stage plans keep some calls'
    outputs of recomputed modules (unit_saved_ops) or recompute submodules alone
    ('h.1.mlp'): the step is faster than with whole-module recomputation only, and faster
    than with selective checkpoints of whole modules only; its peaks are the simulator's."""
    import planner.solvers.pipeline.op_options as op_options
    import planner.solvers.pipeline.stage_items as stage_items

    # 0.85: the plain least credits what a stage's backward frees as it runs (at 0.8 of it
    # the fastest fitting plans recompute whole modules only)
    memory = int(plain_least(op_gpt) * 0.85)

    def planned() -> tuple[float, list[str], list[list[str]]]:
        p = problem(op_gpt, memory, None, ranks=2, m=4)
        got = whole_job_partition(p, time_limit_s=5, threads=1)
        step = check_plan(p, got)
        assert got.best is not None and got.best.partition is not None
        stages = got.best.partition.stages
        return (step, [u for s in stages for u in s.unit_policies if u not in s.modules],
                [ops for s in stages for ops in s.unit_saved_ops.values()])

    step, submodules, saved = planned()
    assert submodules and all(ops for ops in saved)
    monkeypatch.setattr(stage_items, "region_options", lambda *_: ())
    module_step, submodules, saved = planned()
    assert not submodules and saved and all(ops for ops in saved)
    monkeypatch.setattr(op_options, "FRACTIONS", ())
    whole_step, submodules, saved = planned()
    assert not submodules and not saved
    print(f"step {step:.3f} ms; selective whole modules only {module_step:.3f}; "
          f"whole modules only {whole_step:.3f}")
    assert step < module_step < whole_step


def makespan(out) -> float:  # type: ignore[no-untyped-def]
    assert out.best is not None and out.best.simulation is not None
    return float(out.best.simulation.makespan_ms)


def test_a_saved_op_the_module_never_calls_is_refused_in_one_line(op_gpt: Graph) -> None:
    part, facts, base = _op_stage(op_gpt, 1)
    with pytest.raises(PlanError, match=r"unit_saved_ops\['h.2'\]: 'aten.addmm#9' is not a call"):
        policy_stage_costs(op_gpt, facts, base, {"h.2": "recompute"}, HOST,
                           {"h.2": ["aten.addmm#9"]})


def test_before_the_first_plan_unfit_splits_wait_for_their_op_level_knapsacks(
        gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Anytime: while no plan exists, each split is first judged with whole-module policies
    (quicker); a split none fits gets its op-level knapsacks only once no split fits that way,
    so the first plan does not wait for them."""
    calls: list[tuple[tuple[tuple[int, int], ...], bool, bool]] = []
    judge = policy_splits.WholeJob.with_policies

    def logged(self, bounds, op_level=True, **kwargs):  # type: ignore[no-untyped-def]
        got = judge(self, bounds, op_level, **kwargs)
        calls.append((bounds, op_level, got is not None))
        return got

    monkeypatch.setattr(policy_splits.WholeJob, "with_policies", logged)
    memory = int(plain_least(gpt) * 0.8)
    p = problem(gpt, memory)
    got = whole_job_partition(p, time_limit_s=5)
    check_plan(p, got)
    first = next(k for k, (_, _, fits) in enumerate(calls) if fits)
    unfit = {b for b, op_level, fits in calls[:first] if not op_level and not fits}
    assert unfit, "the test needs splits no whole-module plan fits"
    assert not any(op_level and b in unfit for b, op_level, _ in calls[:first])
    assert calls[first][1] is False  # the first plan came from the whole-module pass


def test_a_stage_may_rerun_whole_as_one_checkpoint(gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where no per-module choice fits, a stage recomputed as one checkpoint in every
    micro-batch (it keeps only its input) is the stage's plan; the plan's peaks are the
    simulator's, and it fits below the least memory a plain split needs."""
    import planner.solvers.pipeline.ilp as ilp
    from planner.solvers.pipeline.problem import PartitionOutcome

    monkeypatch.setattr(policy_splits, "choose", lambda *args, **kwargs: None)
    monkeypatch.setattr(ilp, "ilp_partition",  # its recomputation is not the one tested
                        lambda *args, **kwargs: PartitionOutcome("ilp", None, "infeasible"))
    memory = int(plain_least(gpt) * 0.9)
    p = problem(gpt, memory)
    got = whole_job_partition(p, time_limit_s=3)
    check_plan(p, got)
    stages = got.best.partition.stages
    rerun = [s for s in stages if s.recompute_microbatches]
    assert rerun and not any(s.unit_policies for s in stages)
    assert all(s.recompute_microbatches == list(range(8)) for s in rerun)
