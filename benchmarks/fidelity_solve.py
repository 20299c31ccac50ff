"""Which methods and budgets the GPU fidelity benchmark plans with, and solving them in worker
processes (OR-Tools is CPU work: the GPU measures one plan while others are solved).

Methods: every registered method that makes one-device plans (remat, offload, remat+offload:
`planner.engine.registry`), remat methods first, then those that offload. Budgets: fractions of
the store-all peak, then the least budget that fits (`planner.solvers.remat.min_budget`, the
search behind `planner-cli min-budget`; the least affordable baseline when it overruns).
No torch here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import Graph

ONE_DEVICE_KINDS = frozenset({"remat", "offload", "remat+offload"})


def planned_methods(names: Sequence[str] | None = None) -> list[str]:
    """Every one-device method of the registry (remat ones first), or the given subset."""
    from planner.engine.offload_checks import is_offload_method
    from planner.engine.registry import method_specs

    specs = [s for s in method_specs() if not s.pipeline and ONE_DEVICE_KINDS & set(s.plan_kinds)]
    every = [s.name for s in specs if not is_offload_method(s.name)]
    every += [s.name for s in specs if is_offload_method(s.name)]
    if not names:
        return every
    unknown = [n for n in names if n not in every]
    if unknown:
        raise InputError(f"{', '.join(unknown)}: not a one-device method; choose from "
                         f"{', '.join(every)}", field="--methods")
    return [n for n in every if n in names]


def gradients_in_fixed_bytes(graph: Graph) -> int:
    """Gradient bytes that `graph.fixed_bytes` charges from the step's start (all of them under
    gradient lifetime "step"; under "backward" those without a gradient node)."""
    state = graph.model_state
    if state is None:
        return graph.fixed.gradients_bytes
    _, held = state.resident_bytes()
    return state.total().gradients_bytes - sum(held.values())


def store_all_peak_bytes(graph: Graph) -> int:
    from planner.sim.simulator import simulate
    from planner.solvers.baselines import store_all

    return simulate(graph, store_all(graph)).peak_bytes


def fraction_budgets(store_all_peak: int, fractions: Sequence[float]) -> list[tuple[str, int]]:
    """(label, bytes) for each fraction of the store-all peak, largest first."""
    return [(f"{f:g}", int(f * store_all_peak)) for f in sorted(set(fractions), reverse=True)]


def with_least(budgets: list[tuple[str, int]], least_bytes: int) -> list[tuple[str, int]]:
    """The fraction budgets above the least budget that fits, then that one ("least")."""
    return [(label, b) for label, b in budgets if b > least_bytes] + [("least", least_bytes)]


@functools.lru_cache(maxsize=4)
def _graph(graph_json: str) -> Graph:
    return Graph.model_validate_json(graph_json)


def least_budget_job(graph_json: str, time_limit_s: float, threads: int) -> dict[str, Any]:
    """The least budget a plan fits: min-budget's MILP, or the least baseline if it fails."""
    from planner.engine.solve import smallest_baseline_peak_bytes
    from planner.solvers.remat.min_budget import min_budget

    graph = _graph(graph_json)
    started = time.perf_counter()
    try:
        found = min_budget(graph, time_limit_s=time_limit_s, threads=threads)
        return {"bytes": found.peak_bytes, "how": found.method,
                "s": round(time.perf_counter() - started, 2)}
    except Exception as e:  # noqa: BLE001 - a failed search falls back, and says why
        least = smallest_baseline_peak_bytes(graph, started + time_limit_s)
        if least is None:
            raise
        return {"bytes": least, "how": f"least baseline ({type(e).__name__}: {e})"[:200],
                "s": round(time.perf_counter() - started, 2)}


def solve_job(graph_json: str, resources_json: str | None, budget_bytes: int, method: str,
              time_limit_s: float, threads: int) -> dict[str, Any]:
    """One plan as JSON ({"plan": ..., "solve_s": ...}) or {"error": ...}."""
    from planner.core.resources import Resources
    from planner.engine.solve import solve

    graph = _graph(graph_json)
    resources = None if resources_json is None else Resources.model_validate_json(resources_json)
    started = time.perf_counter()
    try:
        plan = solve(graph, budget_bytes, method, time_limit_s=time_limit_s, threads=threads,
                     resources=resources)
    except Exception as e:  # noqa: BLE001 - one method's failure is its row's error
        return {"error": f"solve: {type(e).__name__}: {e}"[:400],
                "solve_s": round(time.perf_counter() - started, 2)}
    return {"plan": plan.model_dump_json(), "solve_s": round(time.perf_counter() - started, 2)}


class InlineExecutor(Executor):
    """Runs each job at submit time (jobs <= 1: no worker processes, e.g. in tests)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(e)
        return future


def make_pool(jobs: int) -> Executor:
    """`jobs` spawned worker processes (not forked: the parent holds a CUDA context)."""
    if jobs <= 1:
        return InlineExecutor()
    return ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
