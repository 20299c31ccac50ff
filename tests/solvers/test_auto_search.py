"""auto's explicit state (`AutoSearch`) and the portfolio object: candidates are judged by the
simulator, ties go to plans the in-order bounds cover, and a plan that reorders first
computations is claimed only against the bounds for any order."""

from __future__ import annotations

import time

from planner.core.graph import Graph
from planner.core.plan import Action, compute
from planner.core.synthetic import random_layered_dag, training_graph
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.order import schedule_order
from planner.solvers.remat.auto import solve_auto
from planner.solvers.remat.auto_search import AutoConfig, AutoSearch, follows
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.orders import random_orders, with_order
from planner.solvers.remat.portfolio import Portfolio, run_portfolio
from planner.solvers.remat.problem import problem_from_graph

Heard = list[tuple[float | None, float | None]]


def _search(graph: Graph, budget_bytes: int, heard: Heard | None = None) -> AutoSearch:
    now = time.perf_counter()
    return AutoSearch(graph, budget_bytes, problem_from_graph(graph, budget_bytes),
                      AutoConfig(time_limit_s=10.0), started=now, deadline=now + 10.0,
                      progress=None if heard is None else lambda o, b: heard.append((o, b)))


def test_offer_judges_with_the_simulator_and_keeps_the_cheapest() -> None:
    g = training_graph(6, seed=0)
    budget = store_all_peak_bytes(g)
    heard: Heard = []
    search = _search(g, budget, heard)
    assert not search.offer(None, "nothing")
    assert not search.offer([compute(g.nodes[-1].id)], "broken")  # its inputs never computed
    assert search.best is None and search.notes and search.notes[0].startswith("broken:")
    store_all = CheckpointPlan(search.problem).actions()
    assert search.offer(store_all, "store-all")
    assert search.best is not None and search.best.cost == search.problem.total_cost
    assert search.optimal() and heard == [(search.problem.total_cost, search.problem.total_cost)]
    assert "first_plan_s" in search.timings
    assert not search.offer(store_all, "again")  # no cheaper: the first stays
    assert search.best.source == "store-all"


def test_a_reordering_plan_gets_only_the_any_order_bound() -> None:
    g = random_layered_dag(40, seed=3)
    budget = store_all_peak_bytes(g)
    given = schedule_order(g)
    name, order = next((n, o) for n, o in random_orders(g, seed=0) if o != given)
    plan = CheckpointPlan(problem_from_graph(with_order(g, order), 10 * budget))
    search = _search(g, 10 * budget)
    assert search.offer(plan.actions(), f"store-all@{name}")
    assert search.best is not None and not follows(search.best.actions, given)
    search.bound = 2 * search.problem.total_cost  # an in-order bound: it covers no other order
    result = search.result()
    assert result.bound == search.problem.total_cost and result.proven_optimal
    assert any("reorders" in note for note in result.notes)


def test_portfolio_object_matches_run_portfolio() -> None:
    """A store-all fit in the graph's order ends the phase at once, by either entry."""
    g = random_layered_dag(60, seed=1)
    budget = store_all_peak_bytes(g)
    offered: list[str] = []

    def offer(actions: list[Action] | None, source: str) -> bool:
        offered.append(source)
        return True

    fitted = run_portfolio(g, budget, offer, time.perf_counter() + 5.0)
    assert [name for name, _ in fitted] == ["given"] and offered == ["store-all@given"]
    again = Portfolio(g, budget, offer, time.perf_counter() + 5.0, threads=1, seed=0,
                      order_of={}, notes=[], timings={})
    assert [name for name, _ in again.run()] == ["given"]
    assert again.order_of == {"store-all@given": schedule_order(g)}


def test_auto_claims_no_plan_when_one_node_alone_exceeds_the_budget() -> None:
    g = training_graph(4, seed=0)
    r = solve_auto(g, 1, time_limit_s=1.0)
    assert r.actions is None and r.proven_infeasible
    assert r.bound == problem_from_graph(g, 1).total_cost
