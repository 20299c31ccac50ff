"""Planning methods backed by the remat solvers; each declares its spec (planner.solvers.spec)
here, its options as a dataclass."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.core.errors import InputError
from planner.core.plan import PlanStatus
from planner.solvers.remat.backends import LP_BACKENDS, MIP_BACKENDS
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option, read_options

if TYPE_CHECKING:  # the solvers load when a method runs: listing the specs needs none of them
    from planner.solvers.remat.exact import RematResult

_STATUS = {"optimal": PlanStatus.optimal, "feasible": PlanStatus.feasible,
           "infeasible": PlanStatus.infeasible, "unknown": PlanStatus.timeout}


_HINT_HELP = "start from the best baseline's plan"


@dataclass(frozen=True)
class MilpOptions:
    backend: str = option("cpsat", "MILP solver", choices=MIP_BACKENDS)
    hint: bool = option(True, _HINT_HELP)


@dataclass(frozen=True)
class LpRoundingOptions:
    backend: str = option("highs-lp", "LP solver", choices=LP_BACKENDS)


@dataclass(frozen=True)
class IntervalsOptions:
    max_computations: int | None = option(
        None, "cap on each node's computations (no bound is claimed then); null: no cap",
        minimum=1)
    hint: bool = option(True, _HINT_HELP)


def _backend(given: object, default: str, allowed: tuple[str, ...]) -> str:
    backend = str(given or default)
    if backend not in allowed:
        raise InputError(f"backend {backend!r}: choose one of {', '.join(allowed)}")
    return backend


SOLVER_OVERRUN_S = 0.5  # CP-SAT ran 0.47 s past a 88.7 s limit (289 nodes, 2 workers)


def _left_s(request: SolveRequest, started: float) -> float:
    """Seconds of the request's limit left since `started`, less the margin for building the
    answer (`auto.final_margin_s`) and for a solver's overrun of its own limit: what a solver
    called now may take."""
    from planner.solvers.remat.auto import final_margin_s

    limit = request.time_limit_s
    elapsed = time.perf_counter() - started
    margin = final_margin_s(len(request.graph.nodes), limit) + min(SOLVER_OVERRUN_S, 0.05 * limit)
    return limit - elapsed - margin


def smallest_budget_bytes(request: SolveRequest, started: float, cap_s: float) -> int | None:
    """The least budget known to work, for an infeasible answer's message, within what is
    left of the limit (None when too little is: the engine then asks the baselines)."""
    from planner.solvers.remat.min_budget import min_budget

    left_s = min(cap_s, _left_s(request, started))
    if left_s < 0.2:
        return None
    return min_budget(request.graph, time_limit_s=left_s, threads=request.threads).peak_bytes


def _result(request: SolveRequest, r: RematResult, started: float) -> MethodResult:
    smallest = None
    if r.actions is None and r.status == "infeasible":
        smallest = smallest_budget_bytes(request, started, 30.0)
    return MethodResult(
        actions=r.actions,
        status=_STATUS[r.status],
        backend=r.backend,
        objective=r.cost,
        lower_bound=r.bound,
        smallest_feasible_bytes=smallest,
        notes=list(r.notes),
        details={"solver_status": r.status, "solver_wall_seconds": round(r.wall_seconds, 3)},
        infeasibility_proven=r.actions is None and r.status == "infeasible",
    )


def _baseline_hint(request: SolveRequest, problem):
    from planner.solvers.baseline_methods import best_baseline
    from planner.solvers.remat.problem import staged_from_actions

    base = best_baseline(request)
    if base.actions is None:
        return None
    return staged_from_actions(problem, base.actions)


def milp(request: SolveRequest) -> MethodResult:
    """Checkmate's MILP; options: backend (cpsat, scip, highs, cbc, pulp-cbc), hint (bool)."""
    from planner.solvers.remat.exact import solve_milp
    from planner.solvers.remat.problem import problem_from_graph

    started = time.perf_counter()
    options = read_options(MilpOptions, request.options)
    backend = _backend(options.backend, MilpOptions.backend, MIP_BACKENDS)
    problem = problem_from_graph(request.graph, request.budget_bytes)
    hint = _baseline_hint(request, problem) if options.hint else None
    # the hint's time counts: at 289 nodes and 90 s the answer came 1.1 s late, and the engine
    # answered with its fallback, which fit nothing, beside the hint that fits
    r = solve_milp(problem, backend, time_limit_s=max(0.1, _left_s(request, started)),
                   threads=request.threads, seed=request.seed, hint=hint,
                   progress=request.progress)
    return _result(request, r, started)


