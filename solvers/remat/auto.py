"""`auto`: a fast feasible plan first, then exact improvement, with a proven bound.

1. Baselines, dynamic eviction (DTR-style) and greedy checkpoint eviction, in the graph's
   order and in memory-aware reorderings (store-all in a better order often fits at no extra
   compute): in-budget plans within seconds on the Checkmate graphs.
2. The LP relaxation (HiGHS) of the frontier-advancing MILP, on graphs small enough for it to
   finish: a lower bound and LP-rounded plans; then the MILP itself on CP-SAT, hinted with the
   best plan, for half the time left (≤ 100 nodes): it often proves optimality fast.
3. The CP-SAT interval model (Moccasin-style), hinted with the best plan, using every thread for
   the time left. Its bound counts only when every node may be computed as often as the MILP
   allows (small graphs); on larger graphs recomputations per node are capped, which makes the
   model small and fast but its bound no proof.
The best in-budget plan found in time is returned with its gap, against the bound that covers
it: LP/MILP bounds cover Checkmate's staged schedules (first computations in the graph's order,
ascending recomputations between them); the uncapped interval model's bound covers any schedule
whose first computations follow the graph's order; a plan that reorders gets the universal
bound (every node computed once).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from planner.graph import Graph
from planner.plan import Action
from planner.simulator import lower_bound_peak_bytes, simulate
from solvers.baselines import BASELINES, store_all
from solvers.order import schedule_order
from solvers.remat.dtr import best_dtr
from solvers.remat.exact import RematResult, solve_milp
from solvers.remat.greedy import greedy_eviction
from solvers.remat.intervals import solve_intervals
from solvers.remat.lp_rounding import lp_relaxation, round_lp
from solvers.remat.orders import explore_orders, with_order
from solvers.remat.problem import (
    RematProblem,
    problem_from_graph,
    staged_actions,
    staged_from_actions,
)
from solvers.remat.stop import Progress, SearchStop

EXACT_INTERVALS_MAX_NODES = 30  # up to here the interval model allows every recomputation
LP_MAX_NODES = 120
MILP_MAX_NODES = 100
GAP_TO_STOP = 1e-4  # HiGHS's gap tolerance: a proof this close ends the other searches
RECOMPUTATIONS_CAP = 2  # computations per node in the interval model on larger graphs


@dataclass
class AutoResult:
    actions: list[Action] | None
    cost: float | None
    source: str
    bound: float
    proven_optimal: bool
    proven_infeasible: bool = False
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def solve_auto(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
               threads: int = 2, seed: int = 0, progress: Progress | None = None) -> AutoResult:
    """`progress(objective, bound)` hears of every better plan (the simulator's cost) and every
    better bound, as soon as each phase or search finds it."""
    started = time.perf_counter()
    deadline = started + time_limit_s * 0.93

    def left() -> float:
        return deadline - time.perf_counter()

    problem = problem_from_graph(graph, budget_bytes)
    least = lower_bound_peak_bytes(graph)
    if least > budget_bytes:  # some node's inputs, output and workspace alone exceed it
        return AutoResult(None, None, "none", problem.total_cost, False, True,
                          [f"no schedule fits: computing one node needs {least} bytes"])
    best: tuple[float, list[Action], str] | None = None
    bound = order_bound = problem.total_cost  # raised by the LP, MILP and interval searches
    given = schedule_order(graph)
    notes: list[str] = []
    timings: dict[str, float] = {}

    def offer(actions: list[Action] | None, source: str) -> None:
        nonlocal best
        if actions is None:
            return
        sim = simulate(graph, actions)
        if sim.peak_bytes <= budget_bytes and (best is None or sim.compute_cost < best[0]):
            best = (sim.compute_cost, actions, source)
            tell()

    def covers(found_bound: float) -> bool:
        """Whether a bound of a search in the graph's order covers the best plan: not when the
        plan reorders, nor when it is cheaper (then it lies outside the search's space)."""
        return best is None or (found_bound <= best[0] and _follows(best[1], given))

    def tell() -> None:
        if progress is not None and best is not None:
            progress(best[0], bound if covers(bound) else None)

    def report_in_order(objective: float | None, found_bound: float | None) -> None:
        if progress is not None:
            progress(objective, found_bound if found_bound is not None and covers(found_bound)
                     else None)

    # None without a listener: the searches then install no callbacks at all.
    within_order = report_in_order if progress is not None else None

    for name, fn in BASELINES.items():
        offer(fn(graph, budget_bytes), f"baseline:{name}")
    order_of: dict[str, list[int]] = {}
    lowest: tuple[int, str, list[int]] | None = None  # random order with the least peak
    for name, order in explore_orders(graph, budget_bytes, started + 0.25 * time_limit_s, seed):
        ordered = with_order(graph, order)
        order_of[f"store-all@{name}"] = order_of[f"dtr@{name}"] = order
        plan = store_all(ordered)
        offer(plan, f"store-all@{name}")
        if name.startswith("random"):  # many of these: only the most promising gets DTR
            peak = simulate(graph, plan).peak_bytes
            if lowest is None or peak < lowest[0]:
                lowest = (peak, name, order)
            continue
        offer(best_dtr(problem_from_graph(ordered, budget_bytes),
                       time_limit_s=max(0.2, 0.03 * time_limit_s)), f"dtr@{name}")
    if lowest is not None and (best is None or not best[2].startswith("store-all")):
        _, name, order = lowest
        offer(best_dtr(problem_from_graph(with_order(graph, order), budget_bytes),
                       time_limit_s=max(0.2, 0.03 * time_limit_s)), f"dtr@{name}")
    if best is None or best[0] > problem.total_cost * (1 + 1e-12):  # else nothing to improve
        offer(greedy_eviction(graph, budget_bytes, time_limit_s=max(0.3, 0.1 * time_limit_s)),
              "greedy")
    timings["first_plans_s"] = time.perf_counter() - started
    # Two bounds, valid over different spaces: `bound` (LP, MILP) over Checkmate's staged
    # schedules only; `order_bound` (the uncapped interval model) over every schedule whose
    # first computations follow the graph's order, staged or not.
    zero = best is not None and best[0] <= bound * (1 + 1e-12)
    if problem.n <= LP_MAX_NODES and left() > 2 and not zero:
        t0 = time.perf_counter()
        lp_time = min(left() * 0.5, 0.2 * time_limit_s)
        lp = lp_relaxation(problem, backend="highs-lp", time_limit_s=lp_time)
        if lp.bound is not None:
            bound = max(bound, lp.bound)
            tell()
            sched, _ = round_lp(problem, lp)
            if sched is not None:
                offer(staged_actions(problem, sched)[0], "lp-rounding")
        else:
            notes.append(f"LP relaxation: {lp.status} within {lp_time:.1f} s")
        timings["lp_s"] = time.perf_counter() - t0
    proven = best is not None and best[0] <= bound * (1 + 1e-9)
    # Improve within the order of the best plan so far (its hint then fits the model); when the
    # capped model is solved to optimality, allow more recomputations and go again.
    order = given
    if best is not None:
        order = order_of.get(best[2], given)
    stop = SearchStop()
    race: _HighsRace | None = None
    workers = threads
    if not proven and problem.n <= MILP_MAX_NODES and order == given and left() > 2.0:
        # The frontier MILP often proves optimality fast on mid-sized graphs: HiGHS (its own
        # thread, no hint) races the CP-SAT searches below and stops them once it has a proof.
        if threads >= 2:
            race = _HighsRace(problem, left(), seed, stop, within_order)
            workers = threads - 1
        t1 = time.perf_counter()
        hint = staged_from_actions(problem, best[1]) if best is not None else None
        r = solve_milp(problem, "cpsat", time_limit_s=0.5 * left(), threads=workers, seed=seed,
                       hint=hint, stop=stop, progress=within_order)
        if r.bound is not None:
            bound = max(bound, r.bound)
        offer(r.actions, "milp:cpsat")
        proven = best is not None and best[0] <= bound * (1 + 1e-9)
        timings["milp_s"] = time.perf_counter() - t1
    cap: int | None = None if problem.n <= EXACT_INTERVALS_MAX_NODES else RECOMPUTATIONS_CAP
    ordered_problem = problem_from_graph(with_order(graph, order), budget_bytes)
    t0 = time.perf_counter()
    while not proven and not stop.stopped and left() > 1.0:
        r = solve_intervals(ordered_problem, max_computations=cap, time_limit_s=left(),
                            threads=workers, seed=seed, hint=best[1] if best is not None else None,
                            stop=stop, progress=(within_order if order == given
                                                 else _objective_only(progress)))
        offer(r.actions, "cpsat-intervals" + ("" if order == given else "@reordered"))
        if cap is None and order == given:  # every recomputation allowed: a real bound
            if r.bound is not None:
                order_bound = max(order_bound, r.bound)
                bound = max(bound, r.bound)
            if r.status == "infeasible":  # in this order only: a reordering may still fit
                notes.append("the interval model proves no plan in the graph's order fits")
        if cap is None or r.status != "optimal":
            break
        cap = cap + 1 if cap + 1 < problem.n // 2 else None
        notes.append(f"capped interval model optimal; recomputations per node now {cap or 'any'}")
        proven = best is not None and best[0] <= bound * (1 + 1e-9)
    timings["intervals_s"] = time.perf_counter() - t0
    if race is not None:
        raced = race.result(timeout_s=max(0.0, left()) + 0.05 * time_limit_s)
        if raced is None:
            notes.append("the HiGHS MILP overran the time limit; its result is not used")
        else:
            if raced.bound is not None:
                bound = max(bound, raced.bound)
            offer(raced.actions, "milp:highs")
        timings["milp_highs_s"] = race.wall_seconds
    if best is None:
        return AutoResult(None, None, "none", bound, False, False, notes, timings)
    cost, actions, source = best
    if not _follows(actions, given):
        # Bounds above hold for schedules in the graph's order; this plan reorders, so only
        # the universal bound (every node once) is claimed.
        notes.append("the plan reorders first computations; bound = every node computed once")
        bound = problem.total_cost
    elif bound > order_bound and staged_from_actions(problem, actions) is None:
        # Cheaper than Checkmate's staged form allows, or just outside it: the LP/MILP bound
        # covers staged schedules only.
        notes.append(f"the plan is not in Checkmate's staged form; the staged-space bound "
                     f"{_increase(bound, problem.total_cost)} does not cover it")
        bound = order_bound
    bound = min(bound, cost)
    return AutoResult(actions, cost, source, bound, cost <= bound * (1 + 1e-9), False, notes,
                      timings)


class _HighsRace:
    """The Checkmate MILP on HiGHS in a background thread (the solve releases the GIL); stops
    the other searches when it proves optimality."""

    def __init__(self, problem: RematProblem, time_limit_s: float, seed: int,
                 stop: SearchStop, progress: Progress | None = None) -> None:
        self._outcome: list[RematResult] = []
        self.wall_seconds = 0.0

        def run() -> None:
            started = time.perf_counter()
            r = solve_milp(problem, "highs", time_limit_s=time_limit_s, threads=1, seed=seed,
                           progress=progress)
            self.wall_seconds = time.perf_counter() - started
            self._outcome.append(r)
            if (r.cost is not None and r.bound is not None
                    and r.cost - r.bound <= GAP_TO_STOP * r.cost):
                stop.stop()

        self._thread = threading.Thread(target=run, name="auto-highs", daemon=True)
        self._thread.start()

    def result(self, timeout_s: float) -> RematResult | None:
        self._thread.join(timeout_s)
        return self._outcome[0] if self._outcome else None


def _objective_only(progress: Progress | None) -> Progress | None:
    """A search outside the graph's order proves nothing about the bound auto reports."""
    if progress is None:
        return None
    return lambda objective, _bound: progress(objective, None)


def _increase(cost: float, total: float) -> str:
    return f"+{100 * (cost / total - 1):.3f} %"


def _follows(actions: list[Action], order: list[int]) -> bool:
    """Whether the plan's first computations follow `order`."""
    seen: set[int] = set()
    firsts = []
    for a in actions:
        if a.op.value == "compute" and a.node not in seen:
            seen.add(a.node)
            firsts.append(a.node)
    return firsts == order
