"""The order every solver schedules first computations in: one place, so all of them obey the
graph's ordering rule (`GraphIndex.order_predecessors`: backward ops only after the loss).

`graph.index.topological_order` is `graph.order` when the file gives one, accepted as is so that
old files load; a given order that runs a backward op before the loss would make every solver's
plan fail in the simulator (and the runtime). `schedule_order` keeps a valid order unchanged
(so figures of existing graphs stay identical) and otherwise repairs it with the least change:
a topological sort of the order predecessors that prefers the given position.
"""

from __future__ import annotations

import heapq

from planner.core.graph import Graph, GraphIndex

__all__ = ["respects_order_rule", "schedule_order", "order_successors"]


def respects_order_rule(index: GraphIndex, order: list[int]) -> bool:
    """Whether every node of `order` comes after all of its order predecessors."""
    pos = {v: i for i, v in enumerate(order)}
    if len(pos) != len(index.position):
        return False
    preds = index.order_predecessors
    return all(pos[u] < pos[v] for v in order for u in preds[v])


def schedule_order(graph: Graph) -> list[int]:
    """The graph's topological order, repaired when it breaks the ordering rule."""
    index = graph.index
    given = index.topological_order
    if not index.control_predecessors or respects_order_rule(index, given):
        return list(given)
    rank = {v: i for i, v in enumerate(given)}
    preds = index.order_predecessors
    waiting = {v: len(preds[v]) for v in given}
    succs = order_successors(index)
    heap = [(rank[v], v) for v in given if waiting[v] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        out.append(v)
        for w in succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(heap, (rank[w], w))
    return out


def order_successors(index: GraphIndex) -> dict[int, list[int]]:
    """Inverse of `order_predecessors`: data successors plus the control edges out of the loss."""
    control = index.control_predecessors
    if not control:
        return index.successors
    out = {v: list(ws) for v, ws in index.successors.items()}
    data = index.predecessors
    for v, us in index.order_predecessors.items():
        for u in us:
            if u not in data[v]:
                out[u].append(v)
    return out
