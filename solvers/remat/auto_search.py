"""auto's state: the best plan so far, the bounds that cover it, the deadline and the listener.

`AutoSearch.offer` judges every candidate of every phase with the simulator (polishing it on
large graphs) and keeps the best; the bounds it holds are claimed only for the plans they
cover: LP/MILP bounds (`bound`) for Checkmate's staged schedules in the graph's order, the
uncapped interval model's (`order_bound`) for any schedule in that order, and the universal
bound raised by the cut bound (`any_order_bound`) for every plan. `result` turns the state into
the `AutoResult` that auto returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from planner.core.graph import Graph
from planner.core.plan import Action, plan_nodes
from planner.sim.simulator import PlanError, simulate
from planner.solvers.order import schedule_order
from planner.solvers.remat.polish import keep_instead_of_recompute
from planner.solvers.remat.problem import RematProblem, staged_from_actions
from planner.solvers.remat.stop import PlanListener, Progress

EXACT_MAX_NODES = 300  # up to here: LP, MILP and interval searches after the portfolio
OPTIMAL_TOLERANCE = 1e-9  # relative: a cost this close to a bound is proven optimal


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


@dataclass(frozen=True)
class AutoConfig:
    """One call's knobs: the wall-clock limit, the threads the searches may use, the seed."""

    time_limit_s: float = 60.0
    threads: int = 2
    seed: int = 0


class Incumbent(NamedTuple):
    """The best in-budget plan so far: its simulated compute cost and where it came from."""

    cost: float
    actions: list[Action]
    source: str


