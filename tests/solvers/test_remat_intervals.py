"""The CP-SAT interval model (Moccasin-style) and the heuristics that seed auto."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_remat_milp import varied_dag

from planner.core.graph import Edge, Graph, Node
from planner.core.synthetic import random_dag, training_graph
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.remat.dtr import SCORES, best_dtr, dtr_depth_first_plan, dtr_plan
from planner.solvers.remat.exact import solve_milp
from planner.solvers.remat.intervals import solve_intervals
from planner.solvers.remat.problem import problem_from_graph


def _cases() -> list[tuple[int, int]]:
    out = []
    for seed in range(10):
        g = varied_dag(seed)
        lo, hi = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
        out += [(seed, lo + (hi - lo) // 3), (seed, hi)]
    return out


def test_interval_optimum_equals_milp_optimum() -> None:
    for seed, budget in _cases():
        g = varied_dag(seed)
        problem = problem_from_graph(g, budget)
        milp = solve_milp(problem, "cpsat", time_limit_s=20, threads=1)
        r = solve_intervals(problem, time_limit_s=20, threads=1)
        where = f"seed {seed}, budget {budget}"
        if milp.cost is None:
            assert milp.status == "infeasible", where
            assert r.actions is None, where
            continue
        assert r.status == "optimal", where
        assert r.cost == pytest.approx(milp.cost), where
        sim = simulate(g, r.actions)
        assert sim.peak_bytes == r.peak_bytes <= budget, where
        assert sim.compute_cost == pytest.approx(r.cost), where


def test_interval_model_takes_a_hint_and_keeps_it_feasible() -> None:
    g = training_graph(8, skip=2, seed=5)
    budget = (lower_bound_peak_bytes(g) + store_all_peak_bytes(g)) // 2
    problem = problem_from_graph(g, budget)
    hint = best_dtr(problem)
    assert hint is not None and simulate(g, hint).peak_bytes <= budget
    r = solve_intervals(problem, max_computations=2, time_limit_s=10, threads=2, hint=hint)
    assert r.actions is not None
    assert simulate(g, r.actions).peak_bytes <= budget
    assert r.cost <= simulate(g, hint).compute_cost + 1e-9


@pytest.mark.parametrize("plan_fn", [dtr_plan, dtr_depth_first_plan])
def test_each_dtr_variant_gives_valid_plans(plan_fn: Callable[..., Any]) -> None:
    found = 0
    for seed in range(8):
        g = random_dag(14, seed=seed, edge_probability=0.3)
        lo, hi = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
        for k in range(4):
            problem = problem_from_graph(g, lo + (hi - lo) * k // 3)
            for score in SCORES.values():
                actions = plan_fn(problem, score)
                if actions is not None:  # the simulator accepts it; within budget by design
                    found += 1
                    assert simulate(g, actions).peak_bytes <= problem.budget_bytes
    assert found > 0


def test_dtr_plans_are_within_budget_or_absent() -> None:
    for seed in range(8):
        g = random_dag(12, seed=seed, edge_probability=0.3)
        lo, hi = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
        for k in range(5):
            budget = lo + (hi - lo) * k // 4
            actions = best_dtr(problem_from_graph(g, budget))
            if actions is not None:
                assert simulate(g, actions).peak_bytes <= budget


def test_interval_model_returns_the_hint_when_it_finds_nothing_in_time() -> None:
    g = training_graph(30, skip=3, seed=2)
    budget = int(0.8 * store_all_peak_bytes(g))
    problem = problem_from_graph(g, budget)
    hint = best_dtr(problem)
    assert hint is not None
    r = solve_intervals(problem, time_limit_s=0.01, threads=1, hint=hint)
    assert r.actions is not None and r.status in ("feasible", "optimal")
    assert simulate(g, r.actions).peak_bytes <= budget
    assert r.cost <= simulate(g, hint).compute_cost + 1e-9


def test_free_order_finds_a_plan_the_graphs_order_cannot_match() -> None:
    """Two big producers, each with one small consumer, then a join: the graph's order computes
    both producers first (peak 21), so a budget of 15 forces recomputation; freeing the order of
    first computations (producer, consumer, producer, consumer) fits without any."""
    nodes = [Node(id=i, compute_ms=c, output_bytes=b)
             for i, (c, b) in enumerate([(5, 10), (7, 10), (1, 1), (1, 1), (1, 1)])]
    edges = [Edge(source=s, target=t) for s, t in [(0, 2), (1, 3), (2, 4), (3, 4)]]
    g = Graph(nodes=nodes, edges=edges, order=[0, 1, 2, 3, 4])
    problem = problem_from_graph(g, 15)
    fixed = solve_intervals(problem, time_limit_s=10, threads=1)
    free = solve_intervals(problem, free_order=True, time_limit_s=10, threads=1)
    assert fixed.status == free.status == "optimal"
    assert fixed.cost is not None and fixed.cost > g.total_compute_ms
    assert free.cost == g.total_compute_ms  # every node once, in another order
    assert free.actions is not None
    sim = simulate(g, free.actions)
    assert sim.peak_bytes <= 15 and sim.compute_cost == free.cost
