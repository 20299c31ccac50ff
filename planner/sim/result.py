"""What the simulator returns, and the error it raises (shared by planner.sim.simulator,
planner.sim.copy_streams
and planner.sim.pipeline_ranks)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from planner.core.plan import Action, Predicted


class PlanError(ValueError):
    """A plan that cannot run on the graph; names the action index (step), the rank of a pipeline
    plan, and the node."""

    def __init__(
        self,
        message: str,
        action_index: int | None = None,
        node: int | None = None,
        rank: int | None = None,
    ):
        super().__init__(message)
        self.action_index = action_index
        self.node = node
        self.rank = rank


class SimulationAbandoned(Exception):
    """A replay ran past its deadline (`simulate(..., deadline=)`): no verdict on the plan."""


@dataclass(frozen=True)
class TimelinePoint:
    action_index: int
    action: str  # text form, e.g. "C12"
    live_bytes: int  # during a compute (inputs, output, workspace); after a free


class ReplayTimeline(Sequence[TimelinePoint]):
    """The one-stream replay's timeline, its points made when read: building one object per
    action took half of a replay (2.7 s of a 1.5-million-action recompute-all plan's)."""

    __slots__ = ("_actions", "live_bytes")

    def __init__(self, actions: Sequence[Action], live_bytes: list[int]) -> None:
        self._actions = tuple(actions)  # a copy: the caller's list may change later
        self.live_bytes = live_bytes  # after each action (during it, for a compute)

    def __len__(self) -> int:
        return len(self.live_bytes)

    @overload
    def __getitem__(self, i: int) -> TimelinePoint: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[TimelinePoint, ...]: ...
    def __getitem__(self, i: int | slice) -> TimelinePoint | tuple[TimelinePoint, ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        k = range(len(self))[i]  # negative indices; IndexError past the end
        return TimelinePoint(k, str(self._actions[k]), self.live_bytes[k])

    def __iter__(self) -> Iterator[TimelinePoint]:
        for k, (a, live) in enumerate(zip(self._actions, self.live_bytes, strict=False)):
            yield TimelinePoint(k, str(a), live)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:  # as the tuple of its points, which it equals
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"ReplayTimeline({len(self)} points)"


@dataclass(frozen=True)
class MemoryPoint:
    """Memory right after an event of the event simulation (time order)."""

    time_ms: float
    action_index: int  # the action the event belongs to
    device_bytes: int
    host_bytes: int


@dataclass(frozen=True)
class StreamSpan:
    """When one action kept its stream busy in the event simulation."""

    stream: str  # compute, d2h or h2d
    action_index: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class RankResult:
    """One rank of a pipeline plan."""

    rank: int
    peak_bytes: int  # model state + in-flight saved activations + transient
    model_state_bytes: int
    busy_ms: float  # F/B/I/W compute
    end_ms: float  # when its last action ends
    host_peak_bytes: int = 0  # its offloaded modules' saved activations in host memory, at most


@dataclass(frozen=True)
class SimulationResult:
    peak_bytes: int  # fixed memory included; for pipelines the largest rank's
    peak_action_index: int
    fixed_bytes: int
    compute_cost: float
    baseline_cost: float  # every node once (pipelines: once per micro-batch)
    computations: int
    node_count: int
    timeline: Sequence[TimelinePoint]  # a tuple, or a ReplayTimeline (one-stream replays)
    # -- event simulation (plans with host copies or pipelines); defaults describe one stream --
    event_simulated: bool = False
    host_peak_bytes: int = 0
    compute_ms: float = 0.0
    transfer_ms: float = 0.0
    exposed_transfer_ms: float = 0.0
    makespan_ms: float = 0.0
    memory_trace: tuple[MemoryPoint, ...] = ()
    stream_spans: tuple[StreamSpan, ...] = ()  # one per C, O, P of an event-simulated plan
    ranks: tuple[RankResult, ...] = ()
    microbatches: int = 1
    throughput_per_s: float | None = None
    bubble_fraction: float | None = None

    @property
    def overhead(self) -> float:
        """Extra compute over running every node once, as a fraction."""
        if self.baseline_cost <= 0:
            return 0.0
        return (self.compute_cost - self.baseline_cost) / self.baseline_cost

    @property
    def live_bytes(self) -> Sequence[int]:
        """The timeline's live bytes alone, one per point, without making the points."""
        t = self.timeline
        return t.live_bytes if isinstance(t, ReplayTimeline) else [p.live_bytes for p in t]

    @property
    def recomputations(self) -> int:
        """Computations beyond the first of each node."""
        return self.computations - self.node_count * self.microbatches

    @property
    def per_rank_peak_bytes(self) -> list[int]:
        return [r.peak_bytes for r in self.ranks] if self.ranks else [self.peak_bytes]

    def predicted(self) -> Predicted:
        """The plan's `predicted`: version-1 figures, plus the event figures when simulated."""
        if not self.event_simulated:
            return Predicted(
                peak_bytes=self.peak_bytes, compute_cost=self.compute_cost, overhead=self.overhead
            )
        return Predicted(
            peak_bytes=self.peak_bytes,
            compute_cost=self.compute_cost,
            overhead=self.overhead,
            per_rank_peak_bytes=[r.peak_bytes for r in self.ranks] if self.ranks else None,
            host_peak_bytes=self.host_peak_bytes if not self.ranks or self.host_peak_bytes
            else None,
            per_rank_host_peak_bytes=[r.host_peak_bytes for r in self.ranks]
            if self.ranks and self.host_peak_bytes else None,
            compute_ms=self.compute_ms,
            transfer_ms=self.transfer_ms,
            exposed_transfer_ms=None if self.ranks else self.exposed_transfer_ms,
            makespan_ms=self.makespan_ms,
            throughput_per_s=self.throughput_per_s,
            bubble_fraction=self.bubble_fraction,
        )
