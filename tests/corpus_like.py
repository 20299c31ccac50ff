"""Corpus-like graphs for solver tests: the synthetic training graph with the magnitudes of the
Checkmate corpus (activations of 12 MB to 2.5 GB in 128-byte units, costs of 1e8 to 1e10), the
numbers that gave MILP backends numerical trouble (memory rows with coefficients ~1e7)."""

from __future__ import annotations

import random

from planner.core.graph import Graph, Node
from planner.core.synthetic import training_graph


def corpus_like(layers: int, skip: int, seed: int) -> Graph:
    g = training_graph(layers, skip=skip, seed=seed)
    rng = random.Random(seed)
    nodes = [
        Node(**{**n.model_dump(), "output_bytes": rng.randint(10**5, 2 * 10**7) * 128,
                "compute_ms": n.compute_ms * rng.uniform(1e8, 1e9)})
        for n in g.nodes
    ]
    return Graph(nodes=nodes, edges=g.edges, fixed=g.fixed, metadata=g.metadata)
