"""The memory timeline of a simulated plan as a PNG (matplotlib, headless).

One-stream plans (compute/free): live device memory per action. Event-simulated plans (host
copies): device and host memory over time, and the compute, device-to-host and host-to-device
streams as a Gantt timeline below them (planner.engine.gantt_plot), on one time axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core.graph import Graph
from planner.core.resources import Resources
from planner.engine.figures import save_figure
from planner.sim.simulator import SimulationResult

GiB = 2**30


def byte_unit(peak_bytes: int) -> tuple[float, str]:
    """GiB, or MiB / KiB for small plans, so that the axis reads in sensible numbers."""
    for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak_bytes >= size:
            return float(size), name
    return 1.0, "B"


def plot_timeline(
    sim: SimulationResult,
    path: str | Path,
    *,
    title: str = "",
    budget_bytes: int | None = None,
    graph: Graph | None = None,
    resources: Resources | None = None,
) -> None:
    """Write the plot; `graph` and `resources` (the plan's machine) give copies their length in
    the Gantt timeline of an event-simulated plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if sim.event_simulated and sim.memory_trace and not sim.ranks:
        _plot_streams(plt, sim, path, title, budget_bytes, graph, resources)
        return
    unit, name = byte_unit(max(sim.peak_bytes, budget_bytes or 0))
    xs = [p.action_index for p in sim.timeline]
    ys = [p.live_bytes / unit for p in sim.timeline]
    fig, ax = plt.subplots(figsize=(10, 4))
    try:
        ax.step(xs, ys, where="post", label="live memory")
        _levels(ax, unit, sim.peak_bytes, budget_bytes, sim.fixed_bytes)
        ax.set_xlabel("action")
        ax.set_ylabel(name)
        ax.set_title(title)
        ax.legend(loc="upper right")
        fig.tight_layout()
        save_figure(fig, path, 110)
    finally:
        plt.close(fig)


def _levels(ax: Any, unit: float, peak: int, budget: int | None, fixed: int) -> None:
    ax.axhline(peak / unit, color="tab:orange", ls=":", label="peak")
    if budget is not None:
        ax.axhline(budget / unit, color="tab:red", ls="--", label="budget")
    if fixed:
        ax.axhline(fixed / unit, color="gray", ls="-.", label="fixed")


def _plot_streams(
    plt: Any, sim: SimulationResult, path: str | Path, title: str, budget_bytes: int | None,
    graph: Graph | None, resources: Resources | None,
) -> None:
    from planner.engine.gantt_plot import draw_gantt, stream_intervals

    trace = sim.memory_trace
    times = [0.0] + [p.time_ms for p in trace] + [sim.makespan_ms]
    device = [sim.fixed_bytes] + [p.device_bytes for p in trace] + [trace[-1].device_bytes]
    host = [0] + [p.host_bytes for p in trace] + [trace[-1].host_bytes]
    unit, name = byte_unit(max(sim.peak_bytes, budget_bytes or 0))
    capacity = resources.host_memory_bytes if resources is not None else None
    host_unit, host_name = byte_unit(sim.host_peak_bytes)
    fig, (ax_dev, ax_host, ax_gantt) = plt.subplots(
        3, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]}
    )
    try:
        ax_dev.step(times, [b / unit for b in device], where="post", label="device memory")
        _levels(ax_dev, unit, sim.peak_bytes, budget_bytes, sim.fixed_bytes)
        ax_dev.set_ylabel(f"device {name}")
        ax_dev.set_title(title)
        ax_dev.legend(loc="upper right", fontsize=8)
        ax_host.step(times, [b / host_unit for b in host], where="post", color="tab:purple",
                     label="host memory (copies)")
        if capacity and capacity <= 1.3 * sim.host_peak_bytes:  # in view: show the budget
            ax_host.axhline(capacity / host_unit, color="tab:red", ls="--", label="host budget")
        ax_host.set_ylabel(f"host {host_name}")
        ax_host.legend(loc="upper right", fontsize=8)
        draw_gantt(ax_gantt, stream_intervals(sim, graph, resources), sim.makespan_ms)
        ax_gantt.set_title(
            f"makespan {sim.makespan_ms:.3f} ms, transfers {sim.transfer_ms:.3f} ms, "
            f"exposed {sim.exposed_transfer_ms:.3f} ms", fontsize=9)
        fig.tight_layout()
        save_figure(fig, path, 110)
    finally:
        plt.close(fig)
