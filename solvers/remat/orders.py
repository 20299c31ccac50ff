"""Memory-aware topological orders: reordering alone often fits a budget at no extra compute.

Checkmate's MILP and our staged solvers fix the order of first computations to the graph's
topological order; the published peak uses that order too. A greedy list scheduler that prefers
the ready node freeing the most memory finds orders whose store-all peak is much lower on
wide graphs (random layered DAGs). The solvers then run on the graph with that order: plans are
action lists over node ids, valid for the original graph.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterator

from planner.core.graph import Graph
from planner.solvers.order import order_successors, schedule_order

Key = Callable[[int, int, int], tuple[float, ...]]  # (delta bytes, bytes while running, pos)


def greedy_order(graph: Graph, key: Key) -> list[int]:
    """A topological order of the order predecessors (the loss before backward ops), picking
    among ready nodes by `key`; memory is tracked over data edges only.

    A heap with lazy updates: a ready node's key only improves when one of its inputs comes
    down to its last unscheduled reader (then it is pushed again), so each pop checks its
    entry is current. O((n + e) log n)."""
    index = graph.index
    preds, succs = index.predecessors, index.successors
    after = order_successors(index)  # readiness: data and control edges
    pos = {v: i for i, v in enumerate(schedule_order(graph))}
    mem = {v: index.storage_bytes[index.storage_root(v)] for v in pos}
    running = {v: mem[v] + index.node(v).workspace_bytes for v in pos}
    waiting = {v: len(index.order_predecessors[v]) for v in pos}
    users_left = {v: len(succs[v]) for v in pos}
    scheduled: set[int] = set()
    version = dict.fromkeys(pos, 0)
    heap: list[tuple[tuple[float, ...], int, int, int]] = []
    pushes = 0

    def push(v: int) -> None:
        nonlocal pushes
        freed = sum(mem[u] for u in preds[v] if users_left[u] == 1)
        stays = mem[v] if succs[v] else 0
        version[v] += 1
        pushes += 1
        heapq.heappush(heap, (key(stays - freed, running[v], pos[v]), pushes, v, version[v]))

    ready = {v for v, k in waiting.items() if k == 0}
    for v in ready:
        push(v)
    order: list[int] = []
    while heap:
        _, _, v, ver = heapq.heappop(heap)
        if v in scheduled or ver != version[v]:
            continue
        scheduled.add(v)
        ready.discard(v)
        order.append(v)
        for u in preds[v]:
            users_left[u] -= 1
            if users_left[u] == 1:  # its last reader now frees it: a better key
                for w in succs[u]:
                    if w in ready:
                        push(w)
                        break
        for w in after[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.add(w)
                push(w)
    return order


ORDER_KEYS: dict[str, Key] = {
    "least-growth": lambda delta, peak, pos: (delta, pos),
    "least-peak": lambda delta, peak, pos: (peak, delta, pos),
    "growth-then-order": lambda delta, peak, pos: (delta > 0, pos),
}


def candidate_orders(graph: Graph) -> dict[str, list[int]]:
    """The graph's own order first, then the distinct greedy ones."""
    out = {"given": schedule_order(graph)}
    for name, key in ORDER_KEYS.items():
        order = greedy_order(graph, key)
        if all(order != o for o in out.values()):
            out[name] = order
    return out


def with_order(graph: Graph, order: list[int]) -> Graph:
    return graph.model_copy(update={"order": list(order)}) if order != graph.order else graph


def explore_orders(graph: Graph, budget_bytes: int, deadline: float, seed: int = 0
                   ) -> Iterator[tuple[str, list[int]]]:
    """The candidate orders, then randomised greedy ones until one's store-all fits or time
    runs out."""
    from planner.solvers.baselines import store_all_peak_bytes

    yield from candidate_orders(graph).items()
    rng = random.Random(seed)
    sizes = graph.index.storage_bytes
    mean = sum(sizes.values()) / max(1, len(sizes))
    k = 0
    while time.perf_counter() < deadline and k < 200:
        amplitude = rng.choice((0.1, 0.3, 1.0)) * mean
        def noisy(d: int, p: int, pos: int, a: float = amplitude) -> tuple[float, ...]:
            return (d + a * rng.random(), pos)

        order = greedy_order(graph, noisy)
        k += 1
        yield f"random{k}", order
        if store_all_peak_bytes(with_order(graph, order)) <= budget_bytes:
            return


def random_orders(graph: Graph, seed: int = 0) -> Iterator[tuple[str, list[int]]]:
    """Randomised memory-aware greedy orders without end: ("random<k>", order); the caller
    stops (auto checks each one's store-all peak incrementally, far cheaper than simulating)."""
    rng = random.Random(seed)
    sizes = graph.index.storage_bytes
    mean = sum(sizes.values()) / max(1, len(sizes))
    k = 0
    while True:
        amplitude = rng.choice((0.1, 0.3, 1.0, 3.0)) * mean

        def noisy(d: int, p: int, pos: int, a: float = amplitude) -> tuple[float, ...]:
            return (d + a * rng.random(), pos)

        k += 1
        yield f"random{k}", greedy_order(graph, noisy)
