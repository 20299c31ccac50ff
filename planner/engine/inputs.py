"""Reading a workload given by a user: graph.json, a Checkmate/Moccasin file, or a chain.json.

The contracts layer (`planner.core.io`) reads the first two; a chain.json becomes its equivalent
graph through the chain solver's layout, which only a layer above the solvers may call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core import io
from planner.core.graph import Graph
from planner.solvers.chain.layout import chain_graph
from planner.solvers.chain.model import chain_from_dict


def graph_from_dict(data: Any, where: str = "graph") -> Graph:
    if io.is_chain_document(data):
        return chain_graph(chain_from_dict(data, where))[0]
    return io.graph_from_dict(data, where)


def load_graph(path: str | Path) -> Graph:
    return graph_from_dict(io.read_json(path), where=str(path))
