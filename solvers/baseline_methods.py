"""Baselines exposed as planning methods; each declares its spec (planner.solvers.spec) here."""

from __future__ import annotations

import time

from planner.core.plan import Action, PlanStatus
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec

# The baselines (and the graph code under them) load when a method runs: listing the specs
# (`planner-cli methods`) needs none of them.


def _build(name: str, request: SolveRequest, deadline: float) -> list[Action]:
    """The baseline's plan, abandoned past the time limit; recompute-all's (which grows with
    the square of the graph: 18 M actions, a 275 MB plan, at 6,001 nodes) also past
    QUADRATIC_MAX_ACTIONS."""
    from planner.solvers import baselines
    from planner.solvers.baselines import QUADRATIC_MAX_ACTIONS

    graph = request.graph
    if name == "recompute-all":
        return baselines.recompute_all(graph, max_actions=QUADRATIC_MAX_ACTIONS,
                                       deadline=deadline)
    if name == "chen-greedy":
        return baselines.chen_greedy(graph, request.budget_bytes, deadline=deadline)
    if name == "chen-sqrt":
        return baselines.chen_sqrt(graph, deadline=deadline)
    return baselines.store_all(graph, deadline=deadline)


def _run(name: str, request: SolveRequest) -> MethodResult:
    from planner.solvers.baselines import ScheduleAbandoned

    try:
        actions = _build(name, request, time.perf_counter() + request.time_limit_s)
    except ScheduleAbandoned as e:
        what = ("its plan grows with the square of the graph: choose auto or chen-sqrt"
                if "actions" in str(e) else "give it a longer time limit")
        return MethodResult(actions=None, status=PlanStatus.error, backend="baseline",
                            notes=[f"{name}: no plan: it was abandoned ({e}); {what}"])
    # The graph's total compute (every node once) bounds every plan's cost from below.
    return MethodResult(
        actions=actions,
        status=PlanStatus.feasible,
        backend="baseline",
        lower_bound=request.graph.total_compute_ms,
    )


def store_all(request: SolveRequest) -> MethodResult:
    return _run("store-all", request)


def recompute_all(request: SolveRequest) -> MethodResult:
    return _run("recompute-all", request)


def chen_sqrt(request: SolveRequest) -> MethodResult:
    return _run("chen-sqrt", request)


def chen_greedy(request: SolveRequest) -> MethodResult:
    return _run("chen-greedy", request)


def best_baseline(request: SolveRequest) -> MethodResult:
    """Every affordable baseline (`bounded_baselines`: recompute-all while its plan stays
    small, nothing started past the time limit); the cheapest plan within budget, else the one
    with the least peak."""
    from planner.sim.simulator import simulate
    from planner.solvers.baselines import bounded_baselines

    deadline = time.perf_counter() + request.time_limit_s
    best: tuple[tuple[int, float, int], str, list[Action]] | None = None
    for name, actions in bounded_baselines(request.graph, request.budget_bytes,
                                           deadline=deadline):
        sim = simulate(request.graph, actions)
        fits = sim.peak_bytes <= request.budget_bytes
        key = (0, sim.compute_cost, sim.peak_bytes) if fits else (1, sim.peak_bytes, 0)
        if best is None or key < best[0]:
            best = (key, name, actions)
    if best is None:
        return MethodResult(actions=None, status=PlanStatus.timeout, backend="baseline",
                            notes=["no baseline finished within the time limit"])
    _, name, actions = best
    return MethodResult(
        actions=actions,
        status=PlanStatus.feasible,
        backend=f"baseline:{name}",
        lower_bound=request.graph.total_compute_ms,
    )


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="store-all", run=store_all,
               summary="keep every activation: the most memory, no recomputation"),
    MethodSpec(name="recompute-all", run=recompute_all,
               summary="keep nothing, recompute every activation for its backward"),
    MethodSpec(name="chen-sqrt", run=chen_sqrt,
               summary="Chen et al.'s sqrt(n) checkpoints, evenly spaced"),
    MethodSpec(name="chen-greedy", run=chen_greedy,
               summary="Chen et al.'s greedy checkpoints within the budget"),
    MethodSpec(name="best-baseline", run=best_baseline,
               summary="every affordable baseline; the cheapest within the budget"),
)
