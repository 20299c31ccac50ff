"""Large-neighbourhood search on checkpoint plans: destroy a window, repair, keep if better.

A window is a contiguous range of positions in the plan's order. Destroying it re-admits every
checkpoint dropped there (the rest of the plan stays as it is: outside the window nothing is
touched unless the repair needs it); the repair drops checkpoints where the plan now peaks
over budget (`greedy.reduce_peak`) and adds back what fits (`greedy.improve`). A window is kept
only when the repaired plan fits and is cheaper; otherwise every toggle is undone in reverse
order, which restores the per-stage costs and peaks exactly. Window sizes grow while windows
keep failing, and shrink after a success.
"""

from __future__ import annotations

import random
import time

from planner.solvers.remat.checkpoints import CheckpointPlan, Trial
from planner.solvers.remat.greedy import improve, reduce_peak


class _Journal:
    """Records the toggles committed on a plan so that they can be undone."""

    def __init__(self, plan: CheckpointPlan) -> None:
        self.plan = plan
        self.toggled: list[int] = []
        self._commit = plan.commit

        def commit(trial: Trial) -> None:
            self.toggled.append(trial.node)
            self._commit(trial)

        plan.commit = commit  # type: ignore[method-assign]

    def undo(self) -> None:
        for v in reversed(self.toggled):
            self._commit(self.plan.try_toggle(v))
        self.toggled.clear()

    def close(self) -> None:
        self.plan.commit = self._commit  # type: ignore[method-assign]


def improve_windows(plan: CheckpointPlan, deadline: float, *, seed: int = 0,
                    on_better: object = None) -> int:
    """Improve a plan that fits its budget until `deadline`; returns how many windows helped.
    `on_better(plan)` (when callable) hears of each improvement."""
    n = plan.n
    if n < 4 or plan.peak_bytes > plan.problem.budget_bytes:
        return 0
    rng = random.Random(seed)
    width = max(8, n // 50)
    wins = 0
    journal = _Journal(plan)
    try:
        while time.perf_counter() < deadline:
            dropped = [v for v in range(n) if not plan.keep[v] and plan.last_use[v] >= v + 2]
            if not dropped:
                return wins
            centre = rng.choice(dropped)
            lo, hi = max(0, centre - width // 2), min(n, centre + width // 2 + 1)
            before = plan.total_cost
            for v in range(lo, hi):
                if not plan.keep[v] and plan.last_use[v] >= v + 2:
                    plan.commit(plan.try_toggle(v))
            window_deadline = min(deadline, time.perf_counter() + 0.5)
            fits = reduce_peak(plan, window_deadline)
            if fits:
                improve(plan, window_deadline)
            if (fits and plan.peak_bytes <= plan.problem.budget_bytes
                    and plan.total_cost < before - 1e-9 * max(1.0, before)):
                wins += 1
                journal.toggled.clear()
                width = max(8, width // 2)
                if callable(on_better):
                    on_better(plan)
            else:
                journal.undo()
                width = min(n, int(width * 1.5) + 1)
    finally:
        journal.close()
    return wins
