"""Stopping CP-SAT searches from another thread, when a racing solver has already proved
optimality (auto's portfolio), and reporting their progress as they improve."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# (best objective, best bound), either None when unknown: `SolveRequest.progress`.
Progress = Callable[[float | None, float | None], None]
# (actions, source label, a lower bound covering the plan or None): each better plan as found.
PlanListener = Callable[[list[Any], str, float | None], None]


class SearchStop:
    """Solvers register before they search; `stop()` ends every registered search and makes
    later registrations refuse to start."""

    def __init__(self, parent: SearchStop | None = None) -> None:
        """With a `parent`, this stop also stops when the parent does (not the other way)."""
        self._lock = threading.Lock()
        self._solvers: list[Any] = []
        self._children: list[SearchStop] = []
        self.stopped = False
        if parent is not None:
            parent._adopt(self)

    def _adopt(self, child: SearchStop) -> None:
        with self._lock:
            stopped = self.stopped
            if not stopped:
                self._children.append(child)
        if stopped:
            child.stop()

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
            children, self._children = self._children, []
        for child in children:
            child.stop()


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


class StallWatch:
    """A `Progress` listener that stops `stop` once no better objective has been reported for
    `stall_s` seconds (after the first report, or after the watch starts). Used around a search
    whose job is to find plans, not to prove: once it stalls, its time is better spent by the
    search that proves. Reports pass on to `progress`."""

    def __init__(self, stop: SearchStop, stall_s: float, progress: Progress | None = None
                 ) -> None:
        self._stop, self._stall_s, self._progress = stop, stall_s, progress
        self._best = float("inf")
        self._last = time.perf_counter()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def __call__(self, objective: float | None, bound: float | None) -> None:
        if objective is not None and objective < self._best:
            self._best, self._last = objective, time.perf_counter()
        if self._progress is not None:
            self._progress(objective, bound)

    def _watch(self) -> None:
        while not self._done.wait(min(0.25, self._stall_s / 4)):
            if time.perf_counter() - self._last > self._stall_s:
                self._stop.stop()
                return

    def __enter__(self) -> StallWatch:
        self._last = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
