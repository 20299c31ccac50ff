"""The simulator: replays a plan on a graph, checks it, and measures memory and time.

Memory model (Checkmate/Moccasin's, so that published figures are comparable): a node's output
is resident from its computation until it is freed; while a node runs, memory holds the resident
set plus its output plus its workspace; fixed memory (`memory_model.step_memory(graph)
.start_bytes`) is added throughout, and gradient buffers held from a node
(`held_from_node`) from its first computation to the end of the step. A view (alias_of) adds no
bytes but keeps its base's storage alive until the view is freed too. Backward ops may not run
before the loss (`graph.index.order_predecessors`).

`simulate` picks the replay a plan needs: compute/free lists on one stream are replayed here
action by action (version-1 figures, exactly); plans with host copies (O/P/D) go to the event
simulation of planner.sim.copy_streams (compute, d2h and h2d streams), pipelines to
planner.sim.pipeline_ranks (every rank, send/recv matched). docs/plan.md describes the event model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from planner.core.graph import Graph, GraphIndex, paused_gc
from planner.core.plan import Action, ActionOp, Plan, PlanKind
from planner.core.resources import Resources
from planner.sim.result import (
    MemoryPoint,
    PlanError,
    RankResult,
    ReplayTimeline,
    SimulationAbandoned,
    SimulationResult,
    TimelinePoint,
)
from planner.sim.step_memory import step_memory

__all__ = [
    "MemoryPoint", "PlanError", "RankResult", "SimulationAbandoned", "SimulationResult",
    "TimelinePoint",
    "control_predecessors", "describe_missing", "lower_bound_peak_bytes", "simulate",
]


def simulate(
    graph: Graph,
    plan: Plan | Sequence[Action],
    resources: Resources | None = None,
    *,
    check_hash: bool = True,
    deadline: float | None = None,
) -> SimulationResult:
    """Replay `plan` on `graph` (on `resources`, else the plan's own); raise PlanError at the
    first action that cannot run. With a `deadline` (time.perf_counter()), a compute/free
    replay still running then raises SimulationAbandoned (a plan can be far longer than its
    graph: recompute-all's grows with the square)."""
    if isinstance(plan, Plan):
        if check_hash and plan.graph_hash != graph.content_hash():
            raise PlanError(
                f"the plan is for graph {plan.graph_hash[:19]}…, not this graph "
                f"({graph.content_hash()[:19]}…): solve again for this graph"
            )
        if resources is None:
            resources = plan.resources
        if plan.kind is PlanKind.pipeline:
            from planner.sim.pipeline_ranks import simulate_pipeline

            assert plan.partition is not None and plan.rank_actions is not None  # validated
            return simulate_pipeline(graph, plan.partition, plan.rank_actions, resources)
        actions: Sequence[Action] = plan.actions
    else:
        actions = plan
    try:
        with paused_gc():
            return _replay(graph, actions, deadline)
    except _NeedsStreams:
        from planner.sim.copy_streams import simulate_streams

        with paused_gc():
            return simulate_streams(graph, actions, resources)


class _NeedsStreams(Exception):
    """The plan moves memory to the host: the one-stream replay cannot measure it."""


def control_predecessors(index: GraphIndex) -> dict[int, list[int]]:
    """Node -> the order predecessors that are not data predecessors (the loss, for backward
    ops without a data path from it); empty for most graphs."""
    order = index.order_predecessors
    preds = index.predecessors
    if order is preds:
        return {}
    out: dict[int, list[int]] = {}
    for v, us in order.items():
        if us is not preds[v] and len(us) != len(preds[v]):
            data = set(preds[v])
            out[v] = [u for u in us if u not in data]
    return out


def loss_rule_error(graph: Graph, i: int, a: object, v: int, before: int) -> PlanError:
    return PlanError(
        f"action {i} ({a}): {graph.describe(v)} is a backward op and may not run before the "
        f"loss, {graph.describe(before)}, is computed",
        i,
        v,
    )


def describe_missing(graph: Graph, missing: list[int]) -> str:
    listed = ", ".join(graph.describe(v) for v in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"the plan never computes {listed}{more}"


_CHECK_EVERY = 1 << 13  # actions between deadline checks


def _replay(
    graph: Graph, actions: Sequence[Action], deadline: float | None = None
) -> SimulationResult:
    """One device, one stream, compute/free only: memory per action (version 1)."""
    index = graph.index
    describe = graph.describe
    preds = index.predecessors
    position = index.position
    nodes = graph.nodes
    own_bytes = index.storage_bytes
    root = index.storage_roots
    step = step_memory(graph)
    fixed = step.start_bytes
    held = step.held_from_node
    control = control_predecessors(index)
    compute_op, free_op = ActionOp.compute, ActionOp.free

    resident: set[int] = set()
    refcount: dict[int, int] = {}  # storage root -> resident nodes sharing it
    freed_at: dict[int, int] = {}  # node -> index of the action that last freed it
    computed_count: dict[int, int] = {}
    live = fixed
    peak, peak_index = fixed, -1
    cost: list[float] = []
    timeline: list[int] = []  # live bytes after each action (during a compute)

    for i, a in enumerate(actions):
        if deadline is not None and not i % _CHECK_EVERY and time.perf_counter() > deadline:
            raise SimulationAbandoned(f"replay stopped at action {i} of {len(actions)}")
        v = a.node
        op = a.op
        if v not in position:
            raise PlanError(f"action {i} ({a}): node {v} is not in the graph", i, v)
        if op is compute_op:
            node = nodes[position[v]]
            if v in resident:
                raise PlanError(f"action {i} ({a}): {describe(v)} is already resident", i, v)
            times = computed_count.get(v, 0)
            if times and not node.recomputable:
                raise PlanError(
                    f"action {i} ({a}): {describe(v)} is not recomputable but is computed again",
                    i,
                    v,
                )
            for u in preds[v]:
                if u not in resident:
                    why = (
                        f"it was freed at action {freed_at[u]}"
                        if u in freed_at
                        else "it was never computed"
                    )
                    raise PlanError(
                        f"action {i} ({a}): input {describe(u)} of {describe(v)} is not "
                        f"resident: {why}",
                        i,
                        v,
                    )
            if not times:
                if control and v in control:
                    for u in control[v]:
                        if u not in computed_count:
                            raise loss_rule_error(graph, i, a, v, u)
                if held:
                    live += held.get(v, 0)
            resident.add(v)
            r = root[v]
            refcount[r] = refcount.get(r, 0) + 1
            if refcount[r] == 1:
                live += own_bytes[r]
            during = live + node.workspace_bytes
            computed_count[v] = times + 1
            cost.append(node.compute_ms)
            if during > peak:
                peak, peak_index = during, i
            timeline.append(during)
        elif op is free_op:
            if v not in resident:
                why = (
                    f"it was already freed at action {freed_at[v]}"
                    if v in freed_at
                    else "it was never computed"
                )
                raise PlanError(f"action {i} ({a}): cannot free {describe(v)}: {why}", i, v)
            resident.discard(v)
            freed_at[v] = i
            r = root[v]
            refcount[r] -= 1
            if refcount[r] == 0:
                live -= own_bytes[r]
            timeline.append(live)
        else:
            raise _NeedsStreams

    if len(computed_count) < len(position):
        missing = [v for v in index.topological_order if v not in computed_count]
        raise PlanError(describe_missing(graph, missing), len(actions), missing[0])
    total = math.fsum(cost)
    return SimulationResult(
        peak_bytes=peak,
        peak_action_index=peak_index,
        fixed_bytes=fixed,
        compute_cost=total,
        baseline_cost=graph.total_compute_ms,
        computations=len(cost),
        node_count=len(nodes),
        timeline=ReplayTimeline(actions, timeline),
        compute_ms=total,
        makespan_ms=total,
    )


def lower_bound_peak_bytes(graph: Graph) -> int:
    """No schedule peaks lower: computing any node needs its inputs, output and workspace."""
    index = graph.index
    best = 0
    for n in graph.nodes:
        storages = {index.storage_root(u) for u in index.predecessors[n.id]}
        storages.add(index.storage_root(n.id))
        working = sum(index.storage_bytes[s] for s in storages) + n.workspace_bytes
        best = max(best, working)
    return graph.fixed_bytes + best
