"""Where a plan's frees of copied values go, so that the compute stream never waits for them.

In the event model (planner.sim.copy_streams) `F v` releases v's device storage at its issue,
in plan order, and when a copy still reads v (its offload) or writes it (its prefetch) the
compute stream first waits for that copy: a release can never drift past the plan's point, as
it would if it waited for the copy on the CPU (the allocator sees frees in program order).
A planner that writes `O v F v` means "release v once its copy is done"; `place_frees` moves
each such `F` to the first point of the plan issued at or after the copy's end (as simulated),
so the wait costs nothing and the memory is held exactly as long as the copy needs it.

A moved `F v` never passes an action that uses v (a compute reading it, its prefetch, offload or
recomputation): there it is issued first, and waits. The replay that places the frees is the
simulation itself: the placed plan and its `SimulationResult` come out of one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.core.graph import Graph, paused_gc
from planner.core.plan import Action, ActionOp
from planner.core.resources import Resources
from planner.sim.copy_streams import _Streams
from planner.sim.ledger import describe_missing
from planner.sim.ledger_replay import flow_by_run
from planner.sim.result import PlanError, SimulationResult
from planner.sim.simulator import simulate

COPY_OPS = (ActionOp.offload, ActionOp.prefetch, ActionOp.drop)


class _PlacingStreams(_Streams):
    """The event replay, holding back each free whose copy is still running."""

    def place(self, actions: Sequence[Action]) -> tuple[list[Action], SimulationResult]:
        handlers: dict[ActionOp, Callable[[int, Action], None]] = {
            ActionOp.compute: self.compute,
            ActionOp.free: self.free,
            ActionOp.offload: self.offload,
            ActionOp.prefetch: self.prefetch,
            ActionOp.drop: self.drop,
        }
        placed: list[Action] = []
        held: dict[int, Action] = {}  # node -> its free, held back while a copy uses v
        self.handed, self.kept = flow_by_run(self.ledger, actions)  # frees move: still right

        def issue(a: Action) -> None:
            handlers[a.op](len(placed), a)
            placed.append(a)

        for a in actions:
            if a.node not in self.index.position:
                raise self.fail(len(placed), a, f"node {a.node} is not in the graph")
            if held:
                self._release_due(a, held, issue)
            if (a.op is ActionOp.free and a.node in self.resident
                    and self.copy_busy.get(a.node, 0.0) > self.compute_free):
                held[a.node] = a
                continue
            issue(a)
        for v in list(held):
            issue(held.pop(v))
        if len(self.computed) < len(self.index.position):
            missing = [v for v in self.index.topological_order if v not in self.computed]
            raise PlanError(describe_missing(self.graph, missing), len(placed), missing[0])
        return placed, self.measure(placed)

    def _release_due(self, a: Action, held: dict[int, Action],
                     issue: Callable[[Action], None]) -> None:
        """Issue, before `a`, the held frees whose copy has ended by now or whose node `a`
        uses (an action on it, or a compute reading it)."""
        uses = {a.node}
        if a.op is ActionOp.compute:
            uses.update(self.index.predecessors[a.node])
        for v in list(held):
            if v in uses or self.copy_busy.get(v, 0.0) <= self.compute_free:
                issue(held.pop(v))


def place_frees(
    graph: Graph, actions: Sequence[Action], resources: Resources | None
) -> tuple[list[Action], SimulationResult]:
    """The plan with each free of a copied value moved to where its copy has ended, and its
    simulation; a plan without host copies comes back as it is. Raises PlanError as
    `simulate` does."""
    if not any(a.op in COPY_OPS for a in actions):
        return list(actions), simulate(graph, actions, resources)
    with paused_gc():
        return _PlacingStreams(graph, resources).place(actions)
