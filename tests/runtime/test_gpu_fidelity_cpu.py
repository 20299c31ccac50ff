"""The GPU fidelity benchmark (benchmarks/gpu_fidelity.py) on the CPU: its core on one tiny
model and two methods, the judging of rows against the issue's targets, and the --timeline
diagnostic (its probe against the step's measured peak, its comparison on fabricated samples)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fidelity_judge import (  # noqa: E402
    COLUMNS,
    PEAK_TOLERANCE,
    judge,
    memory_failed,
    new_row,
    rows_table,
    summary_table,
)
from fidelity_timeline import END, first_excess  # noqa: E402
from models import tiny_gpt  # noqa: E402


def _tiny_gpt() -> Any:
    return tiny_gpt(dropout=0.1)


def test_core_rows_have_every_column_and_agree_with_the_prediction(tmp_path: Path) -> None:
    from fidelity_run import ModelCase, RunConfig, run_fidelity

    config = RunConfig(device="cpu", models=[ModelCase("gpt", _tiny_gpt)],
                       methods=["chen-sqrt", "offload-all"], fractions=(0.8,), time_limit_s=1.0,
                       jobs=1, repeats=0, trace_repeats=1, max_s=60.0, graphs_dir=tmp_path)
    seen: list[dict[str, Any]] = []
    result = run_fidelity(config, out_path=tmp_path / "rows.json", on_row=seen.append)
    rows = result["rows"]
    assert rows == seen and rows
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == json.loads(
        json.dumps(rows, default=str))
    for row in rows:
        assert set(COLUMNS) <= set(row), set(COLUMNS) - set(row)
    assert (tmp_path / "cpu_gpt.json").is_file()
    assert rows[0]["method"] == "eager" and rows[0]["max_grad_diff"] == 0.0
    budgets = {r["budget"] for r in rows[1:]}
    assert "least" in budgets and {r["method"] for r in rows[1:]} == {"chen-sqrt", "offload-all"}
    measured = [r for r in rows[1:] if r["meas_peak_bytes"] is not None]
    assert measured, rows
    for r in measured:
        # exact storage accounting: the plan's prediction (gradients counted once) is close
        assert abs(r["meas_peak_bytes"] - r["pred_step_bytes"]) <= 0.05 * r["pred_step_bytes"], r
        assert r["max_grad_diff"] == 0.0 and r["verdict"] in ("PASS", "FAIL"), r
        assert r["pred_le_budget"] is True
    offloaded = [r for r in measured if r["method"] == "offload-all"]
    assert offloaded and all(r["d2h_bytes"] > 0 for r in offloaded), rows
    table = rows_table(rows)
    assert len(table) == len(rows) + 2 and "gpt" in summary_table(rows)[2]


def _row(**values: Any) -> dict[str, Any]:
    base = dict(model="m", method="x", budget="0.8", budget_bytes=1000, status="feasible",
                pred_peak_bytes=900, pred_step_bytes=600, meas_peak_bytes=595, step_ms=10.2,
                pred_ms=10.0, max_grad_diff=0.0, grad_scale=1.0)
    return new_row(**{**base, **values})


def test_judge_flags_a_measured_peak_over_the_prediction() -> None:
    good = judge(_row())
    assert good["verdict"] == "PASS" and good["failures"] == [] and good["mem_ratio"] < 1
    over = judge(_row(meas_peak_bytes=601))
    assert over["verdict"] == "FAIL" and over["failures"] == ["meas>pred by 1 B"]
    assert memory_failed(over)
    loose = judge(_row(meas_peak_bytes=int(600 / (1 + 2 * PEAK_TOLERANCE))))
    assert loose["failures"] == [f"pred off >{PEAK_TOLERANCE:.0%}"] and memory_failed(loose)
    assert judge(_row(pred_peak_bytes=1001))["failures"] == ["pred>budget"]
    slow = _row(step_ms=11.0)
    assert judge(dict(slow))["failures"] == ["time off >5%"]
    assert judge(dict(slow), judge_time=False)["verdict"] == "PASS"  # CPU: informational
    assert judge(_row(max_grad_diff=1e-3))["failures"] == ["grads differ"]
    assert judge(_row(status="infeasible", pred_step_bytes=None,
                      meas_peak_bytes=None))["verdict"] == "no plan"
    assert judge(_row(error="apply: boom"))["verdict"] == "error"


def test_first_excess_names_the_first_window_over_the_simulator() -> None:
    simulated = [100, 120, 130, 90]
    samples = [(0, 100), (1, 150), (3, 90), (4, 200)]  # action 2 has no probe (an offload)
    report = first_excess(samples, simulated, ["C0", "C1", "O1", "F1"], tolerance_bytes=10)
    assert (report["first_index"], report["first_action"]) == (1, "C1")
    assert report["first_excess_bytes"] == 30 and report["first_simulated_bytes"] == 120
    assert (report["worst_index"], report["worst_action"]) == (4, END)
    assert report["worst_excess_bytes"] == 110 and report["samples"] == 4
    clean = first_excess([(0, 100), (1, 125)], simulated, ["C0", "C1"], tolerance_bytes=10)
    assert clean["first_index"] is None and clean["worst_excess_bytes"] == 5


@pytest.mark.parametrize("method", ["recompute-all", "offload-all"])
def test_timeline_probe_sees_the_measured_peak(method: str) -> None:
    """The instrumented step (remat program, offload program) samples after every compute and
    free, and its most is the step's measured peak."""
    from fidelity_measure import machine_resources, trace_model, training_step
    from fidelity_timeline import diagnose

    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step

    model, inputs = _tiny_gpt()
    result = trace_model(model, inputs, None, repeats=1)
    graph = result.graph
    plan = solve(graph, 10**15, method, resources=machine_resources("cpu"))
    assert plan.predicted is not None and plan.status.value in ("optimal", "feasible")
    module = apply(model, plan, inputs, trace=result)
    peak = measure_step(training_step(module, inputs, "cpu", None), model).peak_bytes
    report = diagnose(model, module, result, inputs, "cpu", graph.fixed_bytes, 0)
    probed = sum(a.op.value in ("compute", "free") for a in plan.actions)
    assert report["mode"] == "cpu" and report["samples"] == probed + 1
    assert report["measured_peak_bytes"] == peak
    assert report["simulated_peak_bytes"] == plan.predicted.peak_bytes - graph.fixed_bytes
    if method == "offload-all":
        assert any(a.op.value == "offload" for a in plan.actions)
