"""What a plan moves between device and host: the figures the CLI prints and the service returns
for plans with host copies (bytes each way, copy time hidden behind compute vs exposed, host
peak, makespan), read from the plan's actions and the simulator's prediction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp, Plan, Predicted
from planner.sim.ledger import MemoryLedger
from planner.sim.result import SimulationResult


@dataclass(frozen=True)
class TransferFigures:
    d2h_bytes: int  # offloads: device-to-host bytes
    h2d_bytes: int  # prefetches: host-to-device bytes
    offloads: int
    prefetches: int
    transfer_ms: float  # both copy streams busy, in total
    transfer_hidden_ms: float  # copy time overlapped with compute
    transfer_exposed_ms: float  # time the compute stream waited for copies
    host_peak_bytes: int
    host_memory_bytes: int | None  # the host budget planned for
    makespan_ms: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"d2h {self.d2h_bytes} B in {self.offloads} copies, h2d {self.h2d_bytes} B in "
            f"{self.prefetches}; transfers {self.transfer_ms:.3f} ms, hidden "
            f"{self.transfer_hidden_ms:.3f} ms, exposed {self.transfer_exposed_ms:.3f} ms; "
            f"host peak {self.host_peak_bytes} B; makespan {self.makespan_ms:.3f} ms"
        )


def moved_bytes(graph: Graph, actions: Sequence[Action]) -> tuple[int, int, int, int]:
    """(d2h bytes, h2d bytes, offloads, prefetches) of a one-device plan: a copy moves the
    node's own storage (the ledger's storage bytes, as the simulator's copy streams)."""
    storage = MemoryLedger.of(graph).storage_bytes
    d2h = h2d = offloads = prefetches = 0
    for a in actions:
        if a.op is ActionOp.offload:
            d2h += storage[a.node]
            offloads += 1
        elif a.op is ActionOp.prefetch:
            h2d += storage[a.node]
            prefetches += 1
    return d2h, h2d, offloads, prefetches


def transfer_figures(plan: Plan, graph: Graph) -> TransferFigures | None:
    """The plan's transfer figures; None for plans without host copies or a prediction."""
    if plan.predicted is None or plan.rank_actions:
        return None
    host = plan.resources.host_memory_bytes if plan.resources else None
    return _figures(plan.predicted, graph, plan.actions, host)


def simulated_transfer_figures(
    sim: SimulationResult, graph: Graph, actions: Sequence[Action],
    host_memory_bytes: int | None = None,
) -> TransferFigures | None:
    """The same figures from a simulation (e.g. `planner-cli simulate` on other resources)."""
    if not sim.event_simulated or sim.ranks:
        return None
    return _figures(sim.predicted(), graph, actions, host_memory_bytes)


def _figures(
    p: Predicted, graph: Graph, actions: Sequence[Action], host_memory_bytes: int | None
) -> TransferFigures | None:
    if p.transfer_ms is None or p.makespan_ms is None:
        return None
    d2h, h2d, offloads, prefetches = moved_bytes(graph, actions)
    if not offloads and not prefetches:
        return None
    exposed = p.exposed_transfer_ms or 0.0
    return TransferFigures(
        d2h_bytes=d2h,
        h2d_bytes=h2d,
        offloads=offloads,
        prefetches=prefetches,
        transfer_ms=p.transfer_ms,
        transfer_hidden_ms=max(0.0, p.transfer_ms - exposed),
        transfer_exposed_ms=exposed,
        host_peak_bytes=p.host_peak_bytes or 0,
        host_memory_bytes=host_memory_bytes,
        makespan_ms=p.makespan_ms,
    )


def transfer_summary(plan: Plan, graph: Graph) -> dict[str, object]:
    """The figures as summary fields (empty for plans without host copies): meant to be merged
    into `planner.engine.reports.plan_summary`, so the CLI's --json and the service's job
    report carry them."""
    figures = transfer_figures(plan, graph)
    return {} if figures is None else figures.as_dict()
