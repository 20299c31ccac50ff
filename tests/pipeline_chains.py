"""Random layer chains for the pipeline partitioner tests (solvers/pipeline/chains.py)."""

from __future__ import annotations

import random

from planner.core.graph import Graph
from planner.solvers.pipeline.chains import LayerSpec, chain_graph

MiB = 2**20


def random_chain(seed: int, layers: int) -> Graph:
    rng = random.Random(seed)
    specs = [
        LayerSpec(f"layers.{i}", rng.uniform(0.5, 3), rng.uniform(1, 6),
                  rng.randint(1, 40) * MiB, rng.randint(1, 8) * MiB, rng.randint(0, 30) * MiB,
                  workspace_bytes=rng.randint(0, 4) * MiB, weight_fraction=rng.uniform(0.3, 0.7))
        for i in range(layers)
    ]
    return chain_graph(specs, optimizer=rng.choice(["sgd", "adam"]))
