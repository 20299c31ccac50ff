"""Anytime answers (issue 48): a method that overruns its limit is answered for by its own best
plan so far, not by the fast baselines' fallback, whatever made it overrun.

The plugins below ignore their limits the way a loaded machine makes auto overrun: one offers a
given plan and then sleeps; one runs auto itself with ten times the engine's limit.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import plugin_methods

from planner.core.plan import Action, PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.incumbent import IncumbentBox
from planner.engine.solve import solve
from planner.sim.simulator import simulate
from planner.solvers.baselines import chen_sqrt, store_all_peak_bytes
from planner.solvers.remat.auto import solve_auto
from planner.solvers.request import MethodResult, SolveRequest

RELEASE = threading.Event()  # set at the end of each test: the sleeping plugins then return
OFFERED: dict[str, list[Action]] = {}  # the plan the offering plugin hands the engine
GRAPH = training_graph(40, skip=3, seed=2)


def offering_method(request: SolveRequest) -> MethodResult:
    """Offers OFFERED["plan"] (with a bound of every node once), then ignores its limit."""
    assert request.incumbent is not None
    request.incumbent(OFFERED["plan"], "offered", request.graph.total_compute_ms)
    RELEASE.wait(20)
    return MethodResult(actions=None, status=PlanStatus.timeout)


def stubborn_auto(request: SolveRequest) -> MethodResult:
    """auto's own search, given ten times the engine's limit: it overruns with plans found."""
    solve_auto(request.graph, request.budget_bytes, time_limit_s=10 * request.time_limit_s,
               threads=request.threads, incumbent=request.incumbent)
    return MethodResult(actions=None, status=PlanStatus.timeout)


@pytest.fixture(autouse=True)
def _plugins() -> object:
    RELEASE.clear()
    with plugin_methods(offering_test="test_anytime:offering_method",
                        stubborn_auto_test="test_anytime:stubborn_auto"):
        yield
    RELEASE.set()


def _budget(fraction: float) -> int:
    return int(fraction * store_all_peak_bytes(GRAPH))


def test_an_overrunning_method_answers_with_its_best_plan_so_far() -> None:
    budget = _budget(0.6)
    found = solve(GRAPH, budget, "auto", time_limit_s=5.0)
    sqrt_cost = simulate(GRAPH, chen_sqrt(GRAPH)).compute_cost
    assert found.actions and found.objective is not None and found.objective < sqrt_cost
    OFFERED["plan"] = list(found.actions)
    plan = solve(GRAPH, budget, "offering-test", time_limit_s=0.3)
    assert plan.status is PlanStatus.feasible
    assert plan.backend == "offering-test:offered"
    assert plan.details["incumbent"] is True and plan.details["method_overran"] is True
    assert plan.details["fallback"] is False
    assert "its best plan so far" in plan.notes[0]
    sim = simulate(GRAPH, plan.actions)
    assert sim.peak_bytes <= budget and plan.objective == sim.compute_cost == found.objective


def test_an_incumbent_over_the_budget_leaves_the_answer_to_the_fallback() -> None:
    budget = _budget(0.6)
    OFFERED["plan"] = list(solve(GRAPH, store_all_peak_bytes(GRAPH), "store-all").actions)
    plan = solve(GRAPH, budget, "offering-test", time_limit_s=0.3)
    assert plan.backend.startswith("fallback:baseline:")
    assert plan.details["fallback"] is True and "incumbent" not in plan.details
    assert simulate(GRAPH, plan.actions).peak_bytes <= budget


def test_a_cheaper_fitting_fallback_wins_over_a_dearer_incumbent() -> None:
    budget = store_all_peak_bytes(GRAPH)  # store-all fits: nothing is cheaper
    OFFERED["plan"] = chen_sqrt(GRAPH)
    plan = solve(GRAPH, budget, "offering-test", time_limit_s=0.3)
    assert plan.backend == "fallback:baseline:store-all"
    assert plan.objective == GRAPH.total_compute_ms


def test_auto_overrunning_answers_with_its_own_incumbent() -> None:
    budget = _budget(0.6)
    plan = solve(GRAPH, budget, "stubborn-auto-test", time_limit_s=1.0)
    assert plan.status is PlanStatus.feasible and plan.details.get("incumbent") is True
    assert plan.backend.startswith("stubborn-auto-test:")
    sim = simulate(GRAPH, plan.actions)
    assert sim.peak_bytes <= budget and plan.objective == sim.compute_cost
    assert plan.lower_bound is not None and plan.lower_bound <= plan.objective


def test_the_box_keeps_the_latest_offer_and_nothing_after_it_closes() -> None:
    box = IncumbentBox(time.perf_counter())
    first, second = chen_sqrt(GRAPH), list(solve(GRAPH, _budget(1.0), "store-all").actions)
    box.offer(first, "a", None)
    box.offer(second, "b", 1.0)
    second.clear()  # the method edits its list afterwards: the box holds a copy
    kept = box.close()
    assert kept is not None and kept.source == "b" and len(kept.actions) > 0
    box.offer(first, "late", None)
    assert box.close() is kept


def test_a_stop_ends_the_solve_early_with_the_best_plan_so_far() -> None:
    budget = _budget(0.6)
    found = solve(GRAPH, budget, "auto", time_limit_s=5.0)
    OFFERED["plan"] = list(found.actions)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.perf_counter()
    plan = solve(GRAPH, budget, "offering-test", time_limit_s=600.0, stop=stop)
    assert time.perf_counter() - started < 60  # not the 600 s limit
    assert plan.backend == "offering-test:offered" and plan.objective == found.objective
    assert plan.details["method_overran"] is False and "stopped after" in plan.notes[0]
