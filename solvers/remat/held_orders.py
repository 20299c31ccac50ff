"""Orders that compute held nodes late: a held byte is resident from its node's first computation
to the end of the step, so computing the node later shortens that residence.

Weight gradients are held (they stay in .grad until the optimizer step). A list scheduler
computes each one as soon as its inputs are ready, so every weight gradient of the backward pass
is resident at its last node, wherever that peaks. On a traced GPT-2 (4 layers, tied
embeddings) the last node adds the two halves of the embedding's gradient (147 MiB each): with
every layer's weight gradients (111 MiB) already held there, store-all peaks at 811 MiB in every
list-scheduled order and no eviction can help (nothing else is resident then); with the held
nodes computed after it, store-all peaks at 755 MiB (their inputs, far smaller, stay instead)
and greedy eviction fits 90 % of store-all at once.

The move keeps the order topological: a held node goes just before its first order successor
(data and ordering edges), or to the end when it has none; held nodes keep their relative
order. O((n + e) log n).
"""

from __future__ import annotations

import heapq

from planner.core.graph import Graph
from planner.sim.ledger import MemoryLedger
from planner.solvers.order import order_successors

__all__ = ["held_last_order", "order_floor_bytes"]


def held_last_order(graph: Graph, order: list[int]) -> list[int] | None:
    """`order` (node ids, topological) with every node that holds bytes computed as late as its
    order successors allow; None when no node holds bytes (nothing would move)."""
    ledger = MemoryLedger.of(graph)
    held = ledger.held_bytes
    if not any(held.get(v, 0) > 0 for v in order):
        return None
    succ = order_successors(graph.index)
    pos = {v: i for i, v in enumerate(order)}
    slot: dict[int, int] = {}  # moved node -> the position it goes just before (n: the end)
    for v in reversed(order):
        if held.get(v, 0) > 0:
            slot[v] = min((slot.get(w, pos[w]) for w in succ[v]), default=len(order))
    groups: dict[int, list[int]] = {}
    for v in order:
        if v in slot:
            groups.setdefault(slot[v], []).append(v)
    out: list[int] = []
    for i, v in enumerate(order):
        if i in groups:
            out.extend(_least_growth_first(ledger, groups[i], slot, pos, succ))
        if v not in slot:
            out.append(v)
    out.extend(_least_growth_first(ledger, groups.get(len(order), []), slot, pos, succ))
    return out


def order_floor_bytes(graph: Graph, order: list[int]) -> int:
    """No plan whose first computations follow `order` peaks lower: at each node's first
    computation the fixed bytes, what every node before it holds and its own working set are
    resident (the lower bound of `planner.sim.lower_bound`, in this order). Greedy eviction in
    an order whose floor is over the budget cannot fit, whatever it evicts."""
    ledger = MemoryLedger.of(graph)
    held, fixed = ledger.held_bytes, ledger.fixed_bytes
    floor, held_so_far = fixed, 0
    for v in order:
        held_so_far += held.get(v, 0)
        floor = max(floor, fixed + held_so_far + ledger.working_set_bytes(v))
    return floor


def _least_growth_first(ledger: MemoryLedger, group: list[int], slot: dict[int, int],
                        pos: dict[int, int], succ: dict[int, list[int]]) -> list[int]:
    """The held nodes moved to one place, those that free the most first (the last node of a
    backward pass adding two 147 MiB gradient halves frees them both: computed after the
    weight gradients, it would meet them all held), in a topological order of the group."""
    members = set(group)
    root, own = ledger.storage_root, ledger.storage_bytes

    def growth(v: int) -> int:
        # inputs whose every other reader stays before the group: freed when v has run
        freed = {root[u] for u in ledger.predecessors[v]
                 if all(w == v or (w not in members and pos[w] < slot[v])
                        for w in ledger.successors[u])}
        return ledger.held_bytes.get(v, 0) + own[root[v]] - sum(own[k] for k in freed)

    waiting = {v: sum(1 for u in ledger.predecessors[v] if u in members) for v in group}
    heap = [(growth(v), pos[v], v) for v in group if waiting[v] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, _, v = heapq.heappop(heap)
        out.append(v)
        for w in succ[v]:
            if w in members:
                waiting[w] -= 1
                if waiting[w] == 0:
                    heapq.heappush(heap, (growth(w), pos[w], w))
    return out
