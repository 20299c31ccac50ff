"""Stopping CP-SAT searches from another thread, when a racing solver has already proved
optimality (auto's portfolio), and reporting their progress as they improve."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# (best objective, best bound), either None when unknown: `SolveRequest.progress`.
Progress = Callable[[float | None, float | None], None]


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


def solve_unless_stopped(
    solver: Any,
    model: Any,
    stop: SearchStop | None,
    progress: Progress | None = None,
    objective: Callable[[Any], float] | None = None,
    bound_scale: float = 1.0,
) -> Any | None:
    """`solver.solve(model)` (CP-SAT), registered with `stop` so that another thread can end it;
    None, without searching, when `stop` has already been stopped.

    With `progress`, each new solution reports `objective(callback)` (the true cost, read from
    the callback's values; CP-SAT's own objective is in scaled units) and each improved bound
    reports CP-SAT's bound divided by `bound_scale`."""
    callback = None
    if progress is not None:
        solver.best_bound_callback = lambda b: progress(None, b / bound_scale)
        callback = _incumbents(progress, objective, bound_scale)
    if stop is None:
        return solver.solve(model, callback)
    if not stop.register(solver):
        return None
    try:
        return solver.solve(model, callback)
    finally:
        stop.unregister(solver)


def _incumbents(progress: Progress, objective: Callable[[Any], float] | None,
                bound_scale: float) -> Any:
    from ortools.sat.python import cp_model

    class Incumbents(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            value = (objective(self) if objective is not None
                     else self.objective_value / bound_scale)
            progress(value, self.best_objective_bound / bound_scale)

    return Incumbents()
