"""Stopping CP-SAT searches from another thread, when a racing solver has already proved
optimality (auto's portfolio)."""

from __future__ import annotations

import threading
from typing import Any


class SearchStop:
    """Solvers register before they search; `stop()` ends every registered search and makes
    later registrations refuse to start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._solvers: list[Any] = []
        self.stopped = False

    def register(self, solver: Any) -> bool:
        """False when already stopped: the caller should not search."""
        with self._lock:
            if self.stopped:
                return False
            self._solvers.append(solver)
            return True

    def unregister(self, solver: Any) -> None:
        with self._lock:
            if solver in self._solvers:
                self._solvers.remove(solver)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            for solver in self._solvers:
                solver.stop_search()  # CP-SAT: returns what it has found so far


def solve_unless_stopped(solver: Any, model: Any, stop: SearchStop | None) -> Any | None:
    """`solver.solve(model)` (CP-SAT), registered with `stop` so that another thread can end it;
    None, without searching, when `stop` has already been stopped."""
    if stop is None:
        return solver.solve(model)
    if not stop.register(solver):
        return None
    try:
        return solver.solve(model)
    finally:
        stop.unregister(solver)
