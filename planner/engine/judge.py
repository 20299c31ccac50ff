"""The judge's cross-check: a method's claimed lower bound against every plan known for the
graph and budget.

A bound above the cost of a plan that fits the budget is false (a solver's numerical trouble, a
cutoff mistaken for a proof), and a false bound makes a false "optimal". The plans checked: the
method's own plan (by the caller), every baseline plan that fits the budget, plans the caller
knows (a sweep's plans at smaller budgets), and plans judged earlier in this process for the same
graph (`PLAN_BOOK`: another method, backend or budget).

Remat bounds (LP, MILP, the interval model) cover schedules in the graph's order, and the staged
ones among them at least; a plan outside that space may legitimately be cheaper than such a
bound. So only plans in Checkmate's staged form in the graph's schedule order, with compute and
free actions, whose peak fits by the solvers' accounting (views charged their base's bytes: never
less than the simulator's) are held against a bound.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.graph import Graph
from planner.plan import Action, ActionOp
from planner.simulator import simulate
from solvers.remat.intervals import plan_peak_and_cost
from solvers.remat.problem import problem_from_graph, staged_from_actions

BOUND_TOLERANCE = 1e-6  # relative: solvers may round costs when scaling them to integers


@dataclass(frozen=True)
class KnownPlan:
    """A plan that exists: its source, compute cost and peak (the solvers' accounting)."""

    source: str
    cost: float
    peak_bytes: int

    @property
    def text(self) -> str:
        return f"{self.source} (cost {self.cost:g}, peak {self.peak_bytes} bytes)"


def known_plan(graph: Graph, source: str, actions: Sequence[Action]) -> KnownPlan | None:
    """The plan as a witness against bounds, or None when it is outside the space every remat
    bound covers (reordered, not staged, offloading) or invalid."""
    if any(a.op not in (ActionOp.compute, ActionOp.free) for a in actions):
        return None
    problem = problem_from_graph(graph, 0)
    if staged_from_actions(problem, actions) is None:
        return None
    try:
        sim = simulate(graph, list(actions))
    except Exception:  # an invalid plan proves nothing
        return None
    peak, _ = plan_peak_and_cost(problem, list(actions))
    return KnownPlan(source, sim.compute_cost, max(peak, sim.peak_bytes))


class PlanBook:
    """Plans judged in this process, per graph: the cheapest known at each peak (a Pareto
    front), so that a later claim on the same graph can be checked against them."""

    def __init__(self, graphs: int = 16, per_graph: int = 32) -> None:
        self._lock = threading.Lock()
        self._fronts: OrderedDict[str, list[KnownPlan]] = OrderedDict()
        self._graphs, self._per_graph = graphs, per_graph

    def add(self, graph_hash: str, plan: KnownPlan) -> None:
        with self._lock:
            front = self._fronts.pop(graph_hash, [])
            if not any(p.peak_bytes <= plan.peak_bytes and p.cost <= plan.cost for p in front):
                front = [p for p in front
                         if not (plan.peak_bytes <= p.peak_bytes and plan.cost <= p.cost)]
                front.append(plan)
                front.sort(key=lambda p: p.peak_bytes)
                if len(front) > self._per_graph:  # keep the ends and thin the middle
                    del front[len(front) // 2]
            self._fronts[graph_hash] = front
            while len(self._fronts) > self._graphs:
                self._fronts.popitem(last=False)

    def fitting(self, graph_hash: str, budget_bytes: int) -> list[KnownPlan]:
        with self._lock:
            return [p for p in self._fronts.get(graph_hash, []) if p.peak_bytes <= budget_bytes]

    def clear(self) -> None:
        with self._lock:
            self._fronts.clear()


PLAN_BOOK = PlanBook()


def baseline_plans(graph: Graph, budget_bytes: int) -> list[KnownPlan]:
    """Every baseline plan that fits the budget (cheap: a few simulations)."""
    from solvers.baselines import BASELINES

    out = []
    for name, fn in BASELINES.items():
        plan = known_plan(graph, f"baseline:{name}", fn(graph, budget_bytes))
        if plan is not None and plan.peak_bytes <= budget_bytes:
            out.append(plan)
    return out


def contradicting_plan(
    graph: Graph, budget_bytes: int, bound: float, extra: Iterable[KnownPlan] = ()
) -> KnownPlan | None:
    """The cheapest known in-budget plan whose cost is below `bound`, or None.

    Only called for bounds above the trivial one (every node once), so graphs whose methods
    claim nothing pay nothing."""
    limit = bound / (1 + BOUND_TOLERANCE)
    candidates = [
        *(p for p in extra if p.peak_bytes <= budget_bytes),
        *PLAN_BOOK.fitting(graph.content_hash(), budget_bytes),
        *baseline_plans(graph, budget_bytes),
    ]
    below = [p for p in candidates if p.cost < limit]
    return min(below, key=lambda p: p.cost) if below else None
