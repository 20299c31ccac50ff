"""The simulator: replays a plan on a graph, checks it, and measures memory and compute.

Memory model (Checkmate/Moccasin's, so that published figures are comparable): a node's output
is resident from its computation until it is freed; while a node runs, memory holds the resident
set plus its output plus its workspace; fixed memory is added throughout. A view (alias_of) adds
no bytes but keeps its base's storage alive until the view is freed too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.graph import Graph
from planner.plan import Action, ActionOp, Plan, Predicted


class PlanError(ValueError):
    """A plan that cannot run on the graph; names the action index and the node."""

    def __init__(self, message: str, action_index: int | None = None, node: int | None = None):
        super().__init__(message)
        self.action_index = action_index
        self.node = node


@dataclass(frozen=True)
class TimelinePoint:
    action_index: int
    action: str  # text form, e.g. "C12"
    live_bytes: int  # during a compute (inputs, output, workspace); after a free


@dataclass(frozen=True)
class SimulationResult:
    peak_bytes: int  # fixed memory included
    peak_action_index: int
    fixed_bytes: int
    compute_cost: float
    baseline_cost: float  # every node once
    computations: int
    node_count: int
    timeline: tuple[TimelinePoint, ...]

    @property
    def overhead(self) -> float:
        """Extra compute over running every node once, as a fraction."""
        if self.baseline_cost <= 0:
            return 0.0
        return (self.compute_cost - self.baseline_cost) / self.baseline_cost

    @property
    def recomputations(self) -> int:
        """Computations beyond the first of each node."""
        return self.computations - self.node_count

    def predicted(self) -> Predicted:
        return Predicted(
            peak_bytes=self.peak_bytes, compute_cost=self.compute_cost, overhead=self.overhead
        )


def simulate(
    graph: Graph, plan: Plan | Sequence[Action], *, check_hash: bool = True
) -> SimulationResult:
    """Replay `plan` on `graph`; raise PlanError at the first action that cannot run."""
    if isinstance(plan, Plan):
        if check_hash and plan.graph_hash != graph.content_hash():
            raise PlanError(
                f"the plan is for graph {plan.graph_hash[:19]}…, not this graph "
                f"({graph.content_hash()[:19]}…): solve again for this graph"
            )
        actions: Sequence[Action] = plan.actions
    else:
        actions = plan
    index = graph.index
    describe = graph.describe
    preds = index.predecessors
    own_bytes = index.storage_bytes
    root = {v: index.storage_root(v) for v in index.position}
    fixed = graph.fixed_bytes

    resident: set[int] = set()
    refcount: dict[int, int] = {}  # storage root -> resident nodes sharing it
    freed_at: dict[int, int] = {}  # node -> index of the action that last freed it
    computed_count: dict[int, int] = {}
    live = fixed
    peak, peak_index = fixed, -1
    cost: list[float] = []
    timeline: list[TimelinePoint] = []

    for i, a in enumerate(actions):
        v = a.node
        if v not in index.position:
            raise PlanError(f"action {i} ({a}): node {v} is not in the graph", i, v)
        if a.op is ActionOp.compute:
            if v in resident:
                raise PlanError(f"action {i} ({a}): {describe(v)} is already resident", i, v)
            if computed_count.get(v) and not index.node(v).recomputable:
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
            resident.add(v)
            r = root[v]
            refcount[r] = refcount.get(r, 0) + 1
            if refcount[r] == 1:
                live += own_bytes[r]
            during = live + index.node(v).workspace_bytes
            computed_count[v] = computed_count.get(v, 0) + 1
            cost.append(index.node(v).compute_ms)
            if during > peak:
                peak, peak_index = during, i
            timeline.append(TimelinePoint(i, str(a), during))
        elif a.op is ActionOp.free:
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
            timeline.append(TimelinePoint(i, str(a), live))
        else:  # pragma: no cover - future action kinds are rejected until simulated
            raise PlanError(f"action {i} ({a}): unsupported action {a.op}", i, v)

    missing = [v for v in index.topological_order if v not in computed_count]
    if missing:
        listed = ", ".join(describe(v) for v in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise PlanError(f"the plan never computes {listed}{more}", len(actions), missing[0])
    return SimulationResult(
        peak_bytes=peak,
        peak_action_index=peak_index,
        fixed_bytes=fixed,
        compute_cost=math.fsum(cost),
        baseline_cost=graph.total_compute_ms,
        computations=len(cost),
        node_count=len(graph.nodes),
        timeline=tuple(timeline),
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
