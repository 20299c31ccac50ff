"""Baseline plans: valid, reported honestly by solve(), and cheaper in memory than store-all."""

from __future__ import annotations

import math

import pytest
from conftest import make_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import InputError
from planner.core.graph import Edge, Graph, Node, Phase
from planner.core.plan import ActionOp, PlanStatus, compute
from planner.core.synthetic import random_dag, training_graph
from planner.engine import registry
from planner.engine.solve import solve
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import (
    BASELINES,
    checkpoint_schedule,
    chen_greedy,
    cut_points,
    forward_nodes,
    recompute_all,
    store_all,
    store_all_peak_bytes,
)
from planner.solvers.request import MethodResult, SolveRequest

# "auto" belongs to the solvers (tested there); these need no solver.
ALL_METHODS = [*BASELINES, "best-baseline"]


def training_graphs() -> list[Graph]:
    return [
        training_graph(16, seed=0, fixed_bytes=1000),
        training_graph(24, skip=3, seed=1),
        training_graph(30, skip=2, seed=2),
    ]


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("graph_index", range(3))
def test_solve_reports_the_simulated_peak(method: str, graph_index: int) -> None:
    graph = training_graphs()[graph_index]
    reference = store_all_peak_bytes(graph)
    for fraction in (1.0, 0.7, 0.3):
        budget = math.ceil(fraction * reference)
        plan = solve(graph, budget, method)
        if budget < lower_bound_peak_bytes(graph):  # proven infeasible before any method runs
            assert plan.status is PlanStatus.infeasible and plan.backend == "proof"
            assert not plan.actions
            assert plan.details["smallest_feasible_bytes"] >= lower_bound_peak_bytes(graph)
            continue
        sim = simulate(graph, plan)  # also checks the graph hash
        assert plan.predicted is not None
        assert plan.predicted.peak_bytes == sim.peak_bytes
        assert plan.predicted.compute_cost == sim.compute_cost
        assert plan.predicted.overhead == pytest.approx(sim.overhead)
        assert plan.budget_bytes == budget and plan.graph_hash == graph.content_hash()
        if method in BASELINES:  # solve() runs exactly the baseline's plan
            assert plan.actions == BASELINES[method](graph, budget)
        if sim.peak_bytes <= budget:
            assert plan.status in (PlanStatus.optimal, PlanStatus.feasible)
            assert plan.objective == sim.compute_cost
            assert plan.lower_bound is not None and plan.lower_bound <= plan.objective
            # The bound is every node once: optimal exactly when nothing is recomputed.
            assert (plan.status is PlanStatus.optimal) == (sim.recomputations == 0)
        else:
            assert plan.status is PlanStatus.infeasible
            assert plan.details["smallest_feasible_bytes"] == sim.peak_bytes
            assert plan.objective is None


def test_store_all_fits_its_own_peak_and_is_optimal() -> None:
    graph = training_graph(12, skip=2)
    plan = solve(graph, store_all_peak_bytes(graph), "store-all")
    assert plan.status is PlanStatus.optimal and plan.gap == 0.0
    over = solve(graph, store_all_peak_bytes(graph) - 1, "store-all")
    assert over.status is PlanStatus.infeasible


@pytest.mark.parametrize("graph_index", range(3))
def test_recompute_all_and_chen_use_less_memory_than_store_all(graph_index: int) -> None:
    graph = training_graphs()[graph_index]
    store = simulate(graph, store_all(graph))
    assert store.overhead == 0.0
    below = store.peak_bytes - 1
    for name in ("recompute-all", "chen-sqrt", "chen-greedy"):
        sim = simulate(graph, BASELINES[name](graph, below))
        assert sim.peak_bytes < store.peak_bytes, name
        assert sim.recomputations > 0, name
        assert sim.peak_bytes >= lower_bound_peak_bytes(graph)
    # recompute-all keeps the least: no plan of these is below it here.
    least = simulate(graph, recompute_all(graph)).peak_bytes
    assert least == min(simulate(graph, fn(graph, below)).peak_bytes for fn in BASELINES.values())


def test_chen_beats_recompute_all_on_compute() -> None:
    graph = training_graph(24, skip=3, seed=1)
    recompute = simulate(graph, recompute_all(graph))
    for name in ("chen-sqrt", "chen-greedy"):
        sim = simulate(graph, BASELINES[name](graph, None))
        assert sim.compute_cost < recompute.compute_cost, name


