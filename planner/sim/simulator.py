"""The simulator: replays a plan on a graph, checks it, and measures memory and time.

Memory model (Checkmate/Moccasin's, so that published figures are comparable): a node's output
is resident from its computation until it is freed; while a node runs, memory holds the resident
set plus its output plus its workspace; fixed memory (`step_memory(graph).start_bytes`) is added
throughout, and gradient buffers held from a node (`held_from_node`) from its first computation
to the end of the step. A view (alias_of) adds no bytes but keeps its base's storage alive until
the view is freed too. Backward ops may not run before the loss
(`graph.index.order_predecessors`). These rules are written once, in planner.sim.ledger's
`MemoryLedger`, which this replay, the copy streams and every solver's accounting use.

`simulate` picks the replay a plan needs: compute/free lists on one stream are replayed here
action by action (version-1 figures, exactly); plans with host copies (O/P/D) go to the event
simulation of planner.sim.copy_streams (compute, d2h and h2d streams), pipelines to
planner.sim.pipeline_ranks (every rank, send/recv matched), FSDP plans to planner.sim.fsdp_plans
(one FSDP2 rank on the graph's FSDP model). docs/plan.md describes the event model.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.core.graph import Graph, paused_gc
from planner.core.plan import Action, Plan, PlanKind
from planner.core.resources import Resources
from planner.sim.ledger import (
    MemoryLedger,
    NeedsStreams,
    control_predecessors,
    describe_missing,
    loss_rule_error,
)
from planner.sim.lower_bound import peak_lower_bound_bytes
from planner.sim.result import (
    MemoryPoint,
    PlanError,
    RankResult,
    ReplayTimeline,
    SimulationAbandoned,
    SimulationResult,
    TimelinePoint,
)

__all__ = [
    "MemoryPoint", "PlanError", "RankResult", "SimulationAbandoned", "SimulationResult",
    "TimelinePoint",
    "control_predecessors", "describe_missing", "loss_rule_error", "lower_bound_peak_bytes",
    "simulate",
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
        if plan.kind is PlanKind.fsdp:  # one FSDP2 rank, on the graph's FSDP model
            from planner.sim.fsdp_plans import simulate_fsdp_plan

            assert plan.fsdp is not None  # validated
            return simulate_fsdp_plan(graph, plan.fsdp, resources)
        actions: Sequence[Action] = plan.actions
    else:
        actions = plan
    try:
        with paused_gc():
            return _replay(graph, actions, deadline)
    except NeedsStreams:
        from planner.sim.copy_streams import simulate_streams

        with paused_gc():
            return simulate_streams(graph, actions, resources)


def _replay(
    graph: Graph, actions: Sequence[Action], deadline: float | None = None
) -> SimulationResult:
    """One device, one stream, compute/free only: memory per action (version 1), by the
    memory ledger's checked replay."""
    figures = MemoryLedger.of(graph).replay(actions, timeline=True, deadline=deadline)
    assert figures.live_bytes is not None  # asked for
    return SimulationResult(
        peak_bytes=figures.peak_bytes,
        peak_action_index=figures.peak_action_index,
        fixed_bytes=figures.fixed_bytes,
        compute_cost=figures.compute_cost,
        baseline_cost=graph.total_compute_ms,
        computations=figures.computations,
        node_count=len(graph.nodes),
        timeline=ReplayTimeline(actions, figures.live_bytes),
        compute_ms=figures.compute_cost,
        makespan_ms=figures.compute_cost,
    )


def lower_bound_peak_bytes(graph: Graph) -> int:
    """No schedule peaks lower: computing any node needs its inputs, output and workspace, with
    the fixed bytes and what every node before it holds to the end of the step (weight
    gradients) resident (`planner.sim.lower_bound`)."""
    return max(graph.fixed_bytes, peak_lower_bound_bytes(graph))
