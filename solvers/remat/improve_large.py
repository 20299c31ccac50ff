"""Improvement on graphs over auto's exact-search size, until the deadline: randomised
memory-aware orders (a store-all fit there is optimal; greedy eviction in each order whose
store-all peak is the lowest yet), alternating with large-neighbourhood search on the cheapest
checkpoint plan."""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.graph import Graph
from planner.plan import Action
from solvers.order import schedule_order
from solvers.remat.checkpoints import CheckpointPlan
from solvers.remat.greedy import improve, reduce_peak, sweep
from solvers.remat.lns import improve_windows
from solvers.remat.orders import random_orders, with_order
from solvers.remat.problem import problem_from_graph


def improve_large(graph: Graph, budget_bytes: int, fitted: list[tuple[str, CheckpointPlan]],
                   offer: Callable[[list[Action] | None, str], bool],
                   order_of: dict[str, list[int]], deadline: float, seed: int) -> None:
    """Until the deadline: randomised memory-aware orders (a store-all fit there is optimal;
    greedy eviction in each order whose store-all peak is the lowest yet), alternating with
    large-neighbourhood search on the cheapest checkpoint plan."""
    orders = random_orders(graph, seed)
    lowest = min((p.peak_bytes for p in store_all_peaks(fitted)), default=None)
    rng_seed = seed
    while time.perf_counter() < deadline:
        slice_end = min(deadline, time.perf_counter() + 2.0)
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
            sweep(candidate, part)
            if reduce_peak(candidate, part):
                improve(candidate, part)
                order_of[f"greedy@{name}"] = order
                fitted.append((name, candidate))
                fitted.sort(key=lambda item: item[1].total_cost)
                offer(candidate.actions(), f"greedy@{name}")
        if fitted and time.perf_counter() < deadline:
            name, plan = fitted[0]
            before = plan.total_cost
            improve_windows(plan, min(deadline, time.perf_counter() + 2.0), seed=rng_seed)
            rng_seed += 1
            if plan.total_cost < before:
                order_of[f"lns@{name}"] = order_of.get(f"greedy@{name}", schedule_order(graph))
                offer(plan.actions(), f"lns@{name}")


def store_all_peaks(fitted: list[tuple[str, CheckpointPlan]]) -> list[CheckpointPlan]:
    return [CheckpointPlan(plan.problem) for _, plan in fitted]