class AutoSearch:
    """The incumbent, the bounds, the deadline and the progress listener of one auto solve,
    shared by its phases; `order_of` records each source's order of first computations."""

    def __init__(self, graph: Graph, budget_bytes: int, problem: RematProblem,
                 config: AutoConfig, *, started: float, deadline: float,
                 progress: Progress | None, incumbent: PlanListener | None = None) -> None:
        self.graph = graph
        self.budget_bytes = budget_bytes
        self.problem = problem
        self.config = config
        self.started = started
        self.deadline = deadline
        self.progress = progress
        self.incumbent = incumbent  # the engine's keeper of the best plan so far (anytime)
        self.best: Incumbent | None = None
        self.bound = problem.total_cost  # raised by the LP, MILP and interval searches
        self.order_bound = problem.total_cost  # raised by the uncapped interval model only
        self.any_order_bound = problem.total_cost  # raised by the cut bound: covers every plan
        self.given = schedule_order(graph)
        self.notes: list[str] = []
        self.timings: dict[str, float] = {}
        self.order_of: dict[str, list[int]] = {}

    @property
    def small(self) -> bool:
        """Small enough for the exact searches after the portfolio."""
        return self.problem.n <= EXACT_MAX_NODES

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    # -- candidates -------------------------------------------------------------------------
    def offer(self, actions: list[Action] | None, source: str) -> bool:
        """Judge a candidate with the simulator; whether it became the best plan."""
        if actions is None:
            return False
        try:
            sim = simulate(self.graph, actions)
        except PlanError as e:  # a heuristic's bug must not cost the answer: note it, go on
            self.notes.append(f"{source}: invalid plan dropped ({e})")
            return False
        cost = sim.compute_cost
        fits = sim.peak_bytes <= self.budget_bytes
        if fits and self.problem.n > EXACT_MAX_NODES and self.left() > 1.0:
            # Keep values where memory allows instead of computing them again: greedy
            # eviction's and the chain DP's plans leave slack (gpt12 at 0.8: +7.0 % becomes
            # +4.5 %). Not on small graphs: the exact searches' bounds cover their own plans.
            polished = keep_instead_of_recompute(self.graph, actions, self.budget_bytes,
                                                 deadline=self.deadline, before=sim)
            if polished.changed:
                actions, cost, source = polished.actions, polished.compute_cost, source + "+kept"
        if fits and self._better(cost, actions):
            self.best = Incumbent(cost, actions, source)
            if "first_plan_s" not in self.timings:
                self.timings["first_plan_s"] = time.perf_counter() - self.started
            self.tell()
            return True
        return False

    def _better(self, cost: float, actions: list[Action]) -> bool:
        """Cheaper than the best; on a tie, a plan that the in-order bounds (small graphs)
        cover replaces one they do not: the MILP's optimum is then proven beside a
        heuristic's equal plan."""
        best = self.best
        return best is None or cost < best.cost or (
            cost <= best.cost and self.small and self.in_bound_space(actions)
            and not self.in_bound_space(best.actions))

    def in_bound_space(self, actions: list[Action]) -> bool:
        """Whether the in-order bounds (LP, MILP: staged, in the graph's order) cover it."""
        return follows(actions, self.given) and staged_from_actions(self.problem,
                                                                     actions) is not None

    # -- bounds and progress ----------------------------------------------------------------
    def covers(self, found_bound: float) -> bool:
        """Whether a bound of a search in the graph's order covers the best plan: not when the
        plan reorders, nor when it is cheaper (then it lies outside the search's space)."""
        best = self.best
        return best is None or (found_bound <= best.cost and follows(best.actions, self.given))

    def tell(self) -> None:
        """The listeners hear of the best plan and the bound that covers it (the engine's
        keeper gets the any-order bound: it covers the plan whatever its order or form)."""
        if self.incumbent is not None and self.best is not None:
            self.incumbent(self.best.actions, self.best.source, self.any_order_bound)
        if self.progress is not None and self.best is not None:
            self.progress(self.best.cost,
                          max(self.bound, self.any_order_bound) if self.covers(self.bound)
                          else self.any_order_bound)

    def report_in_order(self, objective: float | None, found_bound: float | None) -> None:
        """A search in the graph's order reports: its bound only where it covers the best."""
        if self.progress is not None:
            self.progress(objective, found_bound if found_bound is not None
                          and self.covers(found_bound) else None)

    @property
    def within_order(self) -> Progress | None:
        """The listener of searches in the graph's order; None without a listener: the
        searches then install no callbacks at all."""
        return self.report_in_order if self.progress is not None else None

    def objective_only(self) -> Progress | None:
        """The listener of a search outside the graph's order: it proves nothing about the
        bound auto reports."""
        return objective_only(self.progress)

    def optimal(self) -> bool:
        """The best plan meets the bound for any order: nothing can beat it."""
        return (self.best is not None
                and self.best.cost <= self.any_order_bound * (1 + OPTIMAL_TOLERANCE))

    def proven(self) -> bool:
        """The best plan meets the in-order bound of the exact searches."""
        return self.best is not None and self.best.cost <= self.bound * (1 + OPTIMAL_TOLERANCE)

    # -- the answer -------------------------------------------------------------------------
    def result(self) -> AutoResult:
        """The best plan with the bound that covers it (see the module's docstring)."""
        if self.best is None:
            return AutoResult(None, None, "none", max(self.bound, self.any_order_bound), False,
                              False, self.notes, self.timings)
        cost, actions, source = self.best
        total = self.problem.total_cost
        bound = self.bound
        if not follows(actions, self.given):
            # Bounds above hold for schedules in the graph's order; this plan reorders, so only
            # the bounds for any order (every node once, the cut bound) are claimed.
            if bound > self.any_order_bound:
                self.notes.append("the plan reorders first computations; bound = the cut bound "
                                  "(any order)")
            bound = total
        elif bound > self.order_bound and staged_from_actions(self.problem, actions) is None:
            # Cheaper than Checkmate's staged form allows, or just outside it: the LP/MILP bound
            # covers staged schedules only.
            self.notes.append(f"the plan is not in Checkmate's staged form; the staged-space "
                              f"bound {_increase(bound, total)} does not cover it")
            bound = self.order_bound
        bound = min(max(bound, self.any_order_bound), cost)
        return AutoResult(actions, cost, source, bound, cost <= bound * (1 + OPTIMAL_TOLERANCE),
                          False, self.notes, self.timings)


def objective_only(progress: Progress | None) -> Progress | None:
    """A search outside the graph's order proves nothing about the bound auto reports."""
    if progress is None:
        return None
    return lambda objective, _bound: progress(objective, None)


def follows(actions: list[Action], order: list[int]) -> bool:
    """Whether the plan's first computations follow `order`."""
    return plan_nodes(actions) == order


def _increase(cost: float, total: float) -> str:
    return f"+{100 * (cost / total - 1):.3f} %"
