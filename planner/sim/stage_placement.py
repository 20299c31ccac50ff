"""Which pipeline stage runs each node of a graph (planner.sim.stage_costs reads it): the stage
naming it by id or module, else where its data flows (`place_the_rest`, the runtime's rule for
a model's glue); memoised on the graph per stage layout."""

from __future__ import annotations

from typing import Any

from planner.core.graph import Graph, Phase
from planner.core.pipeline_actions import Partition
from planner.sim.result import PlanError


def _prefixes(path: str) -> tuple[str, ...]:
    """`path` and its dotted prefixes, longest last ('h.3.attn' -> 'h', 'h.3', 'h.3.attn')."""
    parts = path.split(".")
    return tuple(".".join(parts[:n]) for n in range(1, len(parts) + 1))


def stage_of_nodes(graph: Graph, partition: Partition) -> dict[int, int]:
    """Node id -> stage index: the stage naming it (by id or module; two: PlanError naming the
    node), else where its inputs are (`place_the_rest`). Memoised on the graph per stage
    layout (a search simulates the same stages many times)."""
    memo = graph.index.memo.setdefault("stage_of_nodes", {})
    key = _layout(partition)
    if key not in memo:
        _forget_oldest(memo, MAPS_KEPT)
        memo[key] = _stage_of_nodes(graph, partition)
    return dict(memo[key])


MAPS_KEPT = 64  # stage layouts whose node map the graph keeps (one entry per node each)
COSTS_KEPT = 4096  # stage layouts whose stage costs the graph keeps


def _layout(partition: Partition) -> tuple[object, ...]:
    """What places a partition's nodes: each stage's index, modules and named nodes."""
    return (partition.stage_count,
            tuple((s.stage_index, tuple(s.modules), tuple(s.nodes)) for s in partition.stages))


def _forget_oldest(memo: dict[Any, Any], most: int) -> None:
    if len(memo) >= most:
        memo.pop(next(iter(memo)))


def _stage_of_nodes(graph: Graph, partition: Partition) -> dict[int, int]:
    owners: dict[str, list[int]] = {}  # module path -> the stages naming it
    for s in partition.stages:
        for m in dict.fromkeys(s.modules):
            owners.setdefault(m, []).append(s.stage_index)
    owned: dict[int, list[int]] = {}  # stage -> the nodes inside its modules, in node order
    if owners:
        prefixes = graph.index.memo.setdefault("module_prefixes", {})
        for n in graph.nodes:
            path = n.module_path
            if path not in prefixes:
                prefixes[path] = _prefixes(path) if path else ("",)
            for t in {t for m in prefixes[path] for t in owners.get(m, ())}:
                owned.setdefault(t, []).append(n.id)
    out: dict[int, int] = {}
    for s in partition.stages:  # in stage order, as the messages name the stages
        for v in s.nodes:
            if v not in graph.index.position:
                raise PlanError(
                    f"partition: stage {s.stage_index} names node {v}, not in the graph", node=v
                )
            _assign(graph, out, v, s.stage_index)
        for v in owned.get(s.stage_index, ()):
            if out.get(v) != s.stage_index:
                _assign(graph, out, v, s.stage_index)
    place_the_rest(graph, out, partition.stage_count - 1)
    return out


def place_the_rest(graph: Graph, out: dict[int, int], last: int) -> None:
    """Nodes no stage names (e.g. a loss outside every module) follow their inputs, as
    planner.runtime.pipeline_split places a model's glue: a forward node goes to the latest
    stage among its placed inputs; one with none (it reads only graph inputs or constants, or
    only such nodes: `torch.arange(t)` for a position embedding) to the earliest stage reading
    it (0 when none does), so a cut before its reader does not send it; a backward node to the
    earliest stage among its backward inputs (else the latest among its inputs; the last stage
    without inputs)."""
    index = graph.index
    free: list[int] = []  # forward nodes with no placed input, in topological order
    for v in index.topological_order:
        if v in out:
            continue
        preds = index.predecessors[v]
        if index.node(v).phase != Phase.backward:
            placed = [out[u] for u in preds if u in out]
            if placed:
                out[v] = max(placed)
            else:
                free.append(v)
            continue
        grads = [out[u] for u in preds if u in out and index.node(u).phase == Phase.backward]
        out[v] = min(grads) if grads else max((out[u] for u in preds if u in out), default=last)
    for v in reversed(free):
        out[v] = min((out[w] for w in index.successors[v] if w in out), default=0)


def _assign(graph: Graph, out: dict[int, int], v: int, stage: int) -> None:
    if v in out and out[v] != stage:
        raise PlanError(
            f"partition: {graph.describe(v)} is in stages {out[v]} and {stage}", node=v
        )
    out[v] = stage
