"""Baselines run as methods are bounded (issue 50, item 5): recompute-all's plan grows with the
square of the graph (18 M actions, a 275 MB plan, at 6,001 nodes), so as a method it stops at
QUADRATIC_MAX_ACTIONS, and every baseline stops at its time limit: an error naming why and
what to choose instead, never an unbounded plan."""

from __future__ import annotations

from planner.core.plan import PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.solve import solve
from planner.solvers.baselines import QUADRATIC_MAX_ACTIONS, recompute_all


def test_recompute_all_past_its_action_cap_is_an_error_that_says_what_to_do() -> None:
    g = training_graph(3000, skip=3, seed=1)  # 6,001 nodes
    plan = solve(g, 10**15, "recompute-all", time_limit_s=60)
    assert plan.status is PlanStatus.error and not plan.actions
    assert f"over {QUADRATIC_MAX_ACTIONS} actions" in plan.notes[0]
    assert "choose auto or chen-sqrt" in plan.notes[0]


def test_recompute_all_within_its_cap_is_unchanged() -> None:
    g = training_graph(60, skip=3, seed=1)
    plan = solve(g, 10**15, "recompute-all", time_limit_s=60)
    assert plan.status in (PlanStatus.feasible, PlanStatus.optimal)
    assert list(plan.actions) == recompute_all(g)


def test_a_baseline_past_its_time_limit_is_an_error() -> None:
    g = training_graph(3000, skip=3, seed=1)
    plan = solve(g, 10**15, "chen-greedy", time_limit_s=1e-6)
    assert plan.status is PlanStatus.error and not plan.actions
    assert "longer time limit" in plan.notes[0]
