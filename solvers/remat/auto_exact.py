"""auto's exact searches on small graphs, after the portfolio: LP, MILP, interval model.

In the graph's order: the LP relaxation (HiGHS) for a bound and LP-rounded plans; on
≤ MILP_MAX_NODES the MILP on CP-SAT, first to find plans (default search, hinted with the best
plan, until it stalls), then to prove (the LP in the search, one worker); then the CP-SAT
interval model (Moccasin-style), whose bound counts only when every node may be computed as
often as it likes (≤ EXACT_INTERVALS_MAX_NODES); above, recomputations per node are capped:
fast, but no proof. When the best plan reorders first computations, the searches run in its
order and only look for plans. `HighsRace` runs the MILP on HiGHS beside all of this.
"""

from __future__ import annotations

import math
import threading
import time

from planner.core.plan import plan_nodes
from planner.solvers.remat.auto_search import AutoSearch
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.exact import RematResult, solve_milp
from planner.solvers.remat.intervals import solve_intervals
from planner.solvers.remat.lp_rounding import lp_relaxation, round_lp
from planner.solvers.remat.orders import explore_orders, with_order
from planner.solvers.remat.problem import (
    RematProblem,
    problem_from_graph,
    staged_actions,
    staged_from_actions,
)
from planner.solvers.remat.stop import Progress, SearchStop, StallWatch

EXACT_INTERVALS_MAX_NODES = 30  # up to here the interval model allows every recomputation
LP_MAX_NODES = 120
MILP_MAX_NODES = 100
GAP_TO_STOP = 1e-4  # HiGHS's gap tolerance: a proof this close ends the other searches
RECOMPUTATIONS_CAP = 2  # computations per node in the interval model on larger graphs
FIND_SHARE = 0.2  # of the time left: CP-SAT's default search on the MILP, for plans
FIND_STALL_FRACTION = 0.05  # of the limit: that search ends when it improves no more for this
PROVE_SHARE = 0.85  # of the time left then: the MILP with the LP in CP-SAT's search, to prove


