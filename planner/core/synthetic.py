"""Synthetic joint training graphs: the bundled example, tests and property checks.

`training_graph` builds the forward+loss+backward graph of a chain of layers with optional skip
connections (every `skip`-th layer adds the output of the layer `skip` back), the shape of
ResNets and transformer stacks. `random_dag` builds small arbitrary DAGs.
"""

from __future__ import annotations

import random as _random

from planner.core.graph import CostSource, Edge, FixedMemory, Graph, GraphMetadata, Node, Phase


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
        metadata=GraphMetadata(model_name=name, source="planner.core.synthetic"),
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


def random_layered_dag(
    n: int,
    *,
    seed: int = 0,
    width: float | None = None,
    width_variance: float = 0.75,
    edge_density: float | None = None,
    skip_density: float = 0.14,
) -> Graph:
    """A forward-only random layered DAG of `n` nodes, the family of Moccasin's
    `random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14`: a source (node 0, duration 0), layers of
    varying width (mean `width`, each drawn within ±`width_variance` of it), an edge from each node
    of the previous layer with probability `edge_density` (at least one), a skip connection from
    an earlier layer with probability `skip_density` per node, and a sink (the last node,
    duration 0) reading every node nobody else reads. Durations 10–1000 ms and output sizes
    50–5000 bytes, uniform in steps of 10, as in the shared files.

    Defaults scale with n: mean width 0.8·√n, and the edge density chosen so that a graph of
    1,000 nodes or more has about 6 edges per node (≈ 3.8 at 250 nodes, as the shared file)."""
    if n < 3:
        raise ValueError("random_layered_dag needs at least 3 nodes (source, one layer, sink)")
    rng = _random.Random(seed)
    mean_width = width if width is not None else max(1.0, 0.8 * n ** 0.5)
    # expected inputs from the previous layer: 3.6 at 250 nodes, 5.5 at 1,000 and beyond
    degree = 5.5 * min(1.0, n / 1000) ** 0.3
    density = edge_density if edge_density is not None else min(1.0, degree / mean_width)
    body = n - 2
    layers: list[list[int]] = [[0]]
    next_id = 1
    while next_id <= body:
        low = max(1, round(mean_width * (1 - width_variance)))
        high = max(low, round(mean_width * (1 + width_variance)))
        size = min(rng.randint(low, high), body - next_id + 1)
        layers.append(list(range(next_id, next_id + size)))
        next_id += size
    sink = next_id
    edge_set: set[tuple[int, int]] = set()
    for depth in range(1, len(layers)):
        previous = layers[depth - 1]
        for v in layers[depth]:
            sources = [u for u in previous if rng.random() < density] or [rng.choice(previous)]
            edge_set.update((u, v) for u in sources)
            if depth >= 2 and rng.random() < skip_density:
                back = min(depth - 1, 1 + int(rng.expovariate(0.25)) + 1)
                edge_set.add((rng.choice(layers[depth - back]), v))
    has_user = {u for u, _ in edge_set}
    edge_set.update((v, sink) for v in range(1, sink) if v not in has_user)
    nodes = [
        Node(
            id=i,
            name=str(i),
            compute_ms=0.0 if i in (0, sink) else float(10 * rng.randint(1, 100)),
            cost_source=CostSource.estimated,
            output_bytes=10 * rng.randint(5, 500),
        )
        for i in range(sink + 1)
    ]
    edges = [Edge(source=u, target=v) for u, v in sorted(edge_set)]
    name = (f"random_layered_n{n}_w{mean_width:.2f}_nlv{width_variance}_ed{density:.2f}"
            f"_scd{skip_density}_seed{seed}")
    return Graph(nodes=nodes, edges=edges,
                 metadata=GraphMetadata(model_name=name, source="planner.core.synthetic"))
