"""Chain operation sequence -> plan.json actions over the graph's nodes.

Each operation runs its nodes from the layout (see `planner.solvers.chain.layout`) in order; a node
is
freed right after its last consumer inside the operation unless the operation keeps it:

- F_all keeps `saved[i]`; F_ck keeps `joint[i]`; F_∅ keeps `joint[i]` and then frees
  `joint[i-1]`.
- B keeps `grad_out[i]` (δ^{i-1}) and `joint[i-1]` (a^{i-1}, read again by B_{i-1}); whatever of
  ā^i and δ^i is still resident at its end is freed.
- D frees `joint[i]`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from planner.core.graph import Graph
from planner.core.plan import Action, compute, free
from planner.solvers.chain.layout import ChainLayout
from planner.solvers.chain.sequence import Op, OpKind


def run_nodes(
    graph: Graph, nodes: Sequence[int], protected: Collection[int], outside: Iterable[int] = ()
) -> list[Action]:
    """Compute `nodes` in order, freeing each node (of `nodes` or of `outside`, values resident
    before) after its last use here, except the `protected` ones; `outside` values never used
    here are freed at the end."""
    preds = graph.index.predecessors
    candidates = set(nodes) | set(outside)
    uses: dict[int, int] = {}
    for v in nodes:
        for u in preds[v]:
            if u in candidates:
                uses[u] = uses.get(u, 0) + 1
    actions: list[Action] = []
    freed: set[int] = set()
    for v in nodes:
        actions.append(compute(v))
        for u in preds[v]:
            if u in uses:
                uses[u] -= 1
                if uses[u] == 0 and u not in protected:
                    actions.append(free(u))
                    freed.add(u)
        if uses.get(v, 0) == 0 and v not in protected:
            actions.append(free(v))
            freed.add(v)
    for u in outside:
        if u not in freed and u not in protected and uses.get(u, 0) == 0:
            actions.append(free(u))
    return actions


def op_actions(graph: Graph, layout: ChainLayout, op: Op) -> list[Action]:
    i = op.stage
    if op.kind is OpKind.f_all:
        return run_nodes(graph, layout.forward[i], layout.saved[i])
    if op.kind is OpKind.f_ck:
        return run_nodes(graph, layout.ck_forward[i], layout.joint[i])
    if op.kind is OpKind.f_none:
        actions = run_nodes(graph, layout.ck_forward[i], layout.joint[i])
        return actions + [free(u) for u in layout.joint[i - 1]]
    if op.kind is OpKind.backward:
        grads_in = layout.grad_out[i + 1] if i < layout.length else frozenset()
        protected = layout.grad_out[i] | set(layout.joint[i - 1])
        outside = sorted(layout.saved[i] | grads_in)
        return run_nodes(graph, layout.backward[i], protected, outside)
    return [free(u) for u in layout.joint[i]]


def translate(graph: Graph, layout: ChainLayout, ops: Sequence[Op]) -> list[Action]:
    """The whole plan: compute the input's nodes, then every operation's actions."""
    actions = [compute(v) for v in layout.joint[0]]
    for op in ops:
        actions += op_actions(graph, layout, op)
    return actions
