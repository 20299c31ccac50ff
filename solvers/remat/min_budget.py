"""The least budget for which a plan exists: one MILP whose objective is the peak."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import bounded_baselines
from planner.solvers.remat.backends import solve_linear
from planner.solvers.remat.milp import build_checkmate
from planner.solvers.remat.problem import problem_from_graph, staged_actions, staged_from_actions


@dataclass(frozen=True)
class MinBudget:
    peak_bytes: int  # the least peak of a plan found (that plan fits this budget)
    lower_bound_bytes: int  # no frontier-advancing plan (the MILP's space) peaks lower
    proven: bool  # peak_bytes == lower_bound_bytes
    actions: list[Action]
    method: str
    wall_seconds: float


def min_budget(graph: Graph, *, backend: str = "cpsat", time_limit_s: float = 30.0,
               threads: int = 2, seed: int = 0) -> MinBudget:
    started = time.perf_counter()
    best_actions, best_peak, method = None, None, "baseline"
    for name, actions in bounded_baselines(graph, None):
        peak = simulate(graph, actions).peak_bytes
        if best_peak is None or peak < best_peak:
            best_actions, best_peak, method = actions, peak, f"baseline:{name}"
    assert best_actions is not None and best_peak is not None
    trivial = lower_bound_peak_bytes(graph)
    lower = trivial
    if best_peak > trivial:
        problem = problem_from_graph(graph, best_peak)
        milp = build_checkmate(problem, minimise_peak=True)
        hint_sched = staged_from_actions(problem, best_actions)
        hint = milp.hint(hint_sched) if hint_sched is not None else None
        if hint is not None:
            hint[milp.model.num_vars - 1] = float(problem.budget_units)
        left = max(0.5, time_limit_s - (time.perf_counter() - started))
        raw = solve_linear(milp.model, backend, time_limit_s=left, threads=threads, seed=seed,
                           hint=hint)
        if raw.bound is not None:
            # The MILP covers frontier-advancing schedules only; no proof beyond them is claimed
            # unless the bound meets the trivial one.
            lower = max(trivial, math.ceil(raw.bound - 1e-6) * problem.memory_unit)
        if raw.values is not None:
            actions, peak = staged_actions(problem, milp.schedule(raw.values))
            peak = simulate(graph, actions).peak_bytes
            if peak < best_peak:
                best_actions, best_peak, method = actions, peak, f"milp:{backend}"
    lower = min(lower, best_peak)
    return MinBudget(best_peak, lower, best_peak <= lower, best_actions, method,
                     time.perf_counter() - started)
