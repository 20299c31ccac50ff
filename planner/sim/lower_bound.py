"""The least peak any plan can have: what is resident whatever the plan, at each node's first run.

When a plan first computes node c, every ancestor of c (through data and ordering edges: the
loss before the backward ops) has been computed, so the bytes each of them holds to the end of
the step (weight gradients in .grad) are resident; so are the fixed bytes (parameters), c's
inputs, its output and its workspace. The largest such sum over the nodes is a lower bound on
every plan's peak, in any order, with any recomputation: the simulator charges exactly these
bytes then (`MemoryLedger.resident_bytes` plus the workspace). It is the cut bound's
"must be resident" figure (`solvers.remat.cut_bound`) without the crossing values, for every
node at once.

On a traced GPT-2 (4 layers, tied embeddings) the last node adds the two halves of the
embedding's gradient (147 MiB each) after most of the backward pass: 700 MiB must be resident
there (86 % of store-all), where computing one node alone needs 553 MiB.

The same holds when the last holding node is first computed: every other holder holds its
bytes then, ancestor or not, so fixed + all held bytes + that node's working set bounds every
plan too (charged at the holder whose working set is least, as any may come last). On a traced
GPT the weight gradients lie in separate branches and this is the larger figure: 0.67 of
store-all on a 12-layer GPT, where recompute-all peaks at 0.68, so a 0.6 budget is proven
infeasible at once (auto searched 60 s for it).

Held bytes of ancestors are summed with one bit set per node over the holding nodes, built in
topological order (a node's set is the union of its predecessors'): the sum starts from the
predecessor with the largest sum and adds only the bits it lacks, so a chain costs O(1) big-int
operations per node. Memoised on the graph's index.
"""

from __future__ import annotations

from planner.core.graph import Graph
from planner.sim.ledger import MemoryLedger

__all__ = ["must_resident_bytes", "peak_lower_bound_bytes", "peak_lower_bound_node"]

_MEMO_KEY = "peak_lower_bound"


def peak_lower_bound_bytes(graph: Graph) -> int:
    """No plan peaks lower (see the module text); the fixed bytes for an empty graph."""
    memo = graph.index.memo
    if _MEMO_KEY not in memo:
        must = _with_last_holder(graph, must_resident_bytes(graph))
        memo[_MEMO_KEY] = max(must.values(), default=MemoryLedger.of(graph).fixed_bytes)
    bound: int = memo[_MEMO_KEY]
    return bound


def peak_lower_bound_node(graph: Graph) -> int | None:
    """The node whose first computation gives the bound (the first such in id order), None
    for an empty graph."""
    must = _with_last_holder(graph, must_resident_bytes(graph))
    return max(sorted(must), key=must.__getitem__, default=None)


def _with_last_holder(graph: Graph, must: dict[int, int]) -> dict[int, int]:
    """`must`, raised at the holder that every plan may compute last: when the last holding
    node is first computed, every other holder already holds its bytes, whatever their
    ancestry (a GPT's weight gradients are in separate branches: no one node has them all as
    ancestors, yet all are resident together at the end of the step). Which holder comes last
    is the plan's choice, so the one whose first computation costs least is charged."""
    ledger = MemoryLedger.of(graph)
    held = {v: b for v, b in ledger.held_bytes.items() if b > 0}
    if not held:
        return must
    total_held = sum(held.values())
    last = min(held, key=lambda v: (ledger.working_set_bytes(v), v))
    at_end = ledger.fixed_bytes + total_held + ledger.working_set_bytes(last)
    if at_end <= must[last]:
        return must
    return {**must, last: at_end}


def must_resident_bytes(graph: Graph) -> dict[int, int]:
    """Node id -> bytes resident at its first computation in every plan: fixed bytes, the held
    bytes of the node and of its ancestors, its inputs' and its own storage, its workspace."""
    ledger = MemoryLedger.of(graph)
    held_sum = _ancestor_held_bytes(graph, ledger)
    return {v: ledger.fixed_bytes + held_sum[v] + ledger.working_set_bytes(v)
            for v in ledger.node_ids}


def _ancestor_held_bytes(graph: Graph, ledger: MemoryLedger) -> dict[int, int]:
    """Node id -> held bytes of the node and its ancestors (ordering edges included)."""
    held = {v: b for v, b in ledger.held_bytes.items() if b > 0}
    if not held:
        return dict.fromkeys(ledger.node_ids, 0)
    holders = list(held)
    bit_of = {v: 1 << i for i, v in enumerate(holders)}
    preds = graph.index.order_predecessors
    mask: dict[int, int] = {}
    total: dict[int, int] = {}
    for v in _topological(graph):
        ps = preds[v]
        base = max(ps, key=total.__getitem__, default=None)
        m = mask[base] if base is not None else 0
        s = total[base] if base is not None else 0
        for u in ps:
            extra = mask[u] & ~m
            while extra:  # the holders u's ancestors add to base's
                low = extra & -extra
                s += held[holders[low.bit_length() - 1]]
                m |= low
                extra ^= low
        if v in bit_of and not m & bit_of[v]:
            m |= bit_of[v]
            s += held[v]
        mask[v], total[v] = m, s
    return total


def _topological(graph: Graph) -> list[int]:
    """The nodes in an order where each comes after its order predecessors (Kahn's)."""
    preds = graph.index.order_predecessors
    waiting = {v: len(us) for v, us in preds.items()}
    succ: dict[int, list[int]] = {v: [] for v in preds}
    for v, us in preds.items():
        for u in us:
            succ[u].append(v)
    ready = [v for v, k in waiting.items() if k == 0]
    out: list[int] = []
    while ready:
        v = ready.pop()
        out.append(v)
        for w in succ[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.append(w)
    return out
