"""A graph's structure walked and checked in linear time: the topological order by generations,
reachability, the well-formedness checks run on every `Graph`, and `paused_gc` for building
large graphs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import networkx as nx

if TYPE_CHECKING:
    from planner.core.graph import Graph


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside (restored after, when it was on). Building a large
    graph or plan allocates hundreds of thousands of acyclic objects, and each automatic
    collection on the way walks all of them: half the time of loading a 20,000-node graph."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()



def generation_order(ids: list[int], successors: Mapping[int, list[int]]) -> list[int] | None:
    """networkx's topological_sort, exactly, without building a networkx graph: generation by
    generation (nodes whose inputs are all in earlier ones), each in the order its nodes became
    ready, the first in `ids` order. None when the edges close a cycle. Linear time."""
    indegree = dict.fromkeys(ids, 0)
    for v in ids:
        for w in successors[v]:
            indegree[w] += 1
    ready = [v for v in ids if indegree[v] == 0]
    order: list[int] = []
    while ready:
        generation, ready = ready, []
        for v in generation:
            for w in successors[v]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    ready.append(w)
        order.extend(generation)
    return order if len(order) == len(ids) else None


def reachable(start: int, adjacency: Mapping[int, Sequence[int]]) -> set[int]:
    """`start` and every node reachable from it through `adjacency`."""
    seen = {start}
    stack = [start]
    while stack:
        for w in adjacency[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen


def check_structure(graph: Graph) -> None:
    """Raise ValueError naming the node or edge when the graph is not a well-formed DAG."""
    ids: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if n.id in ids:
            raise ValueError(f"nodes[{i}]: duplicate node id {n.id}")
        ids.add(n.id)
    names = {n.id: n.name for n in graph.nodes}

    def label(node_id: int) -> str:
        return f"node {node_id} ({names[node_id]})" if names.get(node_id) else f"node {node_id}"

    seen_edges: set[tuple[int, int]] = set()
    for i, e in enumerate(graph.edges):
        for end in (e.source, e.target):
            if end not in ids:
                raise ValueError(
                    f"edges[{i}]: {e.source} -> {e.target} refers to missing node {end}"
                )
        if e.source == e.target:
            raise ValueError(f"edges[{i}]: self-loop on {label(e.source)}")
        if (e.source, e.target) in seen_edges:
            raise ValueError(f"edges[{i}]: duplicate edge {e.source} -> {e.target}")
        seen_edges.add((e.source, e.target))
    successors: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
    for e in graph.edges:
        successors[e.source].append(e.target)
    cycle = None
    if generation_order(list(successors), successors) is None:  # linear; networkx names it
        g = nx.DiGraph()
        g.add_nodes_from(ids)
        g.add_edges_from(seen_edges)
        cycle = nx.find_cycle(g)
    if cycle:
        path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        raise ValueError(f"the graph has a cycle through {label(cycle[0][0])}: {path}")
    for n in graph.nodes:
        if n.alias_of is None:
            continue
        if n.alias_of not in ids:
            raise ValueError(f"{label(n.id)}: alias_of refers to missing node {n.alias_of}")
        if (n.alias_of, n.id) not in seen_edges:
            raise ValueError(
                f"{label(n.id)}: alias_of {n.alias_of} must also be an edge {n.alias_of} -> {n.id}"
            )
    if graph.order is not None:
        _check_order(graph.order, ids, seen_edges, label)
    if graph.outputs is not None:
        for o in graph.outputs:
            if o not in ids:
                raise ValueError(f"outputs: refers to missing node {o}")
    if graph.model_state is not None:
        _check_model_state(graph, ids)


def _check_model_state(graph: Graph, ids: set[int]) -> None:
    for name in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
        if getattr(graph.fixed, name):
            raise ValueError(
                f"fixed.{name}: must be 0 when model_state is given (parameter, gradient and "
                "optimizer bytes follow from model_state)"
            )
    assert graph.model_state is not None
    for i, p in enumerate(graph.model_state.parameters):
        where = f"model_state.parameters[{i}] ({p.name}).gradient_node"
        if p.gradient_node is None:
            continue
        if p.gradient_node not in ids:
            raise ValueError(f"{where}: refers to missing node {p.gradient_node}")
        if not p.trainable:
            raise ValueError(f"{where}: a frozen parameter (trainable false) has no gradient")


def _check_order(
    order: Iterable[int], ids: set[int], edges: set[tuple[int, int]], label: Any
) -> None:
    order = list(order)
    if len(order) != len(ids) or set(order) != ids:
        missing = sorted(ids - set(order))[:3]
        extra = sorted(set(order) - ids)[:3]
        raise ValueError(
            f"order: must list every node exactly once (missing {missing}, unknown {extra}, "
            f"{len(order)} entries for {len(ids)} nodes)"
        )
    pos = {v: i for i, v in enumerate(order)}
    for u, v in edges:
        if pos[u] > pos[v]:
            raise ValueError(f"order: {label(v)} comes before its input {label(u)}")
