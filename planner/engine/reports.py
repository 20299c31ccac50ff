"""Plan reports: the one summary of a plan that the CLI prints and the service returns."""

from __future__ import annotations

from planner.core.graph import Graph
from planner.core.plan import Plan
from planner.engine.transfer_report import transfer_summary
from planner.solvers.baselines import store_all_peak_bytes


def plan_summary(plan: Plan, graph: Graph) -> dict[str, object]:
    peak = plan.predicted.peak_bytes if plan.predicted else None
    return {
        "status": plan.status.value,
        "method": plan.method,
        "backend": plan.backend,
        "budget_bytes": plan.budget_bytes,
        "peak_bytes": peak,
        "store_all_peak_bytes": store_all_peak_bytes(graph),
        "compute_cost": plan.predicted.compute_cost if plan.predicted else None,
        "overhead_percent": 100 * plan.predicted.overhead if plan.predicted else None,
        "objective": plan.objective,
        "lower_bound": plan.lower_bound,
        "gap_percent": None if plan.gap is None else 100 * plan.gap,
        "wall_seconds": round(plan.wall_seconds, 3),
        "actions": len(plan.actions),
        "smallest_feasible_bytes": plan.details.get("smallest_feasible_bytes"),
        "notes": plan.notes,
        "kind": plan.kind.value if plan.kind is not None else None,
        "resources": plan.resources.model_dump(mode="json") if plan.resources else None,
        **_event_figures(plan),
        **transfer_summary(plan, graph),
    }


def _event_figures(plan: Plan) -> dict[str, object]:
    """The event simulator's figures where the plan has them (transfers, pipelines)."""
    if plan.predicted is None:
        return {}
    keys = ("makespan_ms", "host_peak_bytes", "transfer_ms", "exposed_transfer_ms",
            "per_rank_peak_bytes", "throughput_per_s", "bubble_fraction")
    figures = plan.predicted.model_dump(include=set(keys))
    return {k: v for k, v in figures.items() if v is not None}
