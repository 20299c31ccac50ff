"""The GPU fidelity benchmark's core: per model, trace, solve every method at every budget in
worker processes, and measure each plan as its solve completes (benchmarks/gpu_fidelity.py is
the command; tests/runtime/test_gpu_fidelity_cpu.py runs `run_fidelity` on a tiny CPU
configuration).

Time is shared out: each model gets the run's remaining time divided by the models left; rows
not measured by then say so. Identical plans (same actions) are measured once.
"""

from __future__ import annotations

import gc
import json
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from fidelity_judge import judge, memory_failed, new_row, step_bytes_predicted
from fidelity_measure import (
    device_tag,
    eager_reference,
    machine_resources,
    measure,
    measure_plan,
    save_graph,
    trace_model,
    training_step,
)
from fidelity_solve import (
    fraction_budgets,
    gradients_in_fixed_bytes,
    least_budget_job,
    make_pool,
    solve_job,
    store_all_peak_bytes,
    with_least,
)
from results import write_json

Row = dict[str, Any]


@dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], tuple[Any, tuple[Any, ...]]]
    autocast: str | None = None


@dataclass
class RunConfig:
    device: str  # "cuda" or "cpu"
    models: list[ModelCase]
    methods: list[str]
    fractions: tuple[float, ...] = (0.8, 0.5)
    time_limit_s: float = 4.0
    jobs: int = 1
    threads: int = 1
    repeats: int = 5  # timed steps per plan (0: time the parity step)
    trace_repeats: int = 5  # timed runs per op when tracing (measured costs)
    max_s: float = 330.0
    timeline: bool = False
    graphs_dir: Path | None = None
    timeline_tolerance: float = 0.002  # of the predicted step bytes
    timeline_rows: int = 3  # rows diagnosed per model at most (each costs a few steps)


@dataclass
class _Model:
    """One model's state while its plans are solved and measured."""

    case: ModelCase
    model: Any
    inputs: tuple[Any, ...]
    trace: Any
    ref: Any
    measured: dict[str, tuple[str, Row]] = field(default_factory=dict)  # plan text -> row
    diagnosed: int = 0


def run_fidelity(config: RunConfig, out_path: Path | None = None, argv: list[str] | None = None,
                 on_row: Callable[[Row], None] | None = None) -> dict[str, Any]:
    """Every model's rows ({"info", "rows"}), written to `out_path` after each row."""
    started = time.perf_counter()
    cuda = config.device == "cuda"
    info: dict[str, Any] = {
        "device": config.device, "torch": torch.__version__, "argv": list(argv or []),
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "wall_s": 0.0,
        "time_limit_s": config.time_limit_s, "fractions": [f"{f:g}" for f in config.fractions],
        "methods": config.methods, "models": {}, "notes": [],
    }
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        info["wall_s"] = round(time.perf_counter() - started, 1)
        if out_path is not None:
            write_json(out_path, {"info": info, "rows": rows})
        if on_row is not None:
            on_row(row)
        else:
            print(_one_line(row), flush=True)

    resources = machine_resources(config.device)
    info["links"] = f"h2d {resources.h2d}, d2h {resources.d2h}"
    pool = make_pool(config.jobs)
    try:
        for k, case in enumerate(config.models):
            left = config.max_s - (time.perf_counter() - started)
            deadline = time.perf_counter() + left / (len(config.models) - k)
            try:
                _run_model(case, config, pool, resources, deadline, info, emit)
            except Exception as e:  # noqa: BLE001 - one model's failure is its row
                info["notes"].append(f"{case.name}: {traceback.format_exc()[-2000:]}")
                emit(judge(new_row(device=config.device, model=case.name, method="(model)",
                                   error=f"{type(e).__name__}: {e}"[:400])))
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    info["wall_s"] = round(time.perf_counter() - started, 1)
    if out_path is not None:
        write_json(out_path, {"info": info, "rows": rows})
    return {"info": info, "rows": rows}


def _one_line(row: Row) -> str:
    keys = ("model", "method", "budget", "kind", "mem_ratio", "time_ratio", "max_grad_diff",
            "verdict", "failures", "error")
    return json.dumps({k: row[k] for k in keys if row.get(k) not in (None, [])})


def _run_model(case: ModelCase, config: RunConfig, pool: Executor, resources: Any,
               deadline: float, info: dict[str, Any], emit: Callable[[Row], None]) -> None:
    device = config.device
    started = time.perf_counter()
    model, inputs = case.build()
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    result = trace_model(model, inputs, case.autocast, config.trace_repeats)
    graph = result.graph
    path, note = save_graph(graph, config.graphs_dir or Path("."), device_tag(device), case.name)
    store_all = store_all_peak_bytes(graph)
    meta: dict[str, Any] = {"nodes": len(graph.nodes), "fixed_bytes": graph.fixed_bytes,
                            "store_all_peak_bytes": store_all, "graph": str(path),
                            "trace_s": round(time.perf_counter() - started, 1)}
    info["models"][case.name] = meta
    if note:
        info["notes"].append(note)
    graph_json = graph.model_dump_json()
    res_json = resources.model_dump_json()
    jobs: dict[Future[Any], tuple[str, str, int]] = {}
    budgets = fraction_budgets(store_all, config.fractions)

    def submit(label: str, budget: int) -> None:
        for method in config.methods:
            jobs[pool.submit(solve_job, graph_json, res_json, budget, method,
                             config.time_limit_s, config.threads)] = (method, label, budget)

    least = pool.submit(least_budget_job, graph_json, config.time_limit_s, config.threads)
    state = _Model(case, model, inputs, result, eager_reference(model, inputs, device,
                                                                case.autocast))
    emit(_eager_row(state, config, graph, store_all))
    pending: set[Future[Any]] = {least}
    while pending:
        left = deadline - time.perf_counter()
        done, pending = wait(pending, timeout=max(left, 0.0), return_when=FIRST_COMPLETED)
        if not done:
            break
        for future in done:
            if future is least:
                found = future.result()
                meta["least_budget_bytes"], meta["least_budget_by"] = found["bytes"], found["how"]
                budgets = with_least(budgets, found["bytes"])
                for label, budget in budgets:
                    submit(label, budget)
                pending |= set(jobs)
                continue
            method, label, budget = jobs.pop(future)
            row = new_row(device=device, model=case.name, method=method, budget=label,
                          budget_bytes=budget, fixed_bytes=graph.fixed_bytes)
            if time.perf_counter() > deadline:
                row["error"] = "skipped: the model's share of the run's time ran out"
            else:
                _plan_row(row, future, state, config)
            emit(row)
    for future in pending:
        future.cancel()
        if future in jobs:
            method, label, budget = jobs.pop(future)
            emit(judge(new_row(device=device, model=case.name, method=method, budget=label,
                               budget_bytes=budget, error="skipped: the model's share of the "
                               "run's time ran out before its solve finished")))
    meta["wall_s"] = round(time.perf_counter() - started, 1)


