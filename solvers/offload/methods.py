"""Planning methods with host offloading, with their specs (planner.solvers.spec).

Every method needs resources with a host tier (host_memory_bytes > 0, h2d/d2h links): without
one it raises one InputError line (use a recomputation method instead). The device budget is
`request.budget_bytes`; host memory and links come from `request.resources`. Plans are judged
by the event simulator (planner.sim.copy_streams): a plan returned fits both; when none is found the
result is infeasible with a note naming the peaks of the closest plan (the least host memory it
needs when the host is what overflows).

- `offload-all`: torchtune / save_on_cpu; option `min_bytes`.
- `offload-greedy`: offload all, bring back the largest that fit, reloads just in time.
- `offload-beaumont`: Beaumont et al. 2020-style heuristics (planner.solvers.offload.heuristics).
- `offload-remat`: remat plans at larger budgets + offloading, never slower than the pure-remat
  plan `auto` finds in part of the time (planner.solvers.offload.hybrid).
- `offload-milp`: the exact model on Checkmate's stage grid (planner.solvers.offload.milp).
- `pofo`: the chain DP combining recomputation and offloading (planner.solvers.offload.pofo).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from planner.core.errors import InputError
from planner.solvers.offload.options import OffloadAllOptions, OffloadMilpOptions, PofoOptions
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, read_options

if TYPE_CHECKING:  # the solvers load when a method runs: listing the specs needs none of them
    from planner.solvers.offload.heuristics import HeuristicResult
    from planner.solvers.offload.search import Judge


def _deadline(request: SolveRequest, share: float = 0.9) -> float:
    return time.perf_counter() + max(0.05, request.time_limit_s * share)


def _heuristic(request: SolveRequest, name: str) -> tuple[Judge, HeuristicResult]:
    from planner.solvers.baselines import store_all
    from planner.solvers.offload import heuristics
    from planner.solvers.offload.search import Judge, require_host_tier

    resources = require_host_tier(request.resources, name)
    judge = Judge(request.graph, request.budget_bytes, resources)
    base = store_all(request.graph)
    if name == "offload-all":
        min_bytes = read_options(OffloadAllOptions, request.options).min_bytes
        if not isinstance(min_bytes, int) or isinstance(min_bytes, bool) or min_bytes < 0:
            raise InputError(f"option min_bytes {min_bytes!r}: must be an integer ≥ 0")
        return judge, heuristics.offload_all(judge, base, min_bytes)
    if name == "offload-greedy":
        return judge, heuristics.offload_greedy(judge, base, _deadline(request))
    return judge, heuristics.beaumont(judge, base, _deadline(request))


def _heuristic_method(request: SolveRequest, name: str) -> MethodResult:
    from planner.solvers.offload.search import judged_result

    judge, r = _heuristic(request, name)
    notes = [] if r.windows else ["no activation is idle between two uses: nothing to offload"]
    return judged_result(request, judge, r.best, r.source, notes, {"windows": r.windows})


def offload_all(request: SolveRequest) -> MethodResult:
    """Offload every saved activation ≥ min_bytes (torchtune / save_on_cpu)."""
    return _heuristic_method(request, "offload-all")


def offload_greedy(request: SolveRequest) -> MethodResult:
    """Offload all, bring back the largest that fit, prefetch just in time."""
    return _heuristic_method(request, "offload-greedy")


def offload_beaumont(request: SolveRequest) -> MethodResult:
    """Beaumont et al. 2020-style heuristics (divisible and bandwidth relaxations)."""
    return _heuristic_method(request, "offload-beaumont")


def offload_remat(request: SolveRequest) -> MethodResult:
    """Recomputation and offloading: the best of pure remat (auto, 40 % of the time) and remat
    plans at larger budgets brought down by offloading (the rest)."""
    from planner.solvers.offload.hybrid import remat_offload_search
    from planner.solvers.offload.search import Judge, judged_result, require_host_tier
    from planner.solvers.remat.auto import solve_auto

    resources = require_host_tier(request.resources, "offload-remat")
    started = time.perf_counter()
    remat = solve_auto(request.graph, request.budget_bytes,
                       time_limit_s=max(0.5, 0.4 * request.time_limit_s),
                       threads=request.threads, seed=request.seed)
    deadline = started + 0.9 * request.time_limit_s
    judge = Judge(request.graph, request.budget_bytes, resources)
    best, source = remat_offload_search(request.graph, request.budget_bytes, resources,
                                        max(deadline, time.perf_counter() + 0.2), remat.actions)
    notes = [] if remat.actions is not None else ["auto found no pure-remat plan in its time"]
    return judged_result(request, judge, best, f"offload-remat:{source}", notes,
                         {"remat_source": remat.source})


def offload_milp(request: SolveRequest) -> MethodResult:
    from planner.solvers.offload.milp import milp_method

    return milp_method(request)


def pofo(request: SolveRequest) -> MethodResult:
    from planner.solvers.offload.pofo_method import pofo_method

    return pofo_method(request)


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="offload-all", run=offload_all, options=OffloadAllOptions,
               plan_kinds=("offload",), needs_host_tier=True,
               summary="offload every saved activation of at least min_bytes (torchtune, "
               "save_on_cpu)"),
    MethodSpec(name="offload-greedy", run=offload_greedy, plan_kinds=("offload",),
               needs_host_tier=True,
               summary="offload all, bring back the largest that fit, prefetch just in time"),
    MethodSpec(name="offload-beaumont", run=offload_beaumont, plan_kinds=("offload",),
               needs_host_tier=True, summary="Beaumont et al. 2020-style offloading heuristics"),
    MethodSpec(name="offload-remat", run=offload_remat, plan_kinds=("remat", "remat+offload"),
               needs_host_tier=True,
               summary="remat plans at larger budgets brought down by offloading; never slower "
               "than auto's pure-remat plan"),
    MethodSpec(name="offload-milp", run=offload_milp, options=OffloadMilpOptions,
               plan_kinds=("offload", "remat+offload"), needs_host_tier=True,
               summary="the exact offloading model on Checkmate's stage grid (bound only in "
               "its space)"),
    MethodSpec(name="pofo", run=pofo, options=PofoOptions, plan_kinds=("remat", "remat+offload"),
               needs_host_tier=True,
               summary="the chain DP combining recomputation and offloading (POFO)"),
)
