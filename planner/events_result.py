"""What the simulator returns, and the error it raises (shared by planner.simulator, planner.events
and planner.events_pipeline)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.plan import Predicted


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


@dataclass(frozen=True)
class MemoryPoint:
    """Memory right after an event of the event simulation (time order)."""

    time_ms: float
    action_index: int  # the action the event belongs to
    device_bytes: int
    host_bytes: int


@dataclass(frozen=True)
class RankResult:
    """One rank of a pipeline plan."""

    rank: int
    peak_bytes: int  # model state + in-flight saved activations + transient
    model_state_bytes: int
    busy_ms: float  # F/B/I/W compute
    end_ms: float  # when its last action ends


@dataclass(frozen=True)
class SimulationResult:
    peak_bytes: int  # fixed memory included; for pipelines the largest rank's
    peak_action_index: int
    fixed_bytes: int
    compute_cost: float
    baseline_cost: float  # every node once (pipelines: once per micro-batch)
    computations: int
    node_count: int
    timeline: tuple[TimelinePoint, ...]
    # -- event simulation (plans with host copies or pipelines); defaults describe one stream --
    event_simulated: bool = False
    host_peak_bytes: int = 0
    compute_ms: float = 0.0
    transfer_ms: float = 0.0
    exposed_transfer_ms: float = 0.0
    makespan_ms: float = 0.0
    memory_trace: tuple[MemoryPoint, ...] = ()
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
            host_peak_bytes=None if self.ranks else self.host_peak_bytes,
            compute_ms=self.compute_ms,
            transfer_ms=self.transfer_ms,
            exposed_transfer_ms=None if self.ranks else self.exposed_transfer_ms,
            makespan_ms=self.makespan_ms,
            throughput_per_s=self.throughput_per_s,
            bubble_fraction=self.bubble_fraction,
        )
