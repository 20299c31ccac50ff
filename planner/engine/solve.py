"""solve(): run a method, check its plan with the simulator, and report honestly.

Whatever a method claims, the returned Plan's peak and cost are the simulator's, a plan over
budget is never reported as feasible, and "optimal" means the gap to a proven bound is closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from planner.engine.registry import MethodResult, SolveRequest, load_method
from planner.errors import InputError
from planner.graph import Graph
from planner.plan import Plan, PlanStatus, relative_gap
from planner.resources import Resources
from planner.simulator import PlanError, lower_bound_peak_bytes, simulate

OPTIMAL_GAP = 1e-9
BOUND_TOLERANCE = 1e-6  # relative: solvers may round costs when scaling them to integers


def solve(
    graph: Graph,
    budget_bytes: int,
    method: str = "auto",
    *,
    time_limit_s: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    progress: Callable[[float | None, float | None], None] | None = None,
    resources: Resources | None = None,
) -> Plan:
    """Plan `graph` within `budget_bytes` of device memory with `method`; `resources` (the
    machine: links, host memory) travel with the plan and its simulation."""
    if budget_bytes < 0:
        raise InputError(f"budget {budget_bytes}: must be ≥ 0 bytes")
    if time_limit_s <= 0:
        raise InputError(f"time limit {time_limit_s}: must be > 0 seconds")
    fn = load_method(method)
    started = time.perf_counter()
    floor_bytes = lower_bound_peak_bytes(graph)
    if budget_bytes < floor_bytes:
        # Proven without solving: some node's inputs, output and workspace alone exceed it.
        proof = MethodResult(
            actions=None,
            status=PlanStatus.infeasible,
            backend="proof",
            notes=[
                f"proven infeasible: computing some node needs {floor_bytes} bytes (its inputs, "
                f"output, workspace and fixed memory), more than the budget of {budget_bytes}"
            ],
            details={"budget_lower_bound_bytes": floor_bytes},
            smallest_feasible_bytes=smallest_baseline_peak_bytes(graph),
        )
        return checked_plan(
            graph, budget_bytes, method, proof, time.perf_counter() - started, resources
        )
    request = SolveRequest(
        graph=graph,
        budget_bytes=budget_bytes,
        time_limit_s=time_limit_s,
        threads=threads,
        seed=seed,
        options=dict(options or {}),
        progress=progress,
        resources=resources,
    )
    result = fn(request)
    wall = time.perf_counter() - started
    return checked_plan(graph, budget_bytes, method, result, wall, resources)


def smallest_baseline_peak_bytes(graph: Graph) -> int:
    """The least peak any baseline reaches: a budget known to work (cheap to compute)."""
    from solvers.baselines import BASELINES

    return min(simulate(graph, fn(graph, None)).peak_bytes for fn in BASELINES.values())


def checked_plan(
    graph: Graph,
    budget_bytes: int,
    method: str,
    result: MethodResult,
    wall_seconds: float,
    resources: Resources | None = None,
) -> Plan:
    """Judge a method's result by the simulator and build the Plan that reports it."""
    common: dict[str, Any] = dict(
        graph_hash=graph.content_hash(),
        budget_bytes=budget_bytes,
        method=method,
        backend=result.backend,
        wall_seconds=wall_seconds,
        notes=list(result.notes),
        details=dict(result.details),
        resources=resources,
    )
    _block_plan_fields(graph, budget_bytes, result, common)
    baseline_cost = graph.total_compute_ms
    bound = max(result.lower_bound or baseline_cost, baseline_cost)
    if result.actions is None:
        if result.smallest_feasible_bytes is not None:
            common["details"]["smallest_feasible_bytes"] = result.smallest_feasible_bytes
        status: PlanStatus = (
            result.status if result.status is not PlanStatus.feasible else PlanStatus.timeout
        )
        return Plan(status=status, lower_bound=bound, **common)
    try:
        sim = simulate(graph, result.actions, resources)
    except PlanError as e:
        common["notes"].append(f"the method returned an invalid plan: {e}")
        return Plan(status=PlanStatus.error, lower_bound=bound, **common)
    predicted = sim.predicted()
    if sim.peak_bytes > budget_bytes:
        common["details"]["smallest_feasible_bytes"] = min(
            sim.peak_bytes, result.smallest_feasible_bytes or sim.peak_bytes
        )
        common["notes"].append(
            f"best plan found peaks at {sim.peak_bytes} bytes, over the budget of "
            f"{budget_bytes} by {sim.peak_bytes - budget_bytes}"
        )
        return Plan(
            status=PlanStatus.infeasible,
            lower_bound=bound,
            predicted=predicted,
            actions=list(result.actions),
            **common,
        )
    if bound > sim.compute_cost * (1 + BOUND_TOLERANCE):
        # A bound above the cost of a plan that exists is wrong (or in other units): keep the
        # one that holds for every plan, so "optimal" is never claimed on its word.
        common["notes"].append(
            f"the method's lower bound {bound:g} exceeds the simulated cost "
            f"{sim.compute_cost:g} of its own plan; using every node once ({baseline_cost:g})"
        )
        bound = baseline_cost
    gap = relative_gap(sim.compute_cost, bound)
    status = PlanStatus.optimal if gap is not None and gap <= OPTIMAL_GAP else PlanStatus.feasible
    return Plan(
        status=status,
        objective=sim.compute_cost,
        lower_bound=min(bound, sim.compute_cost),
        gap=gap,
        predicted=predicted,
        actions=list(result.actions),
        **common,
    )


def _block_plan_fields(
    graph: Graph, budget_bytes: int, result: MethodResult, common: dict[str, Any]
) -> None:
    """A chain solver's block plan goes into the Plan only when its own simulation (one level
    of checkpointing) runs within the budget; else it is dropped with a note saying why."""
    from planner.engine.block_plans import check_block_plan
    from planner.plan import BlockPlan

    details = common["details"]
    block_plan = result.block_plan
    if block_plan is None and isinstance(details.get("block_plan"), dict):
        block_plan = BlockPlan.model_validate(details["block_plan"])  # a version-1 method
    if block_plan is None:
        return
    check = check_block_plan(graph, budget_bytes, block_plan)
    if check.one_level is not None:
        details["block_plan_one_level"] = check.one_level
    if check.block_plan is None:
        details.pop("block_plan", None)  # the Plan would read it back from here
        details.pop("block_plan_text", None)
        common["notes"].append(check.note)
    common["block_plan"] = check.block_plan
