"""The GPU fidelity benchmark's targets, its rows' columns, the judging of a row and its tables.

No torch here: the judging is tested on fabricated rows (tests/runtime/test_gpu_fidelity_cpu.py).

Targets (issue 25): for every plan, measured peak <= predicted peak <= budget, the predicted
peak within `PEAK_TOLERANCE` of the measured one, the measured step within `TIME_TOLERANCE` of
the predicted makespan (judged on CUDA only: CPU timings are informational) and gradients equal
to eager's (`GRAD_TOLERANCE`, relative to the largest gradient entry). "Predicted" memory is
the step's share of the plan's peak: `Plan.predicted.peak_bytes` minus the bytes resident before
the step (`step_bytes_predicted`), comparable with the allocator's peak above the step's start.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

PEAK_TOLERANCE = 0.02  # |predicted - measured| <= 2 % of measured
TIME_TOLERANCE = 0.05  # |step / predicted makespan - 1| <= 5 %
GRAD_TOLERANCE = 1e-5  # max |grad - eager grad| <= this x max |eager grad|

MiB = 2**20

# Every row has these keys (None where they do not apply).
COLUMNS: tuple[str, ...] = (
    "device", "model", "method", "budget", "budget_bytes", "status", "kind", "solve_s",
    "pred_peak_bytes", "fixed_bytes", "pred_step_bytes", "meas_peak_bytes", "mem_ratio",
    "pred_le_budget", "step_ms", "pred_ms", "time_ratio", "max_grad_diff", "grad_scale",
    "loss_diff", "d2h_bytes", "h2d_bytes", "same_plan_as", "verdict", "failures", "error",
)


def new_row(**values: Any) -> dict[str, Any]:
    """A row with every column, `values` filled in."""
    unknown = set(values) - set(COLUMNS) - {"timeline"}
    if unknown:
        raise KeyError(f"unknown row columns: {sorted(unknown)}")
    return {**dict.fromkeys(COLUMNS), "failures": [], **values}


def step_bytes_predicted(predicted_peak_bytes: int, fixed_bytes: int,
                         step_gradient_bytes: int = 0) -> int:
    """The plan's predicted peak as a step measures it: above what is resident before the step.

    `fixed_bytes` (Graph.fixed_bytes) holds parameters, optimizer state, inputs, buffers and,
    under gradient lifetime "step", the gradients (`step_gradient_bytes`); under "backward" the
    gradients are held from their gradient nodes on, so the peak already counts them once and
    `step_gradient_bytes` is 0. A step measured after `zero_grad(set_to_none=True)` allocates its
    gradients during backward, so those counted in `fixed_bytes` are added back (an upper bound
    then, as they may appear after the peak: trace with "backward" for an exact figure).
    """
    return predicted_peak_bytes - fixed_bytes + step_gradient_bytes


def judge(row: dict[str, Any], judge_time: bool = True) -> dict[str, Any]:
    """Fill in `row`'s derived ratios, `failures` and `verdict` (PASS, FAIL, no plan, error)."""
    meas, pred = row.get("meas_peak_bytes"), row.get("pred_step_bytes")
    if meas is not None and pred:
        row["mem_ratio"] = round(meas / pred, 4)
    if row.get("pred_peak_bytes") is not None and row.get("budget_bytes") is not None:
        row["pred_le_budget"] = row["pred_peak_bytes"] <= row["budget_bytes"]
    if row.get("step_ms") is not None and row.get("pred_ms"):
        row["time_ratio"] = round(row["step_ms"] / row["pred_ms"], 4)
    if row.get("error"):
        row["verdict"] = "error"
        return row
    if meas is None or pred is None:
        row["verdict"] = "no plan" if row.get("status") not in ("optimal", "feasible") else "error"
        return row
    failures: list[str] = []
    if meas > pred:
        failures.append(f"meas>pred by {_bytes_text(meas - pred)}")
    if row.get("pred_le_budget") is False:
        failures.append("pred>budget")
    if abs(pred - meas) > PEAK_TOLERANCE * meas:
        failures.append(f"pred off >{PEAK_TOLERANCE:.0%}")
    if judge_time and row.get("time_ratio") is not None \
            and abs(row["time_ratio"] - 1) > TIME_TOLERANCE:
        failures.append(f"time off >{TIME_TOLERANCE:.0%}")
    diff, scale = row.get("max_grad_diff"), row.get("grad_scale")
    if diff is None or diff > GRAD_TOLERANCE * max(scale or 0.0, 1e-12):
        failures.append("grads differ" if diff is not None else "no parity check")
    row["failures"] = failures
    row["verdict"] = "FAIL" if failures else "PASS"
    return row


