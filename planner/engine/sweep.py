"""Budget sweeps: solve many budgets in parallel processes; overhead never rises with budget.

A plan that fits a budget fits every larger one, so each budget reports the cheapest plan
found for it or for any smaller budget: the curve is non-increasing by construction, and a
larger budget never looks worse because its own solve was unlucky.

A sweep is one request (planner.engine.request: method, options, machine, time limit per
budget, threads, seed) resolved once and solved at each budget; a worker process rebuilds it
from its resolved values (`stored_request`), nothing parsed or checked again.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.limits import DEFAULT_SWEEP_TIME_LIMIT_S

if TYPE_CHECKING:
    from planner.engine.request import ResolvedRequest, ResourcesInput



@dataclass(frozen=True)
class SweepPoint:
    fraction: float | None  # of the store-all peak, when the budget was given as a fraction
    budget_bytes: int
    status: str
    peak_bytes: int | None
    overhead: float | None  # fraction of extra compute
    lower_bound_overhead: float | None
    gap: float | None
    wall_seconds: float
    source_budget_bytes: int | None  # budget whose plan is reported (≤ budget_bytes)
    actions: str = ""  # plan in text form


MAX_SWEEP_BUDGETS = 1000  # each budget is a solve of up to its time limit


def parse_budgets(spec: str, store_all_peak: int) -> list[tuple[float | None, int]]:
    """'0.3:1.0:0.05' (start:stop:step fractions, stop included) or a comma list of
    fractions / byte sizes; returns (fraction or None, bytes) sorted by bytes."""
    from planner.core.budget import parse_budget_spec

    items: list[tuple[float | None, int]] = []
    if ":" in spec:
        parts = spec.split(":")
        try:
            start, stop, step = (float(p) for p in parts)
        except ValueError:
            raise InputError(f"{spec!r}: expected start:stop:step fractions, e.g. 0.3:1.0:0.05",
                             field="budget") from None
        if len(parts) != 3 or step <= 0 or not 0 < start <= stop <= 1:
            raise InputError(f"{spec!r}: need 0 < start ≤ stop ≤ 1 and step > 0, e.g. "
                             "0.3:1.0:0.05", field="budget")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        if count > MAX_SWEEP_BUDGETS:  # 0.3:1.0:0.0000007 asked for a million solves
            raise InputError(f"{spec!r}: {count} budgets, at most {MAX_SWEEP_BUDGETS}; take a "
                             "larger step", field="budget")
        for k in range(count):
            f = round(start + k * step, 10)
            items.append((f, math.ceil(f * store_all_peak)))
    else:
        if spec.count(",") >= MAX_SWEEP_BUDGETS:
            raise InputError(f"{spec.count(',') + 1} budgets, at most {MAX_SWEEP_BUDGETS}",
                             field="budget")
        for token in spec.split(","):
            parsed = parse_budget_spec(token.strip())  # '1' is one byte, '1.0' all the peak
            items.append((parsed.fraction, parsed.resolve(store_all_peak)))
    return sorted(set(items), key=lambda x: x[1])


def _solve_one(graph_json: str, budget: int, values: dict[str, Any]) -> dict[str, object]:
    """One budget of a sweep, in a worker: the request from its resolved `values`
    (`stored_request`) at `budget`."""
    from planner.core.graph import Graph as _Graph
    from planner.engine.request import stored_request

    graph = _Graph.model_validate_json(graph_json)
    plan = stored_request(graph, {**values, "budget_bytes": budget}).solve()
    pred = plan.predicted
    fits = plan.status.value in ("optimal", "feasible")
    base = graph.total_compute_ms
    return {
        "budget": budget,
        "status": plan.status.value,
        "peak": pred.peak_bytes if pred and fits else None,
        "cost": pred.compute_cost if pred and fits else None,
        "overhead": pred.overhead if pred and fits else None,
        "bound_overhead": (plan.lower_bound - base) / base if plan.lower_bound and base else None,
        "wall": plan.wall_seconds,
        "actions": plan.text if fits else "",
    }


def sweep_request(
    graph: Graph,
    budgets: list[tuple[float | None, int]],
    *,
    method: str = "auto",
    options: Mapping[str, Any] | None = None,
    resources: ResourcesInput = None,
    host_memory: str | int | None = None,
    time_limit: object = DEFAULT_SWEEP_TIME_LIMIT_S,
    threads_per_job: int = 1,
    seed: int = 0,
    graph_where: str = "graph",
) -> ResolvedRequest:
    """The sweep's one request (planner.engine.request.resolve_request), resolved at its least
    budget (the pre-checks that read a budget, such as a pipeline's, see that one); InputError
    naming the first field at fault."""
    from planner.engine.request import resolve_request

    least = min((b for _, b in budgets), default=None)
    return resolve_request(
        graph, None if least is None else f"{least}B", resources=resources,
        host_memory=host_memory, method=method, options=options, time_limit=time_limit,
        threads=threads_per_job, seed=seed, graph_where=graph_where,
    )


def run_sweep(
    graph: Graph | ResolvedRequest,
    budgets: list[tuple[float | None, int]],
    *,
    method: str = "auto",
    options: Mapping[str, Any] | None = None,
    resources: ResourcesInput = None,
    time_limit_s: float = DEFAULT_SWEEP_TIME_LIMIT_S,
    jobs: int = 2,
    threads_per_job: int = 1,
    seed: int = 0,
    on_done: Callable[[int], None] | None = None,
) -> list[SweepPoint]:
    """Solve every budget (in `jobs` processes) and make overhead non-increasing in budget.
    `graph`: a request resolved by `sweep_request` (its budget is replaced by each of
    `budgets`), or a graph with the request's fields as keywords (resolved here)."""
    from planner.engine.request import ResolvedRequest

    request = graph if isinstance(graph, ResolvedRequest) else sweep_request(
        graph, budgets, method=method, options=options, resources=resources,
        time_limit=time_limit_s, threads_per_job=threads_per_job, seed=seed)
    graph_json = request.graph.model_dump_json()
    values = {"method": request.method, "options": dict(request.options),
              "resources": request.resources_document(), "time_limit_s": request.time_limit_s,
              "threads": request.threads, "seed": request.seed}
    raw: dict[int, dict[str, object]] = {}
    if jobs <= 1:
        for _, b in budgets:
            raw[b] = _solve_one(graph_json, b, values)
            if on_done:
                on_done(b)
    else:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_die_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(_solve_one, graph_json, b, values): b for _, b in budgets}
            for fut in as_completed(futures):
                raw[futures[fut]] = fut.result()
                if on_done:
                    on_done(futures[fut])
    return monotone(budgets, raw)


