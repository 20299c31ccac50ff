"""The ordering rule: backward-phase nodes run after the loss, even without a data path."""

from __future__ import annotations

import time

from planner.core.graph import Edge, Graph, Node, Phase
from planner.core.io import graph_from_dict
from planner.core.synthetic import training_graph

F, L, B = Phase.forward, Phase.loss, Phase.backward


def graph(phases: dict[int, Phase], edges: list[tuple[int, int]], **kw: object) -> Graph:
    return Graph(
        nodes=[Node(id=i, name=f"n{i}", phase=p, output_bytes=1) for i, p in phases.items()],
        edges=[Edge(source=u, target=v) for u, v in edges],
        **kw,  # type: ignore[arg-type]
    )


def independent_backward() -> Graph:
    # 0 forward -> 2 loss; 1 is backward but reads only the forward node 0 (a weight's
    # transpose for its gradient); 3 is the gradient, reading the loss and 1. File order puts
    # 1 before the loss.
    return graph({0: F, 1: B, 2: L, 3: B}, [(0, 1), (0, 2), (2, 3), (1, 3)])


def test_backward_node_independent_of_the_loss_follows_it() -> None:
    g = independent_backward()
    idx = g.index
    assert idx.loss_nodes == [2]
    assert idx.control_predecessors == {1: [2]}
    assert idx.order_predecessors[1] == [0, 2]
    assert idx.order_predecessors[3] == idx.predecessors[3] == [2, 1]
    assert idx.predecessors[1] == [0]  # data edges untouched
    order = idx.topological_order
    assert order.index(1) > order.index(2)
    assert order == [0, 2, 1, 3]


def test_descendants_of_the_loss_need_no_control_edge() -> None:
    g = training_graph(6, skip=2)
    assert g.index.control_predecessors == {}
    assert g.index.order_predecessors == g.index.predecessors
    assert g.index.topological_order == list(range(len(g.nodes)))


def test_no_loss_node_no_control_dependencies() -> None:
    g = graph({0: F, 1: B, 2: B}, [(0, 2), (1, 2)])
    assert g.index.loss_nodes == [] and g.index.control_predecessors == {}
    assert g.index.order_predecessors is g.index.predecessors


def test_backward_node_upstream_of_the_loss_gets_none() -> None:
    # a mislabelled graph: backward node 1 feeds the loss; a control edge would be a cycle
    g = graph({0: F, 1: B, 2: L, 3: B}, [(0, 1), (1, 2), (0, 3)])
    assert g.index.control_predecessors == {3: [2]}
    order = g.index.topological_order
    assert order.index(1) < order.index(2) < order.index(3)


def test_only_the_last_loss_nodes_are_used() -> None:
    # loss computed in two loss-phase ops (2 -> 3); backward 4 reads forward node 0 only
    edges = [(0, 1), (1, 2), (2, 3), (0, 4), (3, 5), (4, 5)]
    g = graph({0: F, 1: F, 2: L, 3: L, 4: B, 5: B}, edges)
    assert g.index.loss_nodes == [3]
    assert g.index.control_predecessors == {4: [3]}


def test_a_given_order_that_breaks_the_rule_still_loads() -> None:
    doc = independent_backward().model_dump(mode="json")
    doc["order"] = [0, 1, 2, 3]  # an old file: backward node 1 before the loss
    g = graph_from_dict(doc)
    assert g.index.topological_order == [0, 1, 2, 3]  # kept as given
    assert g.index.order_predecessors[1] == [0, 2]  # the simulator checks plans against it


def test_control_edges_do_not_enter_the_content_hash() -> None:
    g = independent_backward()
    h = g.content_hash()
    _ = g.index.order_predecessors
    assert g.content_hash() == h and "order" not in g.model_dump(exclude_none=True)


def big_graph(layers: int) -> Graph:
    """A chain of `layers` forward nodes, the loss, and per layer a gradient node plus a
    backward node that reads only forward outputs (every other backward node independent)."""
    nodes = [Node(id=i, phase=F, output_bytes=1) for i in range(layers)]
    loss = layers
    nodes.append(Node(id=loss, phase=L, output_bytes=1))
    edges = [Edge(source=i, target=i + 1) for i in range(layers)]
    upstream = loss
    for i in reversed(range(layers)):
        t, g = len(nodes), len(nodes) + 1
        nodes += [Node(id=t, phase=B, output_bytes=1), Node(id=g, phase=B, output_bytes=1)]
        edges += [Edge(source=i, target=t), Edge(source=upstream, target=g)]
        edges.append(Edge(source=t, target=g))
        upstream = g
    return Graph(nodes=nodes, edges=edges)


def test_twenty_thousand_nodes_index_quickly() -> None:
    g = big_graph(6_667)  # 20,002 nodes
    assert len(g.nodes) > 20_000
    start = time.perf_counter()
    idx = g.model_copy().index  # a fresh index
    control = idx.control_predecessors
    order = idx.topological_order
    elapsed = time.perf_counter() - start
    assert len(control) == 6_667  # each transpose-like node
    pos = {v: i for i, v in enumerate(order)}
    assert all(pos[6_667] < pos[v] for v in control)
    # well under a second on one core; generous here for a shared test machine (a per-node
    # search would take minutes)
    assert elapsed < 30.0, elapsed
