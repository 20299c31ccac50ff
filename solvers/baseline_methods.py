"""Baselines exposed as planning methods (see planner.engine.registry)."""

from __future__ import annotations

from planner.plan import PlanStatus
from solvers.baselines import BASELINES
from solvers.request import MethodResult, SolveRequest


def _run(name: str, request: SolveRequest) -> MethodResult:
    actions = BASELINES[name](request.graph, request.budget_bytes)
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
    """Every baseline; the cheapest plan within budget, else the one with the least peak."""
    from planner.simulator import simulate

    best: tuple[tuple[int, float, int], str, MethodResult] | None = None
    for name in BASELINES:
        result = _run(name, request)
        assert result.actions is not None
        sim = simulate(request.graph, result.actions)
        fits = sim.peak_bytes <= request.budget_bytes
        key = (0, sim.compute_cost, sim.peak_bytes) if fits else (1, sim.peak_bytes, 0)
        if best is None or key < best[0]:
            best = (key, name, result)
    assert best is not None
    _, name, result = best
    return MethodResult(
        actions=result.actions,
        status=result.status,
        backend=f"baseline:{name}",
        lower_bound=result.lower_bound,
    )
