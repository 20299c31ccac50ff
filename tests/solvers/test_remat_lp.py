"""LP relaxation and rounding: the LP bound never exceeds the MILP optimum; rounded plans are
never over budget."""

from __future__ import annotations

import pytest

from planner.core.synthetic import random_dag, training_graph
from planner.engine.solve import solve
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.remat.exact import solve_milp
from planner.solvers.remat.lp_rounding import lp_relaxation, solve_lp_rounding
from planner.solvers.remat.problem import problem_from_graph

GRAPHS = [random_dag(8, seed=s, edge_probability=0.35) for s in range(6)] + [
    training_graph(5, skip=2, seed=1)
]


def _budgets(g):  # type: ignore[no-untyped-def]
    lo, hi = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
    return [lo + (hi - lo) * k // 4 for k in range(1, 5)]


@pytest.mark.parametrize("backend", ["highs-lp", "glop"])
def test_lp_bound_at_most_milp_optimum(backend: str) -> None:
    for g in GRAPHS:
        for budget in _budgets(g):
            problem = problem_from_graph(g, budget)
            exact = solve_milp(problem, "cpsat", time_limit_s=20, threads=1)
            lp = lp_relaxation(problem, backend=backend, time_limit_s=20)
            if exact.cost is None:
                continue
            assert lp.bound is not None
            assert problem.total_cost - 1e-9 <= lp.bound <= exact.cost + 1e-6 * exact.cost


@pytest.mark.slow
def test_lp_rounding_never_over_budget() -> None:
    for g in GRAPHS + [training_graph(12, skip=3, seed=2)]:
        lo, hi = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
        for k in range(0, 9):
            budget = lo + (hi - lo) * k // 8
            r = solve_lp_rounding(problem_from_graph(g, budget), time_limit_s=20)
            if r.actions is not None:
                sim = simulate(g, r.actions)
                assert sim.peak_bytes == r.peak_bytes <= budget
                assert r.bound is None or r.bound <= sim.compute_cost + 1e-9
            plan = solve(g, budget, "lp-rounding", time_limit_s=20)
            if plan.predicted is not None and plan.status.value in ("optimal", "feasible"):
                assert plan.predicted.peak_bytes <= budget