@pytest.mark.parametrize("graph_index", range(3))
def test_chen_forward_pass_computes_each_node_once(graph_index: int) -> None:
    # Chen's forward pass keeps a segment's values until its last forward use: skip inputs are
    # not recomputed (and then held into the backward pass), so the peak stays well below
    # store-all on residual graphs.
    graph = training_graphs()[graph_index]
    loss = next(n.id for n in graph.nodes if n.phase is Phase.loss)
    budget = store_all_peak_bytes(graph) - 1
    for name in ("chen-sqrt", "chen-greedy"):
        actions = BASELINES[name](graph, budget)
        computed = [a.node for a in actions if a.op is ActionOp.compute]
        forward = computed[: computed.index(loss) + 1]
        assert len(forward) == len(set(forward)) == len(forward_nodes(graph)), name
    sim = simulate(graph, BASELINES["chen-sqrt"](graph, None))
    assert sim.peak_bytes < 0.75 * store_all_peak_bytes(graph)


def test_chen_greedy_prefers_the_cheapest_plan_within_budget() -> None:
    graph = training_graph(24, skip=3, seed=1)
    peaks = []
    for budget in (None, math.ceil(0.6 * store_all_peak_bytes(graph))):
        sim = simulate(graph, chen_greedy(graph, budget))
        peaks.append(sim.peak_bytes)
        if budget is not None:
            assert sim.peak_bytes <= budget
    # An impossible budget gives the least peak found instead.
    tiny = simulate(graph, chen_greedy(graph, 1))
    assert tiny.peak_bytes <= min(peaks)


def test_best_baseline_is_the_cheapest_that_fits() -> None:
    graph = training_graph(24, skip=3, seed=1)
    budget = math.ceil(0.7 * store_all_peak_bytes(graph))
    best = solve(graph, budget, "best-baseline")
    fitting = [
        simulate(graph, fn(graph, budget)) for fn in BASELINES.values()
    ]
    costs = [s.compute_cost for s in fitting if s.peak_bytes <= budget]
    assert best.predicted is not None and best.predicted.compute_cost == min(costs)
    assert best.backend.startswith("baseline:")


def test_checkpointing_everything_is_store_all() -> None:
    graph = training_graph(10, skip=2, seed=4)
    assert checkpoint_schedule(graph, graph.index.topological_order) == store_all(graph)


def test_cut_points_skip_the_inside_of_residual_blocks() -> None:
    chain = training_graph(8)
    fwd = forward_nodes(chain)
    assert cut_points(chain) == fwd[:-1]  # every joint of a chain but the last forward node
    skip = training_graph(8, skip=4)
    # Layer 4 adds layer 0's output: layers 1..3 are inside the block, not joints.
    cuts = cut_points(skip)
    assert 0 in cuts and not {1, 2, 3} & set(cuts) and 4 in cuts


def test_non_recomputable_nodes_are_never_recomputed() -> None:
    graph = training_graph(10, seed=5)
    frozen = [n.model_copy(update={"recomputable": n.id % 3 != 0}) for n in graph.nodes]
    graph = Graph(nodes=frozen, edges=graph.edges)
    for name, fn in BASELINES.items():
        actions = fn(graph, None)
        simulate(graph, actions)
        computed = [a.node for a in actions if a.op is ActionOp.compute]
        for v in computed:
            if not graph.node(v).recomputable:
                assert computed.count(v) == 1, (name, v)


@st.composite
def dags(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(2, 14))
    g = random_dag(n, edge_probability=draw(st.floats(0.0, 0.6)), seed=draw(st.integers(0, 10**6)))
    # Mark a suffix as backward and a few nodes as not recomputable.
    split = draw(st.integers(1, n))
    fixed_nodes = draw(st.sets(st.integers(0, n - 1), max_size=3))
    nodes = [
        node.model_copy(
            update={
                "phase": Phase.backward if node.id >= split else Phase.forward,
                "recomputable": node.id not in fixed_nodes,
                "workspace_bytes": node.id % 3,
            }
        )
        for node in g.nodes
    ]
    return Graph(nodes=nodes, edges=g.edges)


