"""The three streams of an event-simulated plan as a timeline (Gantt): compute, device-to-host,
host-to-device, from the spans the simulator records. A result without spans falls back on the
memory trace (every action's first event is its start) with durations from the graph
(compute_ms) and the links (`Link.transfer_ms` of the node's storage bytes); without the graph
and resources copies are then drawn as ticks at their start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.core.graph import Graph
from planner.core.resources import Resources
from planner.sim.ledger import MemoryLedger
from planner.sim.simulator import SimulationResult

STREAMS = ("compute", "d2h", "h2d")
_STREAM_OF = {"C": "compute", "O": "d2h", "P": "h2d"}
_COLOURS = {"compute": "tab:blue", "d2h": "tab:orange", "h2d": "tab:green"}


@dataclass(frozen=True)
class Interval:
    stream: str  # compute, d2h or h2d
    action_index: int
    action: str  # text form, e.g. "O12"
    start_ms: float
    end_ms: float | None  # None: unknown (a copy without the graph and resources)


def stream_intervals(
    sim: SimulationResult, graph: Graph | None = None, resources: Resources | None = None
) -> list[Interval]:
    """One interval per compute / offload / prefetch action, in plan order: the simulator's
    own spans when it recorded them."""
    if sim.stream_spans:
        return [Interval(s.stream, s.action_index, sim.timeline[s.action_index].action,
                         s.start_ms, s.end_ms) for s in sim.stream_spans]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for p in sim.memory_trace:
        first[p.action_index] = min(first.get(p.action_index, p.time_ms), p.time_ms)
        last[p.action_index] = max(last.get(p.action_index, p.time_ms), p.time_ms)
    ledger = MemoryLedger.of(graph) if graph is not None else None  # compute_ms, copy bytes
    out: list[Interval] = []
    for t in sim.timeline:
        stream = _STREAM_OF.get(t.action[:1])
        if stream is None or t.action_index not in first:
            continue
        start = first[t.action_index]
        node = int(t.action[1:])
        end: float | None
        if stream == "compute":
            end = start + ledger.compute_ms[node] if ledger is not None else (
                last[t.action_index])
        elif ledger is not None and resources is not None:
            link = resources.d2h if stream == "d2h" else resources.h2d
            nbytes = ledger.storage_bytes[node]
            end = start + link.transfer_ms(nbytes) if link is not None else None
        else:
            end = None
        out.append(Interval(stream, t.action_index, t.action, start, end))
    return out


def draw_gantt(ax: Any, intervals: list[Interval], makespan_ms: float) -> None:
    """Draw the streams on a matplotlib axis: one row per stream, one bar per action."""
    tick = max(makespan_ms, 1e-9) / 400
    for row, stream in enumerate(STREAMS):
        bars = [(i.start_ms, (i.end_ms - i.start_ms) if i.end_ms is not None else tick)
                for i in intervals if i.stream == stream]
        if bars:
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=_COLOURS[stream],
                           edgecolors="white", linewidth=0.3)
        mine = [i for i in intervals if i.stream == stream]
        busy = sum(i.end_ms - i.start_ms for i in mine if i.end_ms is not None)
        label = (f" {len(mine)}, {busy:.3g} ms busy" if all(i.end_ms is not None for i in mine)
                 else f" {len(mine)} copies (lengths need the graph and resources)")
        if bars:
            ax.text(makespan_ms, row, label, va="center", fontsize=7)
    ax.set_yticks(range(len(STREAMS)), list(STREAMS))
    ax.set_ylim(-0.6, len(STREAMS) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, max(makespan_ms, 1e-9) * 1.12)
    ax.set_xlabel("time (ms)")
