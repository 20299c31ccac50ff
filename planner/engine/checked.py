"""A method's result judged by the simulator and reported as a Plan (`checked_plan`): its
status, objective and gap from the simulated plan, a claimed bound held against every plan
known to fit, a plan over budget or with host copies reported as such."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from planner.core.graph import Graph
from planner.core.plan import (
    Action,
    ActionOp,
    Plan,
    PlanStatus,
    Predicted,
    graph_reference,
    relative_gap,
)
from planner.core.resources import Resources
from planner.engine.judge import BOUND_TOLERANCE, KnownPlan, contradicting_plan
from planner.engine.registry import MethodResult
from planner.sim.simulator import PlanError, SimulationResult, simulate

OPTIMAL_GAP = 1e-9


def checked_plan(
    graph: Graph,
    budget_bytes: int,
    method: str,
    result: MethodResult,
    wall_seconds: float,
    resources: Resources | None = None,
    known: Iterable[KnownPlan] = (),
    deadline: float | None = None,
    simulated: SimulationResult | None = None,
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
        **graph_reference(graph),
    )
    _block_plan_fields(graph, budget_bytes, result, common)
    baseline_cost = graph.total_compute_ms
    bound = max(result.lower_bound or baseline_cost, baseline_cost)
    if result.actions is None:
        return _planless(graph, budget_bytes, method, result, bound, known, common)
    try:
        sim = simulated if simulated is not None else simulate(
            graph, result.actions, resources, deadline=deadline)
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
    if predicted.makespan_ms is not None and _copies_to_host(result.actions):
        return _host_copy_plan(result.actions, predicted, baseline_cost, common)
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


def _planless(graph: Graph, budget_bytes: int, method: str, result: MethodResult, bound: float,
              known: Iterable[KnownPlan], common: dict[str, Any]) -> Plan:
    """The report of a result without a plan: its status, and its claimed bound (infinite for
    a proven infeasible budget) held against every plan known to fit."""
    baseline_cost = graph.total_compute_ms
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


def _copies_to_host(actions: Sequence[Action]) -> bool:
    return any(a.op is ActionOp.offload for a in actions)


def _host_copy_plan(actions: Sequence[Action], predicted: Predicted, every_node_once_ms: float,
                    common: dict[str, Any]) -> Plan:
    """A plan with host copies is judged by its makespan (transfers overlapping compute), not by
    its compute cost: a remat bound does not cover it (parking on the host lets it recompute
    less). Its bound is the compute stream running every node once, which no plan beats."""
    assert predicted.makespan_ms is not None
    makespan_ms = predicted.makespan_ms
    gap = relative_gap(makespan_ms, every_node_once_ms)
    status = PlanStatus.optimal if gap is not None and gap <= OPTIMAL_GAP else PlanStatus.feasible
    common["notes"].append(
        "objective: the simulated makespan in ms (compute with host copies overlapping); bound: "
        "every node computed once"
    )
    return Plan(status=status, objective=makespan_ms,
                lower_bound=min(every_node_once_ms, makespan_ms), gap=gap, predicted=predicted,
                actions=list(actions), **common)


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
    from planner.core.plan import BlockPlan
    from planner.engine.block_plans import check_block_plan

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