PARENT_CHECK_S = 1.0  # how often a sweep worker looks for its parent


def _die_with_parent(parent_pid: int) -> None:
    """A sweep worker ends when its parent does: a killed `planner-cli sweep` left its workers
    solving for 20 minutes."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()


def record_from_summary(summary: dict[str, object] | None, budget_bytes: int) -> dict[str, object]:
    """The sweep record of one solved budget from its plan summary (`reports.plan_summary`), so
    the service's sweeps are made monotone by the same rule as the CLI's."""
    summary = summary or {}
    fits = summary.get("status") in ("optimal", "feasible")
    overhead_pct = summary.get("overhead_percent")
    overhead = float(overhead_pct) / 100 if fits and overhead_pct is not None else None  # type: ignore[arg-type]
    cost, bound = summary.get("compute_cost"), summary.get("lower_bound")
    bound_overhead = None
    if overhead is not None and cost and bound is not None:
        base = float(cost) / (1 + overhead)  # type: ignore[arg-type]
        bound_overhead = (float(bound) - base) / base if base else None  # type: ignore[arg-type]
    return {
        "budget": budget_bytes,
        "status": str(summary.get("status", "queued")),
        "peak": summary.get("peak_bytes") if fits else None,
        "cost": cost if fits else None,
        "overhead": overhead,
        "bound_overhead": bound_overhead,
        "wall": float(summary.get("wall_seconds") or 0.0),  # type: ignore[arg-type]
        "actions": "",
    }


def monotone(budgets: list[tuple[float | None, int]], raw: dict[int, dict[str, object]]
             ) -> list[SweepPoint]:
    points: list[SweepPoint] = []
    best: SweepPoint | None = None
    for fraction, b in sorted(budgets, key=lambda x: x[1]):
        r = raw[b]
        own = SweepPoint(
            fraction, b, str(r["status"]), r["peak"], r["overhead"],  # type: ignore[arg-type]
            r["bound_overhead"], None, float(r["wall"]), b if r["peak"] is not None else None,  # type: ignore[arg-type]
            str(r["actions"]),
        )
        if own.overhead is not None and (best is None or best.overhead is None
                                         or own.overhead <= best.overhead):
            best = own
        if best is not None and best.overhead is not None:
            chosen = best if best is not own else own
            lb = own.lower_bound_overhead
            gap = None
            if lb is not None:
                cost, bound = 1 + chosen.overhead, 1 + lb  # type: ignore[operator]
                gap = max(0.0, (cost - bound) / cost)
            status = own.status if chosen is own else "feasible"
            points.append(replace(chosen, fraction=fraction, budget_bytes=b, status=status,
                                  lower_bound_overhead=lb, gap=gap, wall_seconds=own.wall_seconds))
        else:
            points.append(own)
    return points
