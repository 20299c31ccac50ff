"""The default method, `auto`: the remat portfolio (planner.solvers.remat.auto), then, on a
machine with a host tier, offloading on top of its best plan (planner.solvers.offload.hybrid),
kept only when the event simulator says it is faster. It sits above both families, so that
neither imports the other's methods."""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.core.plan import Action, PlanStatus
from planner.solvers.remat.methods import smallest_budget_bytes
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option, read_options

OFFLOAD_SHARE = 0.3  # of auto's time limit, kept for offloading when the machine has a host tier


@dataclass(frozen=True)
class AutoOptions:
    space: str = option("any", "plans of any schedule, or only those torch.compile executes "
                        "(compiled: method sac, for planner.runtime.compile)",
                        choices=("any", "compiled"))


def auto(request: SolveRequest) -> MethodResult:
    """Pure recomputation (`solve_auto`); on a machine with a host tier, then offloading on top
    of its best plan, kept only when the event simulator says it is faster (remat is a special
    case: auto is never slower than its best pure-remat plan). Option space="compiled": the
    compiled space's method (`sac`) instead."""
    from planner.solvers.remat.auto import solve_auto

    if read_options(AutoOptions, request.options).space == "compiled":
        from planner.solvers.remat.sac import sac

        return sac(request)
    started = time.perf_counter()
    offloading = request.resources is not None and request.resources.has_host_tier
    remat_limit_s = request.time_limit_s * (1 - OFFLOAD_SHARE if offloading else 1.0)
    r = solve_auto(request.graph, request.budget_bytes, time_limit_s=remat_limit_s,
                   threads=request.threads, seed=request.seed, progress=request.progress,
                   incumbent=request.incumbent)
    details = {"source": r.source, "timings_s": {k: round(v, 3) for k, v in r.timings.items()}}
    if offloading and not (r.actions is not None and r.cost is not None
                           and r.cost <= request.graph.total_compute_ms * (1 + 1e-12)):
        faster = _with_offload(request, r.actions, started)
        if faster is not None:
            return faster
    if r.actions is None:
        if not r.proven_infeasible:  # nothing found in time: the CLI reports what fits
            return MethodResult(actions=None, status=PlanStatus.timeout, backend="auto",
                                lower_bound=r.bound, notes=r.notes, details=details)
        smallest = smallest_budget_bytes(request, started, 10.0)
        return MethodResult(actions=None, status=PlanStatus.infeasible, backend="auto",
                            lower_bound=r.bound, notes=r.notes, details=details,
                            smallest_feasible_bytes=smallest, infeasibility_proven=True)
    return MethodResult(
        actions=r.actions, status=PlanStatus.optimal if r.proven_optimal else PlanStatus.feasible,
        backend=f"auto:{r.source}", objective=r.cost, lower_bound=r.bound, notes=r.notes,
        details=details,
    )


def _with_offload(request: SolveRequest, remat_actions: list[Action] | None,
                  started: float) -> MethodResult | None:
    """The best remat plan improved with host copies, when the simulator says it is faster;
    judged by its makespan in the engine (a remat bound does not cover it)."""
    from planner.solvers.offload.hybrid import improve_with_offload

    # Leave the engine its margin to judge the plan (as solve_auto does for its own).
    left_s = request.time_limit_s * 0.93 - (time.perf_counter() - started)
    if left_s <= 0.2:
        return None
    better = improve_with_offload(request.graph, request.budget_bytes, request.resources,
                                  remat_actions, left_s)
    if better is None:
        return None
    note = ("offloading: faster than the best pure-remat plan found" if remat_actions is not None
            else "offloading: no pure-remat plan found; this one parks tensors on the host")
    return MethodResult(actions=better, status=PlanStatus.feasible, backend="auto:remat+offload",
                        notes=[note], details={"source": "remat+offload"})


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="auto", run=auto, plan_kinds=("remat", "remat+offload"),
               options=AutoOptions, claims_bounds=True,
               summary="the portfolio: chain DP, exact models and polish within the time "
               "limit; offloading on top when the machine has a host tier"),
)
