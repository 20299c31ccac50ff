"""`auto`: an in-budget plan within seconds at any size, then improvement, with a proven bound.

1. A time-boxed portfolio of fast heuristics (`portfolio.run_portfolio`): store-all in
   memory-aware orders, greedy checkpoint eviction (incremental), the baselines, dynamic
   eviction and the module-level chain DP, each with a share of the time that adapts to the
   graph's size. With three threads or more, on graphs small enough for it, the HiGHS MILP
   starts at once in its own thread (it releases the GIL) and races everything below; it stops
   the others on a proof.
2. Small graphs (≤ EXACT_MAX_NODES): the LP relaxation (HiGHS) for a bound and LP-rounded plans;
   on ≤ MILP_MAX_NODES the MILP on CP-SAT, first to find plans (default search, hinted with the
   best plan, until it stalls), then to prove (the LP in the search, one worker, hinted with
   the best plan found); then the CP-SAT interval model (Moccasin-style).
   Its bound counts only when every node may be computed as often as the MILP allows (small
   graphs); on larger graphs recomputations per node are capped: fast, but no proof.
3. Larger graphs: large-neighbourhood search (`lns.improve_windows`) on windows of the best
   checkpoint plan, randomised memory-aware orders (a fit in a new order costs nothing extra)
   and the greedy add-back search, until the deadline.
The best in-budget plan found in time is returned with its gap, against the bound that covers
it: LP/MILP bounds cover Checkmate's staged schedules (first computations in the graph's order,
ascending recomputations between them); the uncapped interval model's bound covers any schedule
whose first computations follow the graph's order; any other plan gets the universal bound
(every node computed once), raised by the cut bound (`cut_bound`: a value read across a node is
resident there or computed again), which holds for plans in any order. Every phase checks the
deadline: the answer comes within the time limit less a margin for turning the plan into
actions and judging it (`final_margin_s`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from planner.core.graph import Graph
from planner.core.plan import Action, plan_nodes
from planner.sim.simulator import PlanError, lower_bound_peak_bytes, simulate
from planner.solvers.order import schedule_order
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.cut_bound import cut_lower_bound
from planner.solvers.remat.exact import RematResult, solve_milp
from planner.solvers.remat.improve_large import improve_large
from planner.solvers.remat.intervals import solve_intervals
from planner.solvers.remat.lp_rounding import lp_relaxation, round_lp
from planner.solvers.remat.orders import explore_orders, with_order
from planner.solvers.remat.polish import keep_instead_of_recompute
from planner.solvers.remat.portfolio import (
    LOWERED_FIRST_NODES,
    chain_candidate,
    finer_chain_candidate,
    is_training,
    run_portfolio,
)
from planner.solvers.remat.problem import (
    RematProblem,
    problem_from_graph,
    staged_actions,
    staged_from_actions,
)
from planner.solvers.remat.stop import Progress, SearchStop, StallWatch

EXACT_MAX_NODES = 300  # up to here: LP, MILP and interval searches after the portfolio
EXACT_INTERVALS_MAX_NODES = 30  # up to here the interval model allows every recomputation
LP_MAX_NODES = 120
MILP_MAX_NODES = 100
GAP_TO_STOP = 1e-4  # HiGHS's gap tolerance: a proof this close ends the other searches
RECOMPUTATIONS_CAP = 2  # computations per node in the interval model on larger graphs
# With this many threads the HiGHS MILP races from the start on one of them. With fewer it
# only took CPU from the CP-SAT prover, which proved every corpus row HiGHS had proved, sooner.
HIGHS_RACE_MIN_THREADS = 3
FIND_SHARE = 0.2  # of the time left: CP-SAT's default search on the MILP, for plans
FIND_STALL_FRACTION = 0.05  # of the limit: that search ends when it improves no more for this
PROVE_SHARE = 0.85  # of the time left then: the MILP with the LP in CP-SAT's search, to prove
CUT_BOUND_SHARE = 0.05  # of the limit, after the first phase: the any-order cut bound's LPs


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


def final_margin_s(node_count: int, time_limit_s: float) -> float:
    """Seconds kept back from the time limit for building the final plan's actions and the
    engine's judgement of it (simulation): grows with the graph, never most of the limit."""
    return min(0.25 * time_limit_s, 0.3 + 6e-5 * node_count)


