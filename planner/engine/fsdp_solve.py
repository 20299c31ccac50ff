"""An FSDP method run by `solve()` and the service: the method chooses one rank's settings
(`MethodResult.fsdp`), and the plan (kind fsdp) is judged here by the simulator
(`planner.sim.simulator.simulate` -> `planner.sim.fsdp_plans`) like every other plan: its peak
is the simulated rank peak (sharded state plus the step's peak) against the per-rank budget,
its objective the simulated step time in ms, a claimed bound above it an error."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from planner.core.graph import Graph
from planner.core.plan import Plan, PlanKind, PlanStatus, Predicted, graph_reference, relative_gap
from planner.core.resources import Resources
from planner.engine.judge import BOUND_TOLERANCE
from planner.engine.registry import SolveRequest, load_method
from planner.sim.simulator import simulate

OPTIMAL_GAP = 1e-9


def check_fsdp_request(graph: Graph, options: Mapping[str, object] | None) -> None:
    """At submission: the graph carries an FSDP model profiled for the ranks asked
    (InputError, field `graph`), the depths read (`options.depths`)."""
    from planner.sim.fsdp_plans import fsdp_model_of
    from planner.solvers.fsdp.methods import FsdpOptions, parse_depths

    opts = dict(options or {})
    parse_depths(str(opts.get("depths", FsdpOptions.depths)))
    fsdp_model_of(graph, int(opts.get("ranks", FsdpOptions.ranks)))  # type: ignore[call-overload]


def fsdp_reference_peak_bytes(graph: Graph, options: Mapping[str, object] | None,
                              resources: Resources | None = None) -> int:
    """One rank's whole peak with every block kept, resharded after forward and one block
    prefetched (FSDP2's defaults): what a relative budget (`80%`) of an FSDP method is of."""
    from planner.core.plan import FsdpSettings
    from planner.sim.fsdp import FsdpPlan
    from planner.sim.fsdp_plans import fsdp_model_of, simulate_fsdp_settings
    from planner.solvers.fsdp.methods import FsdpOptions

    opts = dict(options or {})
    ranks = int(opts.get("ranks", FsdpOptions.ranks))  # type: ignore[call-overload]
    blocks = len(fsdp_model_of(graph, ranks).blocks)
    backend: Literal["nccl", "gloo"] = (
        "gloo" if opts.get("backend", FsdpOptions.backend) == "gloo" else "nccl")
    settings = FsdpSettings(ranks=ranks, text=FsdpPlan.uniform(blocks, "keep").text(),
                            collectives=backend)
    result, _ = simulate_fsdp_settings(graph, settings, resources)
    return result.peak_bytes


def solve_fsdp_plan(graph: Graph, budget_bytes: int, method: str, *, time_limit_s: float,
                    threads: int = 2, seed: int = 0, options: Mapping[str, Any] | None = None,
                    resources: Resources | None = None) -> Plan:
    """`solve()` for an FSDP method: `budget_bytes` is each rank's memory."""
    started = time.perf_counter()
    request = SolveRequest(graph=graph, budget_bytes=budget_bytes, time_limit_s=time_limit_s,
                           threads=threads, seed=seed, options=dict(options or {}),
                           resources=resources)
    result = load_method(method)(request)
    common: dict[str, Any] = dict(
        graph_hash=graph.content_hash(), budget_bytes=budget_bytes, method=method,
        backend=result.backend, notes=list(result.notes), details=dict(result.details),
        resources=resources, **graph_reference(graph))
    if result.fsdp is None:  # no plan at all
        if result.smallest_feasible_bytes is not None:
            common["details"]["smallest_feasible_bytes"] = result.smallest_feasible_bytes
        status = (result.status if result.status not in (PlanStatus.optimal, PlanStatus.feasible)
                  else PlanStatus.error)
        return Plan(status=status, wall_seconds=time.perf_counter() - started, **common)
    draft = Plan(kind=PlanKind.fsdp, fsdp=result.fsdp, status=PlanStatus.feasible, **common)
    sim = simulate(graph, draft, resources)
    ranks = result.fsdp.ranks
    predicted = Predicted(
        peak_bytes=sim.peak_bytes, compute_cost=sim.compute_cost, overhead=sim.overhead,
        per_rank_peak_bytes=[sim.peak_bytes] * ranks, compute_ms=sim.compute_ms,
        transfer_ms=sim.transfer_ms, exposed_transfer_ms=sim.exposed_transfer_ms,
        makespan_ms=sim.makespan_ms)
    step_ms = sim.makespan_ms
    common["notes"].append("objective: the simulated step time of one rank in ms (compute, "
                           "all-gathers and reduce-scatters overlapping); peak: the rank's "
                           "sharded state plus the step's peak, against the per-rank budget")
    fields: dict[str, Any] = dict(kind=PlanKind.fsdp, fsdp=result.fsdp, predicted=predicted,
                                  objective=step_ms, **common)
    if sim.peak_bytes > budget_bytes:
        common["details"]["smallest_feasible_bytes"] = min(
            sim.peak_bytes, result.smallest_feasible_bytes or sim.peak_bytes)
        common["notes"].append(
            f"best plan found peaks at {sim.peak_bytes} bytes per rank, over the budget of "
            f"{budget_bytes} by {sim.peak_bytes - budget_bytes}")
        fields["lower_bound"] = result.lower_bound
        return Plan(status=PlanStatus.infeasible, wall_seconds=time.perf_counter() - started,
                    **fields)
    bound = result.lower_bound
    if bound is not None and bound > step_ms * (1 + BOUND_TOLERANCE):
        common["notes"].append(
            f"method {method}, backend {result.backend} claims a lower bound of {bound:g} ms, "
            f"above its own plan's simulated step of {step_ms:g} ms: the claim is false")
        return Plan(status=PlanStatus.error, wall_seconds=time.perf_counter() - started,
                    **fields)
    gap = relative_gap(step_ms, bound)
    judged: PlanStatus = (PlanStatus.optimal if gap is not None and gap <= OPTIMAL_GAP
              else PlanStatus.feasible)
    return Plan(status=judged, lower_bound=bound if bound is None else min(bound, step_ms),
                gap=gap, wall_seconds=time.perf_counter() - started, **fields)