class ExactSearch:
    """The exact searches of one small graph, in the order of the best plan so far.

    CP-SAT's default search on the MILP, hinted with the best plan, finds better plans fast but
    never moves the bound; with the LP in the search (linearization level 2) and one worker
    (more split the LP search: proofs took 4x longer with two) the bound closes, but only from
    a good incumbent: vgg19 at 0.8 proved in 12-18 s from its optimum, not in 60 s without a
    hint. So: find (until it stalls), then prove. A bound in another order than the graph's
    covers no other order: there the searches only look for plans."""

    def __init__(self, search: AutoSearch, *, workers: int, stop: SearchStop,
                 first_deadline: float) -> None:
        self.search = search
        self.workers = workers
        self.stop = stop
        self.first_deadline = first_deadline
        self.proven = False  # the best plan meets the in-order bound: the searches end
        self.use_milp = search.problem.n <= MILP_MAX_NODES
        self.stall_s = max(1.0, FIND_STALL_FRACTION * search.config.time_limit_s)
        # the order the searches run in (set by `run`): the best plan's
        self.order: list[int] = search.given
        self.in_order = True
        self.ordered_problem = search.problem
        self.in_order_report: Progress | None = search.within_order

    def run(self) -> None:
        """Random orders first, as long as a store-all fit may turn up; then the LP, the MILP
        (find, then prove) and the interval model, each while no proof ends them."""
        s = self.search
        self.store_all_in_random_orders()
        if not s.optimal() and s.problem.n <= LP_MAX_NODES and s.left() > 2:
            self.lp()
        self.proven = s.proven()
        best = s.best
        order = s.order_of.get(best.source, s.given) if best is not None else s.given
        self.order = order
        self.in_order = order == s.given
        self.ordered_problem = (s.problem if self.in_order else
                                problem_from_graph(with_order(s.graph, order), s.budget_bytes))
        self.in_order_report = s.within_order if self.in_order else s.objective_only()
        t1 = time.perf_counter()
        for share, level in ((FIND_SHARE, None), (PROVE_SHARE, 2)):
            if (self.proven or self.stop.stopped or s.left() <= 2.0 or not self.use_milp
                    or (level is not None and not self.in_order)):
                break
            self.milp_search(share, level, s.config.seed)
        s.timings["milp_s"] = time.perf_counter() - t1
        self.interval_rounds()

    def store_all_in_random_orders(self) -> None:
        s = self.search
        for name, order in explore_orders(s.graph, s.budget_bytes, self.first_deadline,
                                          s.config.seed):
            if name.startswith("random") and time.perf_counter() < self.first_deadline:
                plan = CheckpointPlan(problem_from_graph(with_order(s.graph, order),
                                                         s.budget_bytes))
                if plan.peak_bytes <= s.budget_bytes:
                    s.order_of[f"store-all@{name}"] = order
                    s.offer(plan.actions(), f"store-all@{name}")

    def lp(self) -> None:
        """The LP relaxation for a bound, and its rounding for a plan."""
        s = self.search
        t0 = time.perf_counter()
        lp_time = min(s.left() * 0.5, 0.2 * s.config.time_limit_s)
        lp = lp_relaxation(s.problem, backend="highs-lp", time_limit_s=lp_time)
        if lp.bound is not None:
            s.bound = max(s.bound, lp.bound)
            s.tell()
            sched, _ = round_lp(s.problem, lp)
            if sched is not None:
                s.offer(staged_actions(s.problem, sched)[0], "lp-rounding")
        else:
            s.notes.append(f"LP relaxation: {lp.status} within {lp_time:.1f} s")
        s.timings["lp_s"] = time.perf_counter() - t0

    def milp_search(self, share: float, level: int | None, search_seed: int) -> None:
        """The MILP on CP-SAT for `share` of the time left, hinted with the best plan: the
        default search (`level` None, until it stalls) or with the LP in it (one worker)."""
        s = self.search
        hint = (staged_from_actions(self.ordered_problem, s.best.actions)
                if s.best is not None else None)
        phase_stop = SearchStop(parent=self.stop)
        with StallWatch(phase_stop, self.stall_s if level is None else math.inf,
                        self.in_order_report) as watch:
            r = solve_milp(self.ordered_problem, "cpsat", time_limit_s=share * s.left(),
                           threads=self.workers if level is None else 1, seed=search_seed,
                           hint=hint, stop=phase_stop, progress=watch, linearization=level)
        if r.bound is not None and self.in_order:
            s.bound = max(s.bound, r.bound)
        s.offer(r.actions, "milp:cpsat" + ("" if self.in_order else "@reordered"))
        self.proven = s.proven()

    def interval_rounds(self) -> None:
        """The interval model until a proof, a stop or the deadline. A capped model proves
        nothing: it ends when it stalls, and the MILP's search takes its turn from the best plan
        (then the next round, with another seed). Odd rounds free the order of first
        computations: a plan in another order."""
        s = self.search
        cap: int | None = (None if s.problem.n <= EXACT_INTERVALS_MAX_NODES
                           else RECOMPUTATIONS_CAP)
        t0 = time.perf_counter()
        round_ = 0
        while not self.proven and not self.stop.stopped and s.left() > 1.0:
            free = cap is not None and round_ % 2 == 1
            r = self.intervals(cap, free, round_)
            if cap is None:
                if self.in_order:  # every recomputation allowed: a real bound
                    self.take_interval_bound(r)
                break
            if r.status == "optimal":
                cap = cap + 1 if cap + 1 < s.problem.n // 2 else None
                s.notes.append(f"capped interval model optimal; recomputations per node now "
                               f"{cap or 'any'}")
                self.proven = s.proven()
                continue
            round_ += 1
            if s.best is not None and plan_nodes(s.best.actions) != self.order:
                self.follow(plan_nodes(s.best.actions))  # found in a free order
            if self.use_milp and s.left() > 2.0 and not self.stop.stopped:
                self.milp_search(FIND_SHARE, None, s.config.seed + round_)
        s.timings["intervals_s"] = time.perf_counter() - t0

    def intervals(self, cap: int | None, free: bool, round_: int) -> RematResult:
        """One search of the interval model (CP-SAT), hinted with the best plan."""
        s = self.search
        phase_stop = SearchStop(parent=self.stop)
        with StallWatch(phase_stop, math.inf if cap is None else 2 * self.stall_s,
                        s.objective_only() if free else self.in_order_report) as watch:
            r = solve_intervals(self.ordered_problem, max_computations=cap, free_order=free,
                                time_limit_s=s.left(), threads=self.workers,
                                seed=s.config.seed + round_,
                                hint=s.best.actions if s.best is not None else None,
                                stop=phase_stop, progress=watch)
        s.offer(r.actions, "cpsat-intervals" + ("@any-order" if free else "" if self.in_order
                                                else "@reordered"))
        return r

    def take_interval_bound(self, r: RematResult) -> None:
        s = self.search
        if r.bound is not None:
            s.order_bound = max(s.order_bound, r.bound)
            s.bound = max(s.bound, r.bound)
        if r.status == "infeasible":  # in this order only: a reordering may still fit
            s.notes.append("the interval model proves no plan in the graph's order fits")

    def follow(self, order: list[int]) -> None:
        """The searches go on in `order` (the best plan's)."""
        s = self.search
        self.order = order
        self.in_order = order == s.given
        self.in_order_report = s.within_order if self.in_order else s.objective_only()
        self.ordered_problem = problem_from_graph(with_order(s.graph, order), s.budget_bytes)


class HighsRace:
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