@settings(max_examples=120, deadline=None)
@given(dags(), st.floats(0.2, 1.2))
def test_every_baseline_is_valid_on_random_dags(graph: Graph, fraction: float) -> None:
    lower = lower_bound_peak_bytes(graph)
    reference = store_all_peak_bytes(graph)
    budget = math.ceil(fraction * reference)
    for name, fn in BASELINES.items():
        sim = simulate(graph, fn(graph, budget))
        assert lower <= sim.peak_bytes, name
        assert sim.compute_cost >= graph.total_compute_ms, name
    plan = solve(graph, budget, "best-baseline")
    if budget < lower:  # proven infeasible without running the method
        assert plan.status is PlanStatus.infeasible and plan.predicted is None
        return
    assert plan.predicted is not None
    assert (plan.status is PlanStatus.infeasible) == (plan.predicted.peak_bytes > budget)


# -- solve() is honest about what methods return ------------------------------------------------


def _invalid_plan(request: SolveRequest) -> MethodResult:
    return MethodResult(actions=[compute(1)], status=PlanStatus.optimal, backend="liar")


def _no_plan(request: SolveRequest) -> MethodResult:
    return MethodResult(
        actions=None, status=PlanStatus.feasible, backend="none", smallest_feasible_bytes=123
    )


def _claims_optimal(request: SolveRequest) -> MethodResult:
    actions = recompute_all(request.graph)
    return MethodResult(actions=actions, status=PlanStatus.optimal, backend="liar",
                        objective=0.0, lower_bound=10**9)


def test_solve_marks_an_invalid_plan_as_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_PLUGINS", {"invalid": "test_baselines:_invalid_plan"})
    graph = make_graph({0: 1, 1: 1}, [(0, 1)])
    plan = solve(graph, 100, "invalid")
    assert plan.status is PlanStatus.error
    assert plan.predicted is None
    assert any("invalid plan" in note for note in plan.notes)


def test_solve_without_a_plan_is_not_feasible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_PLUGINS", {"none": "test_baselines:_no_plan"})
    graph = make_graph({0: 1, 1: 1}, [(0, 1)])
    plan = solve(graph, 100, "none")
    assert plan.status is PlanStatus.timeout
    assert plan.details["smallest_feasible_bytes"] == 123


def test_solve_uses_the_simulator_not_the_method_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_PLUGINS", {"claims": "test_baselines:_claims_optimal"})
    graph = training_graph(8)
    plan = solve(graph, 10**12, "claims")
    sim = simulate(graph, plan)
    assert plan.objective == sim.compute_cost > 0
    assert sim.recomputations > 0
    assert plan.status is PlanStatus.error  # a bound above a known plan's cost is an error
    assert plan.lower_bound == graph.total_compute_ms
    assert any("exceeds the simulated cost" in note for note in plan.notes)
    assert plan.lower_bound is not None and plan.lower_bound <= sim.compute_cost


def test_solve_rejects_bad_arguments() -> None:
    graph = make_graph({0: 1}, [])
    with pytest.raises(InputError, match="unknown method 'nope'"):
        solve(graph, 10, "nope")
    with pytest.raises(InputError, match="budget"):
        solve(graph, -1, "store-all")
    with pytest.raises(InputError, match="time_limit"):
        solve(graph, 10, "store-all", time_limit_s=0)


def test_single_node_and_edgeless_graphs() -> None:
    for graph in (
        Graph(nodes=[Node(id=4, output_bytes=9)]),
        Graph(nodes=[Node(id=i, output_bytes=i) for i in range(4)]),
        Graph(nodes=[Node(id=0, output_bytes=1), Node(id=1, output_bytes=2)],
              edges=[Edge(source=0, target=1)]),
    ):
        for name, fn in BASELINES.items():
            sim = simulate(graph, fn(graph, None))
            assert sim.recomputations == 0, name


@pytest.mark.parametrize("graph_index", range(3))
def test_chen_greedy_recomputes_nothing_where_store_all_fits(graph_index: int) -> None:
    """Issue 27: chen-greedy answered +14.2 % at a budget 75x store-all's peak."""
    graph = training_graphs()[graph_index]
    peak = solve(graph, 10**15, "store-all").predicted
    assert peak is not None
    for budget in (peak.peak_bytes, 75 * peak.peak_bytes):
        plan = solve(graph, budget, "chen-greedy")
        assert plan.predicted is not None and plan.predicted.overhead == 0.0, plan.summary()
