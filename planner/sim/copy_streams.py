"""Event simulation of a one-device plan with host copies: a compute stream, a device-to-host and
a host-to-device copy stream (docs/plan.md, "The event model").

Actions are issued in plan order; an action is issued when the compute stream has finished the
computes before it (the issue time), as a runtime that records an event on the compute stream
and makes a copy stream wait for it does.

Memory is taken and released in plan order, at issue, on the compute stream, as the CUDA
caching allocator sees it: the CPU allocates and frees in program order however far it runs
ahead of the GPU, so a release that waited for a copy's completion in GPU time would, on the
device, happen wherever the CPU happened to notice it (the first GPU run: offload plans 7-25 %
over their prediction). The runtime (planner.runtime.offload_engine) follows the same rules.
- `C v` starts at max(compute stream free, every input ready) and lasts node.compute_ms; the wait
  beyond the stream's own tail is exposed transfer time. Its output, workspace and (first time)
  held gradient bytes are taken at its start; the workspace is released at its end.
- `O v` copies v's storage on the d2h stream: start = max(issue, v ready, d2h free), duration
  `resources.d2h.transfer_ms(bytes)`; the host buffer is taken at issue.
- `P v` copies it back on the h2d stream: start = max(issue, offload done, h2d free); its device
  buffer is taken at issue (allocated on the compute stream before the copy is queued); readers
  wait for the copy's end.
- `F v` releases the device copy at issue; when a copy still reads or writes it, the compute
  stream first waits for that copy (exposed transfer time). Planners place `F` where the copy is
  done (planner.sim.free_placement) so that the wait costs nothing.
- `D v` releases the host copy at issue; the runtime hands its buffer to a later offload only
  after the copies that use it (a wait on the copy stream, not the CPU).
Memory peaks are measured over time: events sorted by (time, action index); every memory event
happens at its action's issue time or its compute's start, so the order is the plan's order,
and a compute/free plan gives exactly the one-stream replay's figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp
from planner.core.resources import Link, Resources
from planner.sim.ledger import MemoryLedger, describe_missing, loss_rule_error
from planner.sim.ledger_replay import born_bytes, flow_by_run
from planner.sim.result import (
    MemoryPoint,
    PlanError,
    SimulationResult,
    StreamSpan,
    TimelinePoint,
)

# event: (time_ms, action index, order within the action, device delta, host delta, primary)
Event = tuple[float, int, int, int, int, bool]


class _Streams:
    """State of the replay; `run` walks the actions once, then `measure` scans the events."""

    def __init__(self, graph: Graph, resources: Resources | None) -> None:
        self.graph = graph
        self.index = graph.index
        self.resources = resources
        # the memory facts and rules of the one-stream replay (fixed, held, views, control)
        ledger = self.ledger = MemoryLedger.of(graph)
        self.fixed = ledger.fixed_bytes
        self.held = ledger.held_bytes
        self.control = ledger.control
        self.root = ledger.storage_root
        self.own = ledger.storage_bytes
        self.events: list[Event] = []
        self.spans: list[StreamSpan] = []
        self.handed: dict[tuple[int, int], tuple[int, ...]] = {}  # set by run / place
        self.prepaid: dict[int, int] = {}  # element node -> bytes taken at its op's run
        self.kept: frozenset[tuple[int, int]] = frozenset()  # (element, free number) kept
        self.frees: dict[int, int] = {}  # node -> frees so far
        self.compute_free = self.d2h_free = self.h2d_free = 0.0
        self.exposed = self.transfer = self.compute_total = 0.0
        self.resident: set[int] = set()
        self.refcount: dict[int, int] = {}
        self.ready_at: dict[int, float] = {}  # device copy usable from
        self.copy_busy: dict[int, float] = {}  # device buffer read/written by a copy until
        self.host_done: dict[int, float] = {}  # node -> host copy complete at (while held)
        self.offloaded_at: dict[int, int] = {}
        self.freed_at: dict[int, int] = {}
        self.dropped_at: dict[int, int] = {}
        self.computed: dict[int, int] = {}

    # -- helpers -----------------------------------------------------------------------------
    def emit(self, t: float, i: int, k: int, dev: int, host: int, primary: bool = False) -> None:
        self.events.append((t, i, k, dev, host, primary))

    def fail(self, i: int, a: Action, why: str) -> PlanError:
        return PlanError(f"action {i} ({a}): {why}", i, a.node)

    def link(self, i: int, a: Action, which: str) -> Link:
        r = self.resources
        link = None if r is None or not r.has_host_tier else getattr(r, which)
        if link is None:
            raise self.fail(
                i, a, "moving memory to the host needs resources with a host tier "
                "(host_memory_bytes and h2d/d2h links)",
            )
        return link

    def where(self, v: int) -> str:
        if v in self.host_done:
            return f"it is on the host only (offloaded at action {self.offloaded_at[v]})"
        if v in self.freed_at and v in self.dropped_at:
            return (f"it was freed at action {self.freed_at[v]} and its host copy dropped at "
                    f"action {self.dropped_at[v]}: prefetch (P{v}) before the drop")
        if v in self.freed_at:
            return f"it was freed at action {self.freed_at[v]}"
        return "it was never computed"

    def take(self, v: int, t: float, i: int, k: int, primary: bool) -> None:
        """v becomes resident at time t (its storage counted once per root)."""
        self.resident.add(v)
        r = self.root[v]
        self.refcount[r] = self.refcount.get(r, 0) + 1
        grow = self.own[r] if self.refcount[r] == 1 else 0
        self.emit(t, i, k, grow, 0, primary)

    # -- actions -----------------------------------------------------------------------------
    def compute(self, i: int, a: Action) -> None:
        v, g = a.node, self.graph
        node = self.index.node(v)
        if v in self.resident:
            raise self.fail(i, a, f"{g.describe(v)} is already resident")
        times = self.computed.get(v, 0)
        if times and not node.recomputable:
            raise self.fail(i, a, f"{g.describe(v)} is not recomputable but is computed again")
        start = self.compute_free
        for u in self.index.predecessors[v]:
            if u not in self.resident:
                raise self.fail(
                    i, a, f"input {g.describe(u)} of {g.describe(v)} is not resident: "
                    f"{self.where(u)}" + (f": prefetch it (P{u}) first" if u in self.host_done
                                          else ""),
                )
            start = max(start, self.ready_at[u])
        if not times:
            for u in self.control.get(v, ()):
                if u not in self.computed:
                    raise loss_rule_error(g, i, a, v, u)
        self.exposed += start - self.compute_free
        end = start + node.compute_ms
        self.take(v, start, i, 0, primary=False)
        ws = self.ledger.workspace_bytes[v]
        # an element taken at its op's computation (planner.sim.ledger_replay.handed_elements)
        extra = ws + (self.held.get(v, 0) if not times else 0) - self.prepaid.pop(v, 0)
        self.emit(start, i, 1, extra, 0, primary=True)  # the timeline's point: while it runs
        handed = self.handed.get((v, times), ())
        born = (born_bytes(self.own, self.held, handed, self.computed, self.prepaid)
                if handed else 0)
        self.emit(end, i, 2, born - ws, 0)  # the workspace goes, handed elements stay
        self.ready_at[v] = end
        self.compute_free = end
        self.compute_total += node.compute_ms
        self.spans.append(StreamSpan("compute", i, start, end))
        self.computed[v] = times + 1

    def free(self, i: int, a: Action) -> None:
        v = a.node
        if v not in self.resident:
            why = self.where(v).replace("it was freed", "it was already freed")
            raise self.fail(i, a, f"cannot free {self.graph.describe(v)}: {why}")
        self.resident.discard(v)
        self.freed_at[v] = i
        r = self.root[v]
        self.refcount[r] -= 1
        shrink = self.own[r] if self.refcount[r] == 0 else 0
        k = self.frees.get(v, 0)
        self.frees[v] = k + 1
        if shrink and (v, k) in self.kept and self.ledger.element_op[v] in self.resident:
            self.prepaid[v], shrink = shrink, 0  # still in its op's tuple, handed over again
        # a copy still using v's storage: the compute stream waits for it, then releases
        t = max(self.compute_free, self.copy_busy.pop(v, 0.0))
        self.exposed += t - self.compute_free
        self.compute_free = t
        self.emit(t, i, 0, -shrink, 0, primary=True)

    def offload(self, i: int, a: Action) -> None:
        v, g = a.node, self.graph
        link = self.link(i, a, "d2h")
        base = self.index.node(v).alias_of
        if base is not None:
            raise self.fail(i, a, f"{g.describe(v)} is a view of {g.describe(base)}: offload that")
        if not self.index.node(v).offloadable:
            raise self.fail(i, a, f"{g.describe(v)} is marked offloadable: false: keep or "
                            "recompute it")
        if v in self.host_done:
            raise self.fail(
                i, a, f"{g.describe(v)} already has a host copy (offloaded at action "
                f"{self.offloaded_at[v]})",
            )
        if v not in self.resident:
            raise self.fail(i, a, f"cannot offload {g.describe(v)}: {self.where(v)}")
        nbytes = self.index.storage_bytes[v]
        start = max(self.compute_free, self.ready_at[v], self.d2h_free)
        end = start + link.transfer_ms(nbytes)
        self.transfer += end - start
        self.d2h_free = end
        self.spans.append(StreamSpan("d2h", i, start, end))
        self.copy_busy[v] = max(self.copy_busy.get(v, 0.0), end)
        self.host_done[v] = end
        self.offloaded_at[v] = i
        self.dropped_at.pop(v, None)
        self.emit(self.compute_free, i, 0, 0, nbytes, primary=True)  # host buffer taken at issue

    def prefetch(self, i: int, a: Action) -> None:
        v, g = a.node, self.graph
        link = self.link(i, a, "h2d")
        if v not in self.host_done:
            why = (
                f"its host copy was dropped at action {self.dropped_at[v]}"
                if v in self.dropped_at
                else f"it has no host copy: offload it (O{v}) first"
            )
            raise self.fail(i, a, f"cannot prefetch {g.describe(v)}: {why}")
        if v in self.resident:
            raise self.fail(i, a, f"{g.describe(v)} is already on the device")
        start = max(self.compute_free, self.host_done[v], self.h2d_free)
        end = start + link.transfer_ms(self.index.storage_bytes[v])
        self.transfer += end - start
        self.h2d_free = end
        self.spans.append(StreamSpan("h2d", i, start, end))
        self.take(v, self.compute_free, i, 0, primary=True)  # device buffer allocated at issue
        self.ready_at[v] = end
        self.copy_busy[v] = max(self.copy_busy.get(v, 0.0), end)

    def drop(self, i: int, a: Action) -> None:
        v = a.node
        if v not in self.host_done:
            why = (
                f"it was already dropped at action {self.dropped_at[v]}"
                if v in self.dropped_at
                else "it was never offloaded"
            )
            raise self.fail(i, a, f"cannot drop the host copy of {self.graph.describe(v)}: {why}")
        self.host_done.pop(v)
        self.dropped_at[v] = i
        self.emit(self.compute_free, i, 0, 0, -self.index.storage_bytes[v], primary=True)

    # -- the whole plan ----------------------------------------------------------------------
    def run(self, actions: Sequence[Action]) -> SimulationResult:
        handlers = {
            ActionOp.compute: self.compute,
            ActionOp.free: self.free,
            ActionOp.offload: self.offload,
            ActionOp.prefetch: self.prefetch,
            ActionOp.drop: self.drop,
        }
        self.handed, self.kept = flow_by_run(self.ledger, actions)
        for i, a in enumerate(actions):
            if a.node not in self.index.position:
                raise self.fail(i, a, f"node {a.node} is not in the graph")
            handlers[a.op](i, a)
        if len(self.computed) < len(self.index.position):
            missing = [v for v in self.index.topological_order if v not in self.computed]
            raise PlanError(describe_missing(self.graph, missing), len(actions), missing[0])
        return self.measure(actions)

    def measure(self, actions: Sequence[Action]) -> SimulationResult:
        capacity = self.resources.host_memory_bytes if self.resources is not None else None
        device, host = self.fixed, 0
        peak, peak_index, host_peak = self.fixed, -1, 0
        live_after: dict[int, int] = {}
        trace: list[MemoryPoint] = []
        # (time, action, order within it) is unique: plain tuple order sorts by it
        for t, i, _, dev, hst, primary in sorted(self.events):
            device += dev
            host += hst
            if device > peak:
                peak, peak_index = device, i
            if host > host_peak:
                host_peak = host
                if capacity is not None and host > capacity:
                    a = actions[i]
                    raise self.fail(
                        i, a, f"host memory overflows: {host} bytes of host copies > "
                        f"host_memory_bytes {capacity}",
                    )
            if primary:
                live_after[i] = device
            trace.append(MemoryPoint(t, i, device, host))
        timeline = tuple(TimelinePoint(i, str(a), live_after[i]) for i, a in enumerate(actions))
        makespan = max(self.compute_free, self.d2h_free, self.h2d_free)
        return SimulationResult(
            peak_bytes=peak,
            peak_action_index=peak_index,
            fixed_bytes=self.fixed,
            compute_cost=math.fsum(self.index.node(a.node).compute_ms for a in actions
                                   if a.op is ActionOp.compute),
            baseline_cost=self.graph.total_compute_ms,
            computations=sum(self.computed.values()),
            node_count=len(self.graph.nodes),
            timeline=timeline,
            event_simulated=True,
            host_peak_bytes=host_peak,
            compute_ms=self.compute_total,
            transfer_ms=self.transfer,
            exposed_transfer_ms=self.exposed,
            makespan_ms=makespan,
            memory_trace=tuple(trace),
            stream_spans=tuple(self.spans),
        )


def simulate_streams(
    graph: Graph, actions: Sequence[Action], resources: Resources | None
) -> SimulationResult:
    """Event-simulate a one-device plan (any of C F O P D) on `resources`."""
    return _Streams(graph, resources).run(actions)
