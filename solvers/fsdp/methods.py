"""The FSDP planner as a planning method, with its spec (planner.solvers.spec): `fsdp`.

It reads the graph's FSDP model (`metadata.extra["fsdp_model"]`, written by `planner-cli trace
--fsdp-ranks`), takes the link from the resources' `device_link` and runs `solve_fsdp` for the
fastest simulated step within the per-rank budget. It hands back the plan's settings in
`MethodResult.fsdp` (no actions); the engine judges them with the simulator
(planner.engine.fsdp_solve). No torch: the service runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import InputError
from planner.core.plan import FsdpSettings, PlanStatus
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option


@dataclass(frozen=True)
class FsdpOptions:
    ranks: int = option(2, "FSDP ranks (world size); the budget is each rank's", minimum=1,
                        maximum=1 << 20)
    depths: str = option("0,1,2", "prefetch depths to try, comma-separated (blocks ahead)")
    backend: str = option("nccl", "the collectives' backend (gloo allocates a temporary copy "
                          "per collective)", choices=("nccl", "gloo"))
    exact_limit: int = option(20000, "search every plan when the space has at most this many "
                              "(else a local search)", minimum=1, maximum=1_000_000)


def parse_depths(text: str) -> tuple[int, ...]:
    """'0,1,2' -> (0, 1, 2); InputError (field options.depths) otherwise."""
    try:
        depths = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        depths = ()
    if not depths or min(depths) < 0:
        raise InputError(f"{text!r}: give prefetch depths ≥ 0, comma-separated (e.g. 0,1,2)",
                         field="options.depths")
    return depths


def fsdp_method(request: SolveRequest) -> MethodResult:
    """The fastest simulated FSDP plan within the per-rank budget (planner.solvers.fsdp.search):
    exact when the plan space is small (status optimal), else a local search (feasible); when
    nothing fits, the least-peak plan found and its peak as the smallest budget known."""
    from planner.sim.fsdp_plans import fsdp_link, fsdp_model_of
    from planner.solvers.fsdp.search import solve_fsdp

    chosen = FsdpOptions(**{k: v for k, v in request.options.items()
                            if k in FsdpOptions.__dataclass_fields__})
    depths = parse_depths(chosen.depths)
    model = fsdp_model_of(request.graph, chosen.ranks)
    link, link_note = fsdp_link(request.resources)
    sol = solve_fsdp(model, request.budget_bytes, chosen.ranks, link, chosen.backend, depths,
                     chosen.exact_limit)
    settings = FsdpSettings.model_validate(
        {"ranks": chosen.ranks, "text": sol.plan.text(), "collectives": chosen.backend})
    notes = [f"FSDP over {chosen.ranks} ranks: {sol.text()}"]
    if link_note:
        notes.append(link_note)
    details = {"fsdp_search": sol.status, "plans_simulated": sol.evaluated,
               "compute_bound_ms": sol.lower_bound_ms, "least_peak_bytes": sol.least_peak_bytes}
    if sol.status == "infeasible":
        return MethodResult(actions=None, status=PlanStatus.infeasible, backend="fsdp-search",
                            objective=sol.result.step_ms, lower_bound=sol.lower_bound_ms,
                            smallest_feasible_bytes=sol.least_peak_bytes, notes=notes,
                            details=details, fsdp=settings)
    exact = sol.status == "optimal"
    return MethodResult(
        actions=None, status=PlanStatus.optimal if exact else PlanStatus.feasible,
        backend="fsdp-exact" if exact else "fsdp-local",
        objective=sol.result.step_ms,
        # every plan of the space simulated: none is faster (the bound is the step itself)
        lower_bound=sol.result.step_ms if exact else sol.lower_bound_ms,
        smallest_feasible_bytes=sol.least_peak_bytes, notes=notes, details=details,
        fsdp=settings)


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="fsdp", run=fsdp_method, options=FsdpOptions, plan_kinds=("fsdp",),
               claims_bounds=True,
               summary="FSDP2: per-block AC policy, reshard-after-forward and prefetch depth, "
               "fastest simulated step within the per-rank budget"),
)
