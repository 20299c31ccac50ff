"""Progress of a running solve: the best objective and bound so far, as the engine reports them.

Methods call `SolveRequest.progress(objective, bound)` whenever their incumbent or bound
improves, from any thread (auto's racing MILP), with either value None when unknown. The engine
hands the caller only changes: the objective never rises, the bound never falls, is at least
the bound every plan obeys (every node computed once) and is never shown above the objective.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable

from planner.core.errors import InputError

ProgressFn = Callable[[float | None, float | None], None]
EVERY_ENV = "PLANNER_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 5.0  # a progress line at least this often while a solve runs


def progress_every_s() -> float:
    """Seconds between plain progress lines while a solve runs (PLANNER_PROGRESS_EVERY_S): the
    CLI's lines away from a terminal and the runtime agent's log lines."""
    text = os.environ.get(EVERY_ENV)
    if text is None:
        return DEFAULT_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{EVERY_ENV}={text!r}: give seconds between progress lines, > 0")
    return value


def monotone_progress(progress: ProgressFn | None, floor_bound: float) -> ProgressFn | None:
    """`progress` filtered to improvements; None stays None. A callback that raises is not
    called again: a broken display must not end a solve."""
    if progress is None:
        return None
    lock = threading.Lock()
    state: dict[str, float | None] = {"objective": None, "bound": None}
    alive = [True]

    def report(objective: float | None, bound: float | None) -> None:
        with lock:
            if not alive[0]:
                return
            improved = False
            best = state["objective"]
            if objective is not None and math.isfinite(objective) and (
                    best is None or objective < best):
                state["objective"] = best = objective
                improved = True
            candidate = floor_bound if bound is None or not math.isfinite(bound) else max(
                bound, floor_bound)
            low = state["bound"]
            if low is None or candidate > low:
                state["bound"] = low = candidate
                improved = True
            if not improved:
                return
            try:
                progress(best, low if best is None else min(low, best))
            except Exception:
                alive[0] = False

    return report


def progress_text(objective: float | None, bound: float | None, total_compute_ms: float) -> str:
    """One line for a display: 'best +0.136 % · bound +0.000 % · gap 0.136 %' (increases over
    every node computed once; '-' where unknown)."""

    def increase(value: float | None) -> str:
        if value is None or total_compute_ms <= 0:
            return "-"
        return f"{100 * (value / total_compute_ms - 1):+.3f} %"

    gap = "-"
    if objective is not None and bound is not None and objective > 0:
        gap = f"{100 * max(0.0, objective - bound) / objective:.3f} %"
    return f"best {increase(objective)} · bound {increase(bound)} · gap {gap}"