def memory_failed(row: dict[str, Any]) -> bool:
    """Whether the row missed a memory target (what the --timeline diagnostic looks into)."""
    return any(f.startswith(("meas>pred", "pred off", "pred>budget"))
               for f in row.get("failures") or ())


# -- tables ------------------------------------------------------------------------------------
def _bytes_text(n: int) -> str:
    """12 B, 3.5 KiB, 41.2 MiB: an excess readable at a glance."""
    if abs(n) < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if abs(n) < MiB else f"{n / MiB:.1f} MiB"


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / MiB:.2f}"


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    body = [list(r) for r in rows]
    widths = [max(len(r[i]) for r in [list(header), *body]) for i in range(len(header))]
    line = [("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
            for r in [list(header), *body]]
    return [line[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *line[1:]]


def ordered(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    """Rows by model (first seen first), budget (eager, then largest to "least"), method (in
    `methods`' order): the order a reader compares them in, not the order solves finished."""
    models = {m: i for i, m in enumerate(dict.fromkeys(str(r.get("model")) for r in rows))}
    rank = {m: i for i, m in enumerate(methods)}

    def budget_key(label: Any) -> float:
        try:
            return -float(label)
        except (TypeError, ValueError):
            return -2.0 if label in ("-", None) else 1.0  # eager first, "least" last

    return sorted(rows, key=lambda r: (models[str(r.get("model"))], budget_key(r.get("budget")),
                                       rank.get(str(r.get("method")), -1)))


def rows_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per row: memory and time, measured and predicted, side by side."""
    header = ["model", "method", "budget", "kind", "budget MiB", "pred MiB", "meas MiB",
              "meas/pred", "step ms", "pred ms", "step/pred", "grad diff", "verdict"]
    out = []
    for r in rows:
        verdict = r.get("verdict") or "-"
        if r.get("failures"):
            verdict += " (" + ", ".join(r["failures"]) + ")"
        elif r.get("error"):
            verdict += f" ({str(r['error'])[:60]})"
        elif verdict == "no plan" and r.get("status"):
            verdict += f" ({r['status']})"
        out.append([str(r.get("model")), str(r.get("method")), str(r.get("budget")),
                    str(r.get("kind") or "-"), _mib(r.get("budget_bytes")),
                    _mib(r.get("pred_step_bytes")), _mib(r.get("meas_peak_bytes")),
                    _num(r.get("mem_ratio"), 4), _num(r.get("step_ms"), 2),
                    _num(r.get("pred_ms"), 2), _num(r.get("time_ratio")),
                    "-" if r.get("max_grad_diff") is None else f"{r['max_grad_diff']:.2g}",
                    verdict])
    return _markdown(header, out)


def summary_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per model: plans judged, passed, and the median / worst memory and time ratios."""
    header = ["model", "plans", "PASS", "FAIL", "no plan / error", "median meas/pred",
              "max meas/pred", "median step/pred", "max |step/pred - 1|"]
    out = []
    for model in dict.fromkeys(str(r.get("model")) for r in rows):
        mine = [r for r in rows if str(r.get("model")) == model and r.get("method") != "eager"]
        mem = [r["mem_ratio"] for r in mine if r.get("mem_ratio") is not None]
        time = [r["time_ratio"] for r in mine if r.get("time_ratio") is not None]
        judged = [r for r in mine if r.get("verdict") in ("PASS", "FAIL")]
        out.append([
            model, str(len(judged)), str(sum(r["verdict"] == "PASS" for r in judged)),
            str(sum(r["verdict"] == "FAIL" for r in judged)), str(len(mine) - len(judged)),
            _num(statistics.median(mem) if mem else None, 4), _num(max(mem, default=None), 4),
            _num(statistics.median(time) if time else None),
            _num(max((abs(t - 1) for t in time), default=None)),
        ])
    return _markdown(header, out)


def timeline_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The --timeline diagnostics of failing rows, one line each."""
    out = []
    for r in rows:
        for t in r.get("timeline") or []:
            if t.get("error"):
                out.append(f"- {r['model']} / {r['method']} @ {r['budget']} ({t['mode']}): "
                           f"the diagnostic failed: {t['error']}")
                continue
            where = (f"first excess at action {t['first_index']} ({t['first_action']}): "
                     f"{_bytes_text(t['first_excess_bytes'])} over the simulator"
                     if t.get("first_index") is not None else "measured never exceeds the "
                     "simulator by more than the tolerance")
            out.append(f"- {r['model']} / {r['method']} @ {r['budget']} ({t['mode']}): {where}; "
                       f"worst {_bytes_text(t.get('worst_excess_bytes') or 0)} at action "
                       f"{t.get('worst_index')} ({t.get('worst_action')}); "
                       f"{t.get('samples')} samples")
    return out