def _eager_row(state: _Model, config: RunConfig, graph: Any, store_all: int) -> Row:
    """The model without a plan (a reference, not judged): its peak and step time."""
    row = new_row(device=config.device, model=state.case.name, method="eager", budget="-",
                  fixed_bytes=graph.fixed_bytes, verdict="reference",
                  pred_step_bytes=step_bytes_predicted(store_all, graph.fixed_bytes,
                                                       gradients_in_fixed_bytes(graph)),
                  pred_ms=graph.total_compute_ms)
    step = training_step(state.model, state.inputs, config.device, state.case.autocast)
    # parity with itself: the reference is deterministic under the seed
    row.update(measure(state.model, step, config.device, config.repeats, state.ref))
    row["mem_ratio"] = round(row["meas_peak_bytes"] / row["pred_step_bytes"], 4)
    if row["step_ms"] is not None and row["pred_ms"]:
        row["time_ratio"] = round(row["step_ms"] / row["pred_ms"], 4)
    return row


def _plan_row(row: Row, future: Future[Any], state: _Model, config: RunConfig) -> None:
    """Fill `row` from a finished solve: the plan's prediction, its measurement, the verdict."""
    from planner.core.plan import Plan
    from planner.runtime.apply import apply

    answer = future.result()
    row["solve_s"] = answer.get("solve_s")
    if "error" in answer:
        row["error"] = answer["error"]
        judge(row)
        return
    plan = Plan.model_validate_json(answer["plan"])
    row["status"], row["kind"] = plan.status.value, str(plan.kind or "remat")
    graph = state.trace.graph
    if plan.status.value not in ("optimal", "feasible") or plan.predicted is None:
        judge(row)
        return
    p = plan.predicted
    row["pred_peak_bytes"] = p.peak_bytes
    row["pred_step_bytes"] = step_bytes_predicted(p.peak_bytes, graph.fixed_bytes,
                                                  gradients_in_fixed_bytes(graph))
    row["pred_ms"] = p.makespan_ms or p.compute_cost
    same = state.measured.get(plan.text)
    module = None
    try:
        if same is not None:
            row["same_plan_as"] = same[0]
            row.update({k: same[1][k] for k in ("meas_peak_bytes", "step_ms", "max_grad_diff",
                                                "grad_scale", "loss_diff", "d2h_bytes",
                                                "h2d_bytes")})
        else:
            module = apply(state.model, plan, state.inputs, trace=state.trace)
            row.update(measure_plan(state.model, module, state.inputs, config.device,
                                    state.case.autocast, config.repeats, state.ref))
            state.measured[plan.text] = (f"{row['method']} @ {row['budget']}", row)
    except Exception as e:  # noqa: BLE001 - a plan that cannot run is its row's error
        row["error"] = f"{type(e).__name__}: {e}"[:400]
        row["traceback"] = traceback.format_exc()[-2000:]  # in the JSON, for the next session
    judge(row, judge_time=config.device == "cuda")
    if config.timeline and module is not None and _worth_diagnosing(row, state, config):
        state.diagnosed += 1
        row["timeline"] = _diagnose(row, module, state, config)


def _worth_diagnosing(row: Row, state: _Model, config: RunConfig) -> bool:
    """A row that missed a memory target by more than the diagnostic's tolerance, while the
    model's allowance of diagnosed rows lasts."""
    pred, meas = row.get("pred_step_bytes"), row.get("meas_peak_bytes")
    if not memory_failed(row) or pred is None or meas is None:
        return False
    material = abs(meas - pred) > config.timeline_tolerance * pred or row["pred_le_budget"] is False
    return material and state.diagnosed < config.timeline_rows


def _diagnose(row: Row, module: Any, state: _Model, config: RunConfig) -> list[dict[str, Any]]:
    from fidelity_timeline import diagnose

    tolerance = int(config.timeline_tolerance * (row["pred_step_bytes"] or 0))
    graph = state.trace.graph
    before_step = graph.fixed_bytes - gradients_in_fixed_bytes(graph)
    modes = (False, True) if config.device == "cuda" else (False,)
    out = []
    for sync in modes:
        try:
            out.append(diagnose(state.model, module, state.trace, state.inputs, config.device,
                                before_step, tolerance, sync, state.case.autocast))
        except Exception as e:  # noqa: BLE001 - the diagnostic must not lose the row
            out.append({"mode": "sync" if sync else "async", "error": f"{type(e).__name__}: {e}"})
    return out
