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
free actions, whose peak fits by the solvers' accounting (the memory ledger's
`ViewRule.charge_base`: views charged their base's bytes, never less than the simulator's) are
held against a bound.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp
from planner.sim.ledger import MemoryLedger, ViewRule
from planner.solvers.order import schedule_order

BOUND_TOLERANCE = 1e-6  # relative: solvers may round costs when scaling them to integers
BASELINES_TIME_S = 0.5  # the baselines' share of the answer margin (milliseconds on small graphs)


@dataclass(frozen=True)
class KnownPlan:
    """A plan that exists: its source, compute cost and peak (the solvers' accounting)."""

    source: str
    cost: float
    peak_bytes: int

    @property
    def text(self) -> str:
        return f"{self.source} (cost {self.cost:g}, peak {self.peak_bytes} bytes)"


def known_plan(
    graph: Graph, source: str, actions: Sequence[Action], deadline: float | None = None
) -> KnownPlan | None:
    """The plan as a witness against bounds, or None when it is outside the space every remat
    bound covers (reordered, not staged, offloading), invalid, or not checked by `deadline`
    (time.perf_counter()). Linear in the plan."""
    if any(a.op not in (ActionOp.compute, ActionOp.free) for a in actions):
        return None
    if not is_staged(_positions(graph), actions):
        return None
    ledger = MemoryLedger.of(graph)
    try:
        sim = ledger.replay(actions, deadline=deadline)  # the simulator's checked replay
    except Exception:  # an invalid plan proves nothing (nor does one not replayed in time)
        return None
    if deadline is not None and time.perf_counter() > deadline:
        return None
    charged = ledger.replay(actions, views=ViewRule.charge_base, check=False)
    return KnownPlan(source, sim.compute_cost, max(charged.peak_bytes, sim.peak_bytes))


def is_staged(position: dict[int, int], actions: Sequence[Action]) -> bool:
    """Whether the plan is in Checkmate's staged form for the order `position` (node -> its
    place): first computations follow the order and recomputations between them ascend. The
    same test as `planner.solvers.remat.problem.staged_from_actions(...) is not None`, without
    building
    the schedule (whose resident sets make that quadratic)."""
    stage = 0  # first computations so far
    last = -1  # position of the last compute in the open stage; -1: no stage open
    for a in actions:
        p = position.get(a.node)
        if p is None:
            return False
        if a.op is not ActionOp.compute:
            continue
        if (last >= 0 and p <= last) or p > stage:
            return False
        last = p
        if p == stage:
            stage += 1
            last = -1
    return last < 0 and stage == len(position)


def _positions(graph: Graph) -> dict[int, int]:
    """Node -> its place in the solvers' schedule order (the remat problems' positions), once."""
    memo = graph.index.memo
    if "judge_positions" not in memo:
        memo["judge_positions"] = {v: i for i, v in enumerate(schedule_order(graph))}
    position: dict[int, int] = memo["judge_positions"]
    return position


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
    """Every affordable baseline plan that fits the budget (`bounded_baselines`: recompute-all
    only while its plan stays small, nothing past BASELINES_TIME_S), once per graph and
    budget."""
    from planner.solvers.baselines import bounded_baselines

    memo: dict[int, list[KnownPlan]] = graph.index.memo.setdefault("judge_baselines", {})
    if budget_bytes in memo:
        return memo[budget_bytes]
    out = []
    deadline = time.perf_counter() + BASELINES_TIME_S
    for name, actions in bounded_baselines(graph, budget_bytes, deadline=deadline):
        plan = known_plan(graph, f"baseline:{name}", actions, deadline)
        if plan is not None and plan.peak_bytes <= budget_bytes:
            out.append(plan)
    if len(memo) < 64:
        memo[budget_bytes] = out
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