def lp_rounding(request: SolveRequest) -> MethodResult:
    """LP relaxation + two-phase rounding; never over budget, never worse than the baselines
    that fit, and never worse at a larger budget (see `solve_lp_rounding`)."""
    from planner.sim.simulator import simulate
    from planner.solvers.baseline_methods import best_baseline
    from planner.solvers.remat.lp_rounding import solve_lp_rounding
    from planner.solvers.remat.problem import problem_from_graph

    started = time.perf_counter()
    backend = _backend(read_options(LpRoundingOptions, request.options).backend,
                       LpRoundingOptions.backend, LP_BACKENDS)
    problem = problem_from_graph(request.graph, request.budget_bytes)
    base = best_baseline(request)
    base_sim = simulate(request.graph, base.actions) if base.actions is not None else None
    base_fits = base_sim is not None and base_sim.peak_bytes <= request.budget_bytes
    if base_fits and base_sim is not None and request.progress is not None:
        request.progress(base_sim.compute_cost, None)
    r = solve_lp_rounding(problem, backend=backend,
                          time_limit_s=max(0.1, _left_s(request, started)),
                          threads=request.threads, progress=request.progress)
    if r.actions is not None and not (
            base_fits and base_sim is not None and base_sim.compute_cost < (r.cost or 0.0)):
        return _result(request, r, started)
    why = "no rounding fits" if r.actions is None else "it is cheaper than every rounding"
    return MethodResult(
        actions=base.actions, status=PlanStatus.feasible, backend=f"{r.backend}+{base.backend}",
        lower_bound=r.bound, notes=[*r.notes, f"fell back to the best baseline: {why}"],
    )


def cpsat_intervals(request: SolveRequest) -> MethodResult:
    """Moccasin-style CP-SAT interval model; options: max_computations (int, caps each node's
    computations: then its bound is not claimed), hint (bool, from the best baseline)."""
    from planner.solvers.baseline_methods import best_baseline
    from planner.solvers.remat.intervals import solve_intervals
    from planner.solvers.remat.problem import problem_from_graph

    options = read_options(IntervalsOptions, request.options)
    cap = options.max_computations
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise InputError(f"option max_computations {cap!r}: must be an integer ≥ 1")
    started = time.perf_counter()
    hint = None
    if options.hint:
        base = best_baseline(request)
        hint = base.actions
    problem = problem_from_graph(request.graph, request.budget_bytes)
    r = solve_intervals(problem, max_computations=cap,
                        time_limit_s=max(0.1, _left_s(request, started)),
                        threads=request.threads, seed=request.seed, hint=hint,
                        progress=request.progress)
    result = _result(request, r, started)
    if cap is not None:  # a capped model bounds only the capped plans
        result = MethodResult(
            actions=result.actions, status=PlanStatus.feasible if result.actions else result.status,
            backend=result.backend, objective=result.objective, lower_bound=None,
            smallest_feasible_bytes=result.smallest_feasible_bytes,
            notes=[*result.notes, f"computations per node capped at {cap}: no bound claimed"],
            details=result.details,
        )
    return result


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="milp", run=milp, options=MilpOptions, claims_bounds=True,
               summary="Checkmate's MILP: optimal recomputation within the budget, with a "
               "proven bound"),
    MethodSpec(name="lp-rounding", run=lp_rounding, options=LpRoundingOptions,
               claims_bounds=True,
               summary="Checkmate's LP relaxation and two-phase rounding; never worse than "
               "the baselines that fit"),
    MethodSpec(name="cpsat-intervals", run=cpsat_intervals, options=IntervalsOptions,
               claims_bounds=True, summary="Moccasin-style CP-SAT interval model"),
)
