"""The backward search from the sink (solvers/remat/sink_search.py): exact on tiny DAGs against
brute force over every schedule in any order, its plans judged by the simulator, and auto's
proof of infeasibility on a tight budget."""

from __future__ import annotations

import pytest
from remat_bruteforce import brute_force_cost

from planner.core.graph import Graph
from planner.core.synthetic import random_layered_dag, training_graph
from planner.sim.simulator import simulate
from planner.solvers.remat.auto import solve_auto
from planner.solvers.remat.problem import problem_from_graph
from planner.solvers.remat.sink_search import (
    is_tight,
    plan_from_sink,
    search_from_sink,
    sink_position,
)


def _sink_need(graph: Graph) -> int:
    """Bytes resident while the sink runs: its inputs and output (no fixed bytes here)."""
    index = graph.index
    sink = graph.nodes[-1].id
    return index.storage_bytes[sink] + sum(index.storage_bytes[u]
                                           for u in index.predecessors[sink])


@pytest.mark.parametrize("seed", range(6))
def test_decides_exactly_as_brute_force_over_every_schedule(seed: int) -> None:
    graph = random_layered_dag(9, seed=seed, width=2.0)
    need = _sink_need(graph)
    total = sum(graph.index.storage_bytes.values())
    for budget in sorted({need, need + 100, (need + total) // 2, need + 2_000, total}):
        problem = problem_from_graph(graph, budget)
        sink = sink_position(graph, problem)
        assert sink is not None
        found = search_from_sink(problem, sink)
        optimum = brute_force_cost(problem, frontier=False)
        assert (found.status == "infeasible") == (optimum is None), (seed, budget)
        if found.status == "plan":
            assert found.actions is not None
            sim = simulate(graph, found.actions)
            assert sim.peak_bytes <= budget
            assert optimum is not None and sim.compute_cost >= optimum - 1e-9


def test_a_training_chain_with_its_loss_is_decided_as_brute_force() -> None:
    graph = training_graph(4, seed=2)
    store_all = sum(graph.index.storage_bytes.values())
    for budget in range(store_all // 8, store_all, store_all // 8):
        problem = problem_from_graph(graph, budget)
        found = search_from_sink(problem, sink_position(graph, problem) or 0)
        optimum = brute_force_cost(problem, frontier=False)
        assert (found.status == "infeasible") == (optimum is None), budget


def test_plans_on_a_larger_dag_are_valid_and_within_budget() -> None:
    graph = random_layered_dag(100, seed=1)
    total = sum(graph.index.storage_bytes.values())
    problem = problem_from_graph(graph, total // 4)
    found = search_from_sink(problem, sink_position(graph, problem) or 0)
    assert found.status == "plan" and found.actions is not None
    sim = simulate(graph, found.actions)
    assert sim.peak_bytes <= total // 4
    assert sim.computations >= len(graph.nodes)


@pytest.mark.parametrize(("nodes", "seed", "extra"), [(150, 2, 19_085), (150, 2, 43_978),
                                                     (80, 6, 3_900)])
def test_best_first_plans_are_valid_and_it_never_plans_what_is_proven_infeasible(
        nodes: int, seed: int, extra: int) -> None:
    graph = random_layered_dag(nodes, seed=seed)
    budget = _sink_need(graph) + extra
    problem = problem_from_graph(graph, budget)
    sink = sink_position(graph, problem)
    assert sink is not None
    exact = search_from_sink(problem, sink)
    found = plan_from_sink(problem, sink)
    assert (found.status == "plan") == (exact.status == "plan"), (found, exact.status)
    if found.status == "plan":
        assert found.actions is not None
        assert simulate(graph, found.actions).peak_bytes <= budget


def test_gives_up_after_its_count_of_sets() -> None:
    graph = random_layered_dag(200, seed=0)
    problem = problem_from_graph(graph, sum(graph.index.storage_bytes.values()) // 3)
    found = search_from_sink(problem, sink_position(graph, problem) or 0, max_states=50)
    assert found.status == "unknown" and found.actions is None and found.states > 50


def test_covers_only_graphs_with_one_node_nobody_reads() -> None:
    graph = random_layered_dag(40, seed=0)
    sink = graph.nodes[-1].id
    headless = graph.model_copy(update={
        "nodes": graph.nodes[:-1], "edges": [e for e in graph.edges if e.target != sink]})
    headless = type(graph).model_validate(headless.model_dump())
    assert sink_position(headless, problem_from_graph(headless, 10**9)) is None
    problem = problem_from_graph(graph, 10**9)
    assert sink_position(graph, problem) == problem.n - 1
    assert not is_tight(problem, problem.n - 1)


def test_auto_proves_a_tight_budget_infeasible_and_plans_just_above() -> None:
    graph = random_layered_dag(80, seed=6)
    problem = problem_from_graph(graph, _sink_need(graph))
    sink = sink_position(graph, problem)
    assert sink is not None
    budget = problem.budget_bytes  # up to the least budget the search finds a plan for
    while search_from_sink(problem.with_budget(budget), sink).status == "infeasible":
        budget += 50
    assert budget > problem.budget_bytes and is_tight(problem.with_budget(budget - 50), sink)
    result = solve_auto(graph, budget - 50, time_limit_s=10.0, threads=1)
    assert result.proven_infeasible and result.actions is None
    assert any("resident sets" in note for note in result.notes)
    result = solve_auto(graph, budget, time_limit_s=2.0, threads=1)
    assert result.actions is not None
    assert simulate(graph, result.actions).peak_bytes <= budget