def solve_auto(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
               threads: int = 2, seed: int = 0, progress: Progress | None = None) -> AutoResult:
    """`progress(objective, bound)` hears of every better plan (the simulator's cost) and every
    better bound, as soon as each phase or search finds it."""
    started = time.perf_counter()
    n_nodes = len(graph.nodes)
    deadline = started + time_limit_s - final_margin_s(n_nodes, time_limit_s)

    def left() -> float:
        return deadline - time.perf_counter()

    problem = problem_from_graph(graph, budget_bytes)
    least = lower_bound_peak_bytes(graph)
    if least > budget_bytes:  # some node's inputs, output and workspace alone exceed it
        return AutoResult(None, None, "none", problem.total_cost, False, True,
                          [f"no schedule fits: computing one node needs {least} bytes"])
    best: tuple[float, list[Action], str] | None = None
    bound = order_bound = problem.total_cost  # raised by the LP, MILP and interval searches
    any_order_bound = problem.total_cost  # raised by the cut bound: covers every plan
    given = schedule_order(graph)
    notes: list[str] = []
    timings: dict[str, float] = {}

    def offer(actions: list[Action] | None, source: str) -> bool:
        nonlocal best
        if actions is None:
            return False
        try:
            sim = simulate(graph, actions)
        except PlanError as e:  # a heuristic's bug must not cost the answer: note it, go on
            notes.append(f"{source}: invalid plan dropped ({e})")
            return False
        cost = sim.compute_cost
        if sim.peak_bytes <= budget_bytes and problem.n > EXACT_MAX_NODES and left() > 1.0:
            # Keep values where memory allows instead of computing them again: greedy
            # eviction's and the chain DP's plans leave slack (gpt12 at 0.8: +7.0 % becomes
            # +4.5 %). Not on small graphs: the exact searches' bounds cover their own plans.
            polished = keep_instead_of_recompute(graph, actions, budget_bytes,
                                                 deadline=deadline, before=sim)
            if polished.changed:
                actions, cost, source = polished.actions, polished.compute_cost, source + "+kept"
        if sim.peak_bytes <= budget_bytes and (best is None or cost < best[0] or (
                cost <= best[0] and problem.n <= EXACT_MAX_NODES and in_bound_space(actions)
                and not in_bound_space(best[1]))):
            # on a tie, a plan that the in-order bounds (small graphs) cover replaces one they
            # do not: the MILP's optimum is then proven beside a heuristic's equal plan
            best = (cost, actions, source)
            if "first_plan_s" not in timings:
                timings["first_plan_s"] = time.perf_counter() - started
            tell()
            return True
        return False

    def in_bound_space(actions: list[Action]) -> bool:
        """Whether the in-order bounds (LP, MILP: staged, in the graph's order) cover it."""
        return _follows(actions, given) and staged_from_actions(problem, actions) is not None

    def covers(found_bound: float) -> bool:
        """Whether a bound of a search in the graph's order covers the best plan: not when the
        plan reorders, nor when it is cheaper (then it lies outside the search's space)."""
        return best is None or (found_bound <= best[0] and _follows(best[1], given))

    def tell() -> None:
        if progress is not None and best is not None:
            progress(best[0], max(bound, any_order_bound) if covers(bound) else any_order_bound)

    def report_in_order(objective: float | None, found_bound: float | None) -> None:
        if progress is not None:
            progress(objective, found_bound if found_bound is not None and covers(found_bound)
                     else None)

    def optimal() -> bool:
        return best is not None and best[0] <= any_order_bound * (1 + 1e-9)

    # None without a listener: the searches then install no callbacks at all.
    within_order = report_in_order if progress is not None else None
    small = problem.n <= EXACT_MAX_NODES
    stop = SearchStop()
    race: _HighsRace | None = None
    workers = threads
    if problem.n <= MILP_MAX_NODES and threads >= HIGHS_RACE_MIN_THREADS and left() > 4.0:
        # The frontier MILP often proves optimality on mid-sized graphs, given most of the
        # limit: HiGHS (its own thread, no hint) starts now and races everything below.
        race = _HighsRace(problem, left(), seed, stop, within_order)
        workers = threads - 1
    order_of: dict[str, list[int]] = {}
    first_deadline = started + (0.25 if small else 0.6) * (deadline - started)
    fitted = run_portfolio(graph, budget_bytes, offer, first_deadline, threads=workers,
                           seed=seed, order_of=order_of, notes=notes, timings=timings)
    timings["first_phase_s"] = time.perf_counter() - started
    # The cut bound after the first plan (it never delays it; none needed when the plan runs
    # every node once): on training graphs the loss is the cut, where every activation saved
    # for the backward pass is resident or recomputed.
    if not optimal():
        cut = cut_lower_bound(graph, budget_bytes, deadline=min(
            deadline, time.perf_counter() + max(0.2, CUT_BOUND_SHARE * time_limit_s)))
        timings["cut_bound_s"] = cut.wall_seconds
        if cut.infeasible and best is None:
            return AutoResult(None, None, "none", problem.total_cost, False, True,
                              [f"no schedule fits: {cut.reason}"], timings)
        if cut.infeasible:  # a plan fits: the proof is wrong, so claim nothing from it
            notes.append(f"cut bound ignored: it claims no plan fits, beside one that does "
                         f"({cut.reason})")
        elif cut.extra_ms > 0:
            any_order_bound = problem.total_cost + cut.extra_ms
            tell()
    if (not optimal() and "chain_dp_s" not in timings and problem.n <= LOWERED_FIRST_NODES
            and is_training(graph)):
        # the chain DP where the first phase left it no room (a short limit; under a second
        # up to this size), within half of what is left
        chain_candidate(graph, budget_bytes, offer, workers, time.perf_counter() + left() / 2,
                        notes, timings)
    if not optimal() and "chain_dp_s" in timings:
        # the chain DP's finer form, within half of what is left (seconds on thousands of
        # nodes: llama32 at 0.6 +16.9 % where the first DP gave +17.2 %; a tenth of a second
        # on a 4-layer GPT, where at 0.6 only it finds a good plan: +112 %, greedy's +170 %)
        finer_chain_candidate(graph, budget_bytes, offer, workers,
                              time.perf_counter() + left() / 2, notes, timings["chain_dp_s"])
    if not small:
        if not optimal():
            improve_large(graph, budget_bytes, fitted, offer, order_of, deadline, seed)
        timings["improve_s"] = time.perf_counter() - started - timings["first_phase_s"]
    elif not optimal():
        # Exact searches in the graph's order (LP, MILP) and in the best plan's order
        # (intervals); random orders first, as long as a store-all fit may turn up.
        for name, order in explore_orders(graph, budget_bytes, first_deadline, seed):
            if name.startswith("random") and time.perf_counter() < first_deadline:
                plan = CheckpointPlan(problem_from_graph(with_order(graph, order),
                                                         budget_bytes))
                if plan.peak_bytes <= budget_bytes:
                    order_of[f"store-all@{name}"] = order
                    offer(plan.actions(), f"store-all@{name}")
        if not optimal() and problem.n <= LP_MAX_NODES and left() > 2:
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
        order = order_of.get(best[2], given) if best is not None else given
        in_order = order == given
        ordered_problem = (problem if in_order
                           else problem_from_graph(with_order(graph, order), budget_bytes))
        # CP-SAT's default search on the MILP, hinted with the best plan, finds better plans
        # fast but never moves the bound; with the LP in the search (linearization level 2) and
        # one worker (more split the LP search: proofs took 4x longer with two) the bound
        # closes, but only from a good incumbent: vgg19 at 0.8 proved in 12-18 s from its
        # optimum, not in 60 s without a hint. So: find (until it stalls), then prove. When
        # the best plan reorders, the searches in its order only look for plans: a bound in
        # that order covers no other order.
        stall_s = max(1.0, FIND_STALL_FRACTION * time_limit_s)
        in_order_report = within_order if in_order else _objective_only(progress)

        def milp_search(share: float, level: int | None, search_seed: int) -> None:
            nonlocal bound, proven
            hint = staged_from_actions(ordered_problem, best[1]) if best is not None else None
            phase_stop = SearchStop(parent=stop)
            with StallWatch(phase_stop, stall_s if level is None else math.inf,
                            in_order_report) as watch:
                r = solve_milp(ordered_problem, "cpsat", time_limit_s=share * left(),
                               threads=workers if level is None else 1, seed=search_seed,
                               hint=hint, stop=phase_stop, progress=watch,
                               linearization=level)
            if r.bound is not None and in_order:
                bound = max(bound, r.bound)
            offer(r.actions, "milp:cpsat" + ("" if in_order else "@reordered"))
            proven = best is not None and best[0] <= bound * (1 + 1e-9)

        use_milp = problem.n <= MILP_MAX_NODES
        t1 = time.perf_counter()
        for share, level in ((FIND_SHARE, None), (PROVE_SHARE, 2)):
            if (proven or stop.stopped or left() <= 2.0 or not use_milp
                    or (level is not None and not in_order)):
                break
            milp_search(share, level, seed)
        timings["milp_s"] = time.perf_counter() - t1
        cap: int | None = None if problem.n <= EXACT_INTERVALS_MAX_NODES else RECOMPUTATIONS_CAP
        t0 = time.perf_counter()
        round_ = 0
        while not proven and not stop.stopped and left() > 1.0:
            # A capped model proves nothing: it ends when it stalls, and the MILP's search
            # takes its turn from the best plan (then the next round, with another seed).
            # Odd rounds free the order of first computations: a plan in another order.
            free = cap is not None and round_ % 2 == 1
            phase_stop = SearchStop(parent=stop)
            with StallWatch(phase_stop, math.inf if cap is None else 2 * stall_s,
                            _objective_only(progress) if free else in_order_report) as watch:
                r = solve_intervals(ordered_problem, max_computations=cap, free_order=free,
                                    time_limit_s=left(), threads=workers, seed=seed + round_,
                                    hint=best[1] if best is not None else None,
                                    stop=phase_stop, progress=watch)
            offer(r.actions, "cpsat-intervals" + ("@any-order" if free else "" if in_order
                                                  else "@reordered"))
            if cap is None and in_order:  # every recomputation allowed: a real bound
                if r.bound is not None:
                    order_bound = max(order_bound, r.bound)
                    bound = max(bound, r.bound)
                if r.status == "infeasible":  # in this order only: a reordering may still fit
                    notes.append("the interval model proves no plan in the graph's order fits")
            if cap is None:
                break
            if r.status == "optimal":
                cap = cap + 1 if cap + 1 < problem.n // 2 else None
                notes.append(f"capped interval model optimal; recomputations per node now "
                             f"{cap or 'any'}")
                proven = best is not None and best[0] <= bound * (1 + 1e-9)
                continue
            round_ += 1
            if best is not None and plan_nodes(best[1]) != order:  # found in a free order
                order = plan_nodes(best[1])
                in_order = order == given
                in_order_report = within_order if in_order else _objective_only(progress)
                ordered_problem = problem_from_graph(with_order(graph, order), budget_bytes)
            if use_milp and left() > 2.0 and not stop.stopped:
                milp_search(FIND_SHARE, None, seed + round_)
        timings["intervals_s"] = time.perf_counter() - t0
    if race is not None:
        stop.stop()  # a search still running past its share: its answer is not waited for
        proven_now = best is not None and best[0] <= bound * (1 + 1e-9)
        raced = race.result(timeout_s=0.0 if proven_now or optimal() else max(0.0, left()))
        if raced is not None:
            if raced.bound is not None:
                bound = max(bound, raced.bound)
            offer(raced.actions, "milp:highs")
        timings["milp_highs_s"] = race.wall_seconds
    if best is None:
        return AutoResult(None, None, "none", max(bound, any_order_bound), False, False, notes,
                          timings)
    cost, actions, source = best
    if not _follows(actions, given):
        # Bounds above hold for schedules in the graph's order; this plan reorders, so only
        # the bounds for any order (every node once, the cut bound) are claimed.
        if bound > any_order_bound:
            notes.append("the plan reorders first computations; bound = the cut bound (any "
                         "order)")
        bound = problem.total_cost
    elif bound > order_bound and staged_from_actions(problem, actions) is None:
        # Cheaper than Checkmate's staged form allows, or just outside it: the LP/MILP bound
        # covers staged schedules only.
        notes.append(f"the plan is not in Checkmate's staged form; the staged-space bound "
                     f"{_increase(bound, problem.total_cost)} does not cover it")
        bound = order_bound
    bound = min(max(bound, any_order_bound), cost)
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
    return plan_nodes(actions) == order
