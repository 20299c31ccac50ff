"""Improvement on graphs over auto's exact-search size, until the deadline, in time slices:
1. randomised memory-aware orders (a store-all fit there is optimal; greedy eviction in each
   order whose store-all peak is the lowest yet);
2. kicked lowered orders (`late_orders.Reorderer`): random moves on the order of the cheapest
   plan, a peak-lowering local search from there, greedy eviction in the result, kept when
   cheaper. The order with the lowest store-all peak is not the one where eviction is
   cheapest (random_layered_dag(500) at 0.8: +2.97 % in the lowest-peak order, +1.6 % after
   kicks); while nothing fits, the same moves run as iterated local search on the peak, and
   eviction is tried in every order whose peak is the lowest yet, and where it gets stuck,
   retention checkpointing (`retention.tight_budget_plan`);
3. large-neighbourhood search on the cheapest checkpoint plan (`lns.improve_windows`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.solvers.order import schedule_order
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.greedy import evict
from planner.solvers.remat.late_orders import KICK_MOVES, Reorderer
from planner.solvers.remat.lns import improve_windows
from planner.solvers.remat.orders import random_orders, with_order
from planner.solvers.remat.problem import problem_from_graph
from planner.solvers.remat.retention import tight_budget_plan

Offer = Callable[[list[Action] | None, str], bool]
ORDERS_SLICE_S = 1.0  # random memory-aware orders per round
SLICE_S = 2.0  # kicked lowered orders, then window search, per round: a search that found a
MAX_SLICE_S = 6.0  # cheaper plan in its last slice gets twice as long next time (up to this)
KICK_FRACTIONS = (0.05, 0.1, 0.2)  # random moves per kick, as a share of the nodes
RETENTION_S = 4.0  # retention checkpointing in a new lowest-peak order while nothing fits
WALK_TOLERANCE = 0.002  # kicks go on from an order this close to the cheapest plan's cost


def improve_large(graph: Graph, budget_bytes: int, fitted: list[tuple[str, CheckpointPlan]],
                  offer: Offer, order_of: dict[str, list[int]], deadline: float,
                  seed: int) -> None:
    """Until the deadline: the three searches above in turn; `fitted` (cheapest first) gains
    every plan found."""
    orders = random_orders(graph, seed)
    lowest = min((p.peak_bytes for p in store_all_peaks(fitted)), default=None)
    kicks = _Kicks(graph, budget_bytes, fitted, offer, order_of, seed)
    rng_seed = seed
    kick_s = lns_s = SLICE_S
    while time.perf_counter() < deadline:
        slice_end = min(deadline, time.perf_counter() + ORDERS_SLICE_S)
        while time.perf_counter() < slice_end:  # orders: O(n log n) each, checked in O(n)
            name, order = next(orders)
            candidate = CheckpointPlan(problem_from_graph(with_order(graph, order),
                                                          budget_bytes))
            if candidate.peak_bytes <= budget_bytes:
                order_of[f"store-all@{name}"] = order
                offer(candidate.actions(), f"store-all@{name}")
                return
            if lowest is not None and candidate.peak_bytes >= lowest:
                continue
            lowest = candidate.peak_bytes
            part = min(deadline, time.perf_counter() + 0.3 * (deadline - time.perf_counter()))
            if evict(candidate, part):
                _keep(fitted, offer, order_of, f"greedy@{name}", order, candidate)
        before = fitted[0][1].total_cost if fitted else None
        if kicks.run(min(deadline, time.perf_counter() + kick_s), deadline):
            return  # a store-all fit: optimal
        better = fitted and (before is None or fitted[0][1].total_cost < before)
        kick_s = min(MAX_SLICE_S, 2 * kick_s) if better else SLICE_S
        if fitted and time.perf_counter() < deadline:
            name, plan = fitted[0]
            before = plan.total_cost
            improve_windows(plan, min(deadline, time.perf_counter() + lns_s), seed=rng_seed)
            rng_seed += 1
            lns_s = min(MAX_SLICE_S, 2 * lns_s) if plan.total_cost < before else SLICE_S
            if plan.total_cost < before:
                order_of[f"lns@{name}"] = order_of.get(f"greedy@{name}", schedule_order(graph))
                offer(plan.actions(), f"lns@{name}")


class _Kicks:
    """Kicked lowered orders: from the last order whose plan came within WALK_TOLERANCE of the
    cheapest (or, while none fits, from the lowest-peak lowered order), random moves, a local
    search, greedy eviction."""

    def __init__(self, graph: Graph, budget_bytes: int,
                 fitted: list[tuple[str, CheckpointPlan]], offer: Offer,
                 order_of: dict[str, list[int]], seed: int) -> None:
        self.graph, self.budget_bytes = graph, budget_bytes
        self.fitted, self.offer, self.order_of = fitted, offer, order_of
        self.rng = random.Random(seed + 1)
        self.reorder: Reorderer | None = None
        self.lowest: tuple[int, list[int]] | None = None  # while nothing fits: (peak, order)
        self.current: list[int] | None = None  # the order kicks start from, once a plan fits
        self.count = 0

    def run(self, until: float, deadline: float) -> bool:
        """Kicks until `until`; True when an order's store-all fits (optimal, offered)."""
        n = len(self.graph.nodes)
        if self.reorder is None:
            self.reorder = Reorderer(self.graph, self.budget_bytes)
        while time.perf_counter() < until:
            if self.fitted:
                base = self.current or list(self.fitted[0][1].problem.node_ids)
            elif self.lowest is not None:
                base = self.lowest[1]
            else:  # the first round without a plan: the graph's order lowered
                base, peak = self.reorder.lower(schedule_order(self.graph), until)
                self.lowest = (peak, base)
                continue
            moves = (max(KICK_MOVES, min(400, int(self.rng.choice(KICK_FRACTIONS) * n)))
                     if self.fitted else KICK_MOVES)  # no plan yet: small kicks (ILS on peak)
            order, peak = self.reorder.lower(base, until, self.rng, moves,
                                             first_improvement=True)
            self.count += 1
            name = f"kick{self.count}"
            plan = CheckpointPlan(problem_from_graph(with_order(self.graph, order),
                                                     self.budget_bytes))
            if plan.peak_bytes <= self.budget_bytes:
                self.order_of[f"store-all@{name}"] = order
                self.offer(plan.actions(), f"store-all@{name}")
                return True
            if not self.fitted:
                if self.lowest is not None and peak >= self.lowest[0]:
                    continue
                self.lowest = (peak, order)
            part = min(deadline, time.perf_counter() + max(1.0, until - time.perf_counter()))
            if not evict(plan, part):
                if not self.fitted:  # eviction stuck: retention checkpointing in this order
                    self._retain(plan, order, name,
                                 min(deadline, time.perf_counter() + RETENTION_S))
                continue
            best = self.fitted[0][1].total_cost if self.fitted else None
            if best is None or plan.total_cost < best:
                _keep(self.fitted, self.offer, self.order_of, f"greedy@{name}", order, plan)
            if best is None or plan.total_cost <= best * (1 + WALK_TOLERANCE):
                self.current = order  # a walk over near-equal orders, not only downhill
        return False


    def _retain(self, plan: CheckpointPlan, order: list[int], name: str,
                until: float) -> None:
        actions = tight_budget_plan(plan.problem, until, seed=self.count)
        if actions is not None and self.offer(actions, f"retention@{name}"):
            self.order_of[f"retention@{name}"] = order


def _keep(fitted: list[tuple[str, CheckpointPlan]], offer: Offer,
          order_of: dict[str, list[int]], source: str, order: list[int],
          plan: CheckpointPlan) -> None:
    name = source.split("@", 1)[1]
    order_of[source] = order
    fitted.append((name, plan))
    fitted.sort(key=lambda item: item[1].total_cost)
    offer(plan.actions(), source)


def store_all_peaks(fitted: list[tuple[str, CheckpointPlan]]) -> list[CheckpointPlan]:
    return [CheckpointPlan(plan.problem) for _, plan in fitted]
