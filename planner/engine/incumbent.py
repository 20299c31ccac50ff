"""A running method's best plan so far, kept by the engine: the anytime answer.

A method hands every better in-budget plan it finds to `SolveRequest.incumbent` (auto does, from
its `AutoSearch`); the engine keeps the latest in an `IncumbentBox`. When the method overruns
its limit and is abandoned, the answer is that plan, judged by the simulator like any other,
instead of the fast baselines' fallback (which a loaded machine made +38 % where auto's own
incumbent was +4.6 %). The box is closed at that moment, so an abandoned thread that still
offers plans changes nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.core.resources import Resources
from planner.sim.simulator import SimulationAbandoned, SimulationResult, simulate

__all__ = ["Incumbent", "IncumbentBox", "JudgedIncumbent", "judged_incumbent"]


@dataclass(frozen=True)
class Incumbent:
    """One plan a method offered: its actions, where it came from, a bound that covers it."""

    actions: tuple[Action, ...]
    source: str  # the method's own label, e.g. "greedy@kick3+kept"
    lower_bound_ms: float | None  # a lower bound on the cost of any plan in its space; None
    found_after_s: float  # seconds from the box's creation (the solve's start)


class IncumbentBox:
    """Thread-safe holder of the latest plan a method offered; `close()` freezes it."""

    def __init__(self, started: float) -> None:
        self._started = started  # time.perf_counter() at the solve's start
        self._lock = threading.Lock()
        self._latest: Incumbent | None = None
        self._open = True

    def offer(self, actions: list[Action], source: str, lower_bound_ms: float | None) -> None:
        """The method's callback (`SolveRequest.incumbent`): a better plan than the last. The
        actions are copied: the method may go on editing its lists."""
        kept = Incumbent(tuple(actions), source, lower_bound_ms,
                         time.perf_counter() - self._started)
        with self._lock:
            if self._open:
                self._latest = kept

    def close(self) -> Incumbent | None:
        """Stop taking offers; the latest plan offered, if any."""
        with self._lock:
            self._open = False
            return self._latest


@dataclass(frozen=True)
class JudgedIncumbent:
    """An incumbent replayed by the simulator: whether it fits and what it costs."""

    incumbent: Incumbent
    simulation: SimulationResult
    fits: bool


def judged_incumbent(graph: Graph, budget_bytes: int, incumbent: Incumbent | None,
                     resources: Resources | None, deadline: float) -> JudgedIncumbent | None:
    """The incumbent replayed on the machine by `deadline`; None when there is none, it is
    invalid, or its replay cannot finish in time."""
    if incumbent is None:
        return None
    try:
        sim = simulate(graph, list(incumbent.actions), resources, deadline=deadline)
    except SimulationAbandoned:
        return None
    except Exception:  # an invalid plan from a method: the fallback answers instead
        return None
    return JudgedIncumbent(incumbent, sim, sim.peak_bytes <= budget_bytes)
