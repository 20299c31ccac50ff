"""Solve the Checkmate MILP through a backend and turn its solution into a checked schedule."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.core.plan import Action
from planner.solvers.remat.backends import solve_linear
from planner.solvers.remat.milp import build_checkmate
from planner.solvers.remat.problem import RematProblem, StagedSchedule, staged_actions
from planner.solvers.remat.stop import Progress, SearchStop


@dataclass(frozen=True)
class RematResult:
    """A solver's answer in problem terms; actions are None when it found no plan."""

    status: str  # optimal | feasible | infeasible | unknown
    backend: str
    actions: list[Action] | None = None
    schedule: StagedSchedule | None = None
    cost: float | None = None  # compute cost of the schedule
    peak_bytes: int | None = None  # by the simulator's accounting
    bound: float | None = None  # proven lower bound on the cost
    wall_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def schedule_result(
    problem: RematProblem, sched: StagedSchedule, status: str, backend: str, bound: float | None,
    started: float, notes: tuple[str, ...] = (),
) -> RematResult:
    """Package a schedule; a schedule over budget or invalid is reported, never returned."""
    try:
        actions, peak = staged_actions(problem, sched)
    except ValueError as e:
        return RematResult("unknown", backend, bound=bound, notes=(*notes, f"invalid: {e}"),
                           wall_seconds=time.perf_counter() - started)
    if peak > problem.budget_bytes:
        return RematResult("unknown", backend, bound=bound,
                           notes=(*notes, f"solution peaks at {peak} bytes, over budget"),
                           wall_seconds=time.perf_counter() - started)
    return RematResult(status, backend, actions, sched, sched.cost(problem), peak, bound,
                       time.perf_counter() - started, notes)


def _fits(problem: RematProblem, sched: StagedSchedule) -> bool:
    try:
        return staged_actions(problem, sched)[1] <= problem.budget_bytes
    except ValueError:
        return False


def solve_milp(
    problem: RematProblem,
    backend: str = "cpsat",
    *,
    time_limit_s: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    hint: StagedSchedule | None = None,
    stop: SearchStop | None = None,
    progress: Progress | None = None,
    linearization: int | None = None,
) -> RematResult:
    """`progress(objective, bound)`: the hint's cost first, then the backend's improvements.
    `linearization`: CP-SAT's linearization level (`backends.solve_linear`)."""
    started = time.perf_counter()
    if progress is not None and hint is not None and _fits(problem, hint):
        progress(hint.cost(problem), None)
    milp = build_checkmate(problem)
    remaining = time_limit_s - (time.perf_counter() - started)
    if remaining <= 0.05 and hint is not None:  # building took the whole limit
        return schedule_result(problem, hint, "feasible", backend, None, started,
                               ("no time left to solve the MILP; returning the hint",))
    raw = solve_linear(milp.model, backend, time_limit_s=max(0.05, remaining), threads=threads,
                       seed=seed, hint=milp.hint(hint) if hint is not None else None, stop=stop,
                       progress=progress, linearization=linearization)
    found = (schedule_result(problem, milp.schedule(raw.values), raw.status, backend, raw.bound,
                             started) if raw.values is not None else None)
    if hint is not None and (found is None or found.actions is None):
        # The solver found nothing in time: the hint is still the best plan known.
        hinted = schedule_result(problem, hint, "feasible", backend, raw.bound, started,
                                 ("the solver found no plan in time; returning the hint",))
        if hinted.actions is not None:
            return hinted
    if found is None:
        return RematResult(raw.status, backend, bound=raw.bound,
                           wall_seconds=time.perf_counter() - started)
    return found
