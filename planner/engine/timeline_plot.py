"""The memory timeline of a simulated plan as a PNG (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from planner.simulator import SimulationResult


def plot_timeline(
    sim: SimulationResult, path: str | Path, *, title: str = "", budget_bytes: int | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = 2**30
    xs = [p.action_index for p in sim.timeline]
    ys = [p.live_bytes / gib for p in sim.timeline]
    fig, ax = plt.subplots(figsize=(10, 4))
    try:
        ax.step(xs, ys, where="post", label="live memory")
        ax.axhline(sim.peak_bytes / gib, color="tab:orange", ls=":", label="peak")
        if budget_bytes is not None:
            ax.axhline(budget_bytes / gib, color="tab:red", ls="--", label="budget")
        if sim.fixed_bytes:
            ax.axhline(sim.fixed_bytes / gib, color="gray", ls="-.", label="fixed")
        ax.set_xlabel("action")
        ax.set_ylabel("GiB")
        ax.set_title(title)
        ax.legend(loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
