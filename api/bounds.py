"""Integer bounds at the API boundary: every number that reaches the store or a solver fits a
64-bit integer column (SQLite INTEGER, PostgreSQL BIGINT) and CP-SAT's int64 arithmetic, so a
huge value is a 422 naming its field, never an OverflowError (500) deep inside."""

from __future__ import annotations

from planner.core.errors import InputError
from planner.core.graph import Graph

INT64_MAX = 2**63 - 1


def check_graph_bounds(graph: Graph, where: str = "graph") -> None:
    """InputError naming the first id or byte count of `graph` over INT64_MAX, or the total of
    its byte counts when that is (a solver adds them up)."""
    total = 0

    def bounded(value: int, field: str) -> None:
        if value > INT64_MAX:
            raise InputError(f"{where}: {field}: {value} is over the largest allowed value "
                             f"{INT64_MAX} (2**63 - 1)")

    for i, node in enumerate(graph.nodes):
        label = f"nodes[{i}]" + (f" (id {node.id}, {node.name})" if node.name else "")
        bounded(node.id, f"{label}.id")
        for field in ("output_bytes", "workspace_bytes"):
            value = getattr(node, field)
            bounded(value, f"{label}.{field}")
            total += value
    for field, value in graph.fixed.model_dump().items():
        if isinstance(value, int):
            bounded(value, f"fixed.{field}")
            total += value
    if graph.model_state is not None:
        for i, parameter in enumerate(graph.model_state.parameters):
            bounded(parameter.bytes, f"model_state.parameters[{i}].bytes")
            total += parameter.bytes
    if total > INT64_MAX:
        raise InputError(f"{where}: its byte counts add up to {total}, over the largest allowed "
                         f"total {INT64_MAX} (2**63 - 1)")
