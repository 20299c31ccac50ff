"""solve(): run a method, check its plan with the simulator, and report honestly.

Whatever a method claims, the returned Plan's peak and cost are the simulator's, a plan over
budget is never reported as feasible, "optimal" means the gap to a proven bound is closed, and a
claimed bound above the cost of any plan known to fit (`planner.engine.judge`) is an error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from planner.engine.judge import (
    BOUND_TOLERANCE,
    PLAN_BOOK,
    KnownPlan,
    contradicting_plan,
    known_plan,
)
from planner.engine.progress import ProgressFn, monotone_progress
from planner.engine.registry import MethodResult, SolveRequest, load_method
from planner.errors import InputError
from planner.graph import Graph
from planner.limits import check_time_limit
from planner.plan import Action, Plan, PlanStatus, relative_gap
from planner.resources import Resources
from planner.simulator import PlanError, lower_bound_peak_bytes, simulate

OPTIMAL_GAP = 1e-9


def solve(
    graph: Graph,
    budget_bytes: int,
    method: str = "auto",
    *,
    time_limit_s: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    resources: Resources | None = None,
    known_plans: Iterable[tuple[str, Sequence[Action]]] = (),
) -> Plan:
    """Plan `graph` within `budget_bytes` of device memory with `method`; `resources` (the
    machine: links, host memory) travel with the plan and its simulation.

    `progress(best_objective, best_bound)` is called as the method's incumbent or bound
    improves (objective non-increasing, bound non-decreasing, bound ≤ objective; the bound is
    at least every node computed once). `known_plans` ((source, actions), e.g. a sweep's plans
    at smaller budgets) join the plans a claimed bound is checked against."""
    if budget_bytes < 0:
        raise InputError(f"budget {budget_bytes}: must be ≥ 0 bytes")
    time_limit_s = check_time_limit(time_limit_s, "time limit")
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
        progress=(reporter := monotone_progress(progress, graph.total_compute_ms)),
        resources=resources,
    )
    result = fn(request)
    wall = time.perf_counter() - started
    witnesses = [k for source, actions in known_plans
                 if (k := known_plan(graph, source, actions)) is not None]
    plan = checked_plan(graph, budget_bytes, method, result, wall, resources, witnesses)
    if plan.status in (PlanStatus.optimal, PlanStatus.feasible) and plan.actions:
        mine = known_plan(graph, f"{method}/{plan.backend}", plan.actions)
        if mine is not None:
            PLAN_BOOK.add(plan.graph_hash, mine)
        if reporter is not None:  # the simulator's cost, the judged bound
            reporter(plan.objective, plan.lower_bound)
    return plan


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
    known: Iterable[KnownPlan] = (),
) -> Plan:
    """Judge a method's result by the simulator and build the Plan that reports it; a claimed
    bound is held against the method's own plan and every plan known to fit (`known`, the
    baselines', those judged earlier in this process)."""
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
        proof = status is PlanStatus.infeasible and result.infeasibility_proven
        claimed = float("inf") if proof else bound
        if claimed > baseline_cost * (1 + BOUND_TOLERANCE) and result.backend != "proof":
            witness = contradicting_plan(graph, budget_bytes, claimed, known)
            if witness is not None:
                common["notes"].append(_contradiction(method, result, claimed, witness, graph))
                return Plan(status=PlanStatus.error, lower_bound=baseline_cost, **common)
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
    if bound > baseline_cost * (1 + BOUND_TOLERANCE):
        # A bound above the cost of a plan that exists is false (or in other units), and so is
        # any "optimal" resting on it: an error, not a report.
        own = KnownPlan("its own plan", sim.compute_cost, sim.peak_bytes)
        witness = (own if bound > sim.compute_cost * (1 + BOUND_TOLERANCE)
                   else contradicting_plan(graph, budget_bytes, bound, known))
        if witness is not None:
            common["notes"].append(_contradiction(method, result, bound, witness, graph))
            return Plan(status=PlanStatus.error, objective=sim.compute_cost,
                        lower_bound=baseline_cost, predicted=predicted,
                        actions=list(result.actions), **common)
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


def _contradiction(
    method: str, result: MethodResult, bound: float, witness: KnownPlan, graph: Graph
) -> str:
    """One note: who claimed what, and the plan within the budget that refutes it."""
    total = graph.total_compute_ms

    def cost_text(cost: float) -> str:
        return f"{cost:g} ({100 * (cost / total - 1):+.3f} %)" if total > 0 else f"{cost:g}"

    claim = ("that no plan fits" if bound == float("inf")
             else f"a lower bound of {cost_text(bound)}")
    return (f"method {method}, backend {result.backend} claims {claim}, but {witness.source} "
            f"costs {cost_text(witness.cost)} at a peak of {witness.peak_bytes} bytes, within "
            f"the budget: the claim exceeds the simulated cost of a plan that exists, so it is "
            f"false and no status, bound or gap is reported from it")


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
