"""Model state per pipeline stage: each parameter's stage (that of its gradient node, else of
its module), the state a stage holds, and the fixed bytes no stage owns, shared evenly."""

from __future__ import annotations

from collections.abc import Iterator

from planner.core.graph import Graph
from planner.core.model_state import ParameterState, StateBytes
from planner.sim.ledger import MemoryLedger


def _enclosing_stage(module_stage: dict[str, int], module_path: str) -> int | None:
    """The stage of `module_path`'s nodes, else of its nearest enclosing module with nodes."""
    if module_path in module_stage:
        return module_stage[module_path]
    path = module_path.rpartition(".")[0]
    while path:
        if path in module_stage:
            return module_stage[path]
        path = path.rpartition(".")[0]
    return None


def parameter_stages(
    graph: Graph, stage: dict[int, int]
) -> Iterator[tuple[ParameterState, StateBytes, int | None]]:
    """Each parameter, its bytes and its stage (or any grouping of nodes, such as a chain's
    units): that of its gradient node, else of its module (or the nearest enclosing module with
    nodes); None: placed nowhere."""
    ms = graph.model_state
    if ms is None:
        return
    module_stage: dict[str, int] = {}
    for n in graph.nodes:
        module_stage.setdefault(n.module_path, stage[n.id])
    for p, b in ms.per_parameter():
        s = stage.get(p.gradient_node) if p.gradient_node is not None else None
        if s is None:
            s = _enclosing_stage(module_stage, p.module_path)
        yield p, b, s


def model_state_per_stage(graph: Graph, stage: dict[int, int], count: int) -> list[StateBytes]:
    """Each stage's placed model state (`parameter_stages`); unplaced parameters nowhere."""
    placed = [StateBytes() for _ in range(count)]
    for _, b, s in parameter_stages(graph, stage):
        if s is not None:
            placed[s] = placed[s] + b
    return placed


def unplaced_fixed_bytes(graph: Graph, placed_bytes: int) -> int:
    """The step's fixed bytes that no stage owns (inputs, buffers, unplaced parameters; all of
    them without model_state), given the model state placed on stages."""
    return max(0, MemoryLedger.of(graph).end_bytes - placed_bytes)


def even_share_bytes(rest_bytes: int, stage_index: int, stage_count: int) -> int:
    """Stage `stage_index`'s even share of `rest_bytes` (the first stages take the remainder)."""
    return rest_bytes // stage_count + (1 if stage_index < rest_bytes % stage_count else 0)


def stage_model_state_bytes(graph: Graph, stage: dict[int, int], count: int) -> list[int]:
    """Each stage's model state and its even share of the fixed bytes no stage owns."""
    placed = [b.total_bytes for b in model_state_per_stage(graph, stage, count)]
    rest = unplaced_fixed_bytes(graph, sum(placed))
    return [placed[s] + even_share_bytes(rest, s, count) for s in range(count)]
