"""Synthetic joint training graphs: the bundled example, tests and property checks.

`training_graph` builds the forward+loss+backward graph of a chain of layers with optional skip
connections (every `skip`-th layer adds the output of the layer `skip` back), the shape of
ResNets and transformer stacks. `random_dag` builds small arbitrary DAGs.
"""

from __future__ import annotations

import random as _random

from planner.graph import CostSource, Edge, FixedMemory, Graph, GraphMetadata, Node, Phase


def training_graph(
    layers: int,
    *,
    skip: int = 0,
    seed: int = 0,
    name: str = "synthetic",
    fixed_bytes: int = 0,
) -> Graph:
    rng = _random.Random(seed)
    nodes: list[Node] = []
    edges: list[Edge] = []
    fwd: list[int] = []
    for i in range(layers):
        nid = len(nodes)
        nodes.append(
            Node(
                id=nid,
                name=f"layer{i}",
                op="layer",
                phase=Phase.forward,
                compute_ms=float(rng.randint(1, 10)),
                cost_source=CostSource.estimated,
                output_bytes=rng.randint(1, 8) * 1024 * 1024,
                module_path=f"layers.{i}",
            )
        )
        if fwd:
            edges.append(Edge(source=fwd[-1], target=nid))
        if skip and i >= skip and i % skip == 0:
            edges.append(Edge(source=fwd[i - skip], target=nid))
        fwd.append(nid)
    loss = len(nodes)
    nodes.append(
        Node(id=loss, name="loss", op="loss", phase=Phase.loss, compute_ms=1.0, output_bytes=4)
    )
    edges.append(Edge(source=fwd[-1], target=loss))
    grad_of: dict[int, int] = {}
    upstream = loss
    for i in reversed(range(layers)):
        nid = len(nodes)
        nodes.append(
            Node(
                id=nid,
                name=f"layer{i}_backward",
                op="layer_backward",
                phase=Phase.backward,
                compute_ms=2.0 * nodes[fwd[i]].compute_ms,
                cost_source=CostSource.estimated,
                output_bytes=nodes[fwd[i - 1]].output_bytes if i else 1024,
                module_path=f"layers.{i}",
            )
        )
        edges.append(Edge(source=upstream, target=nid))
        edges.append(Edge(source=fwd[i], target=nid))
        if i:
            edges.append(Edge(source=fwd[i - 1], target=nid))
        # The gradient of a skip source also flows from the layer that added it.
        if skip and i + skip < layers and (i + skip) % skip == 0 and (i + skip) in grad_of:
            edges.append(Edge(source=grad_of[i + skip], target=nid))
        grad_of[i] = nid
        upstream = nid
    return Graph(
        nodes=nodes,
        edges=edges,
        fixed=FixedMemory(parameters_bytes=fixed_bytes),
        metadata=GraphMetadata(model_name=name, source="planner.synthetic"),
    )


def random_dag(
    n: int, *, edge_probability: float = 0.3, seed: int = 0, max_bytes: int = 10
) -> Graph:
    """A random DAG on nodes 0..n-1 (edges go from lower to higher ids), small integer sizes."""
    rng = _random.Random(seed)
    nodes = [
        Node(
            id=i,
            name=f"n{i}",
            compute_ms=float(rng.randint(1, 5)),
            output_bytes=rng.randint(1, max_bytes),
        )
        for i in range(n)
    ]
    edges = [
        Edge(source=u, target=v)
        for v in range(1, n)
        for u in range(v)
        if u == v - 1 or rng.random() < edge_probability
    ]
    return Graph(nodes=nodes, edges=edges, metadata=GraphMetadata(model_name=f"random{n}"))
