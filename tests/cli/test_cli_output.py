"""planner-cli's output read through a pipe (issue 27, items 6 and 8): tables and --help at full
width instead of cut at 80 columns, human units in the service client's tables (--json keeps
the raw document), choices refused by the CLI library with the choices listed, -h and
--version, and no log line per HTTP poll."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, get_args

import pytest
from conftest import REPO_ROOT, run_cli

from planner.core.io import write_json
from planner.core.synthetic import training_graph

NARROW = {"COLUMNS": "80"}  # what a pipe gets from rich without a width of its own


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-output") / "g.json"
    write_json(path, training_graph(24, skip=3, seed=5))
    return path


def in_process(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
               *args: object) -> tuple[int, str, str]:
    """planner-cli's console entry point in this process (as tests/cli/test_offload_cli.py)."""
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", *map(str, args)])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_piped_tables_are_not_cut_at_80_columns(graph_path: Path) -> None:
    r = run_cli("sweep", graph_path, "--budgets", "0.3,1.0", "--method", "store-all",
                "--jobs", "1", "--time-limit", "5", env=NARROW)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, r.stdout
    header = next(line for line in r.stdout.splitlines() if "budget" in line and "status" in line)
    assert all(word in header for word in ("overhead", "peak/budget", "bound", "gap")), header
    rows = [line for line in r.stdout.splitlines() if "infeasible" in line or "optimal" in line]
    assert len(rows) == 2, r.stdout  # one line a budget, nothing wrapped


def test_piped_help_is_plain_and_whole(graph_path: Path) -> None:
    r = run_cli("solve", "--help", env=NARROW)
    assert r.returncode == 0, r.stderr
    assert "╭" not in r.stdout and "…" not in r.stdout
    budget_line = next(line for line in r.stdout.splitlines() if "--budget" in line)
    # the whole help of --budget on its line, not wrapped into a box 80 columns wide
    assert "(1.5, 1e9) is refused" in budget_line, r.stdout
    assert len(budget_line) > 80


def test_dash_h_and_version(capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = in_process(capsys, monkeypatch, "-h")
    assert code == 0 and "Commands:" in out and "--version" in out
    code, out, _ = in_process(capsys, monkeypatch, "solve", "-h")
    assert code == 0 and "--budget" in out
    code, out, _ = in_process(capsys, monkeypatch, "--version")
    assert code == 0 and out.strip() == f"planner-cli {version('planner')}"


@pytest.mark.parametrize(("args", "option", "choices"), [
    (["schema", "graphs"], "WHICH", ["graph", "plan", "resources"]),
    (["min-budget", "{g}", "--backend", "pulp-cbc"], "--backend",
     ["cpsat", "scip", "highs", "cbc"]),
    (["trace", "planner.zoo:mlp", "--level", "ops"], "--level", ["op", "module"]),
    (["trace", "planner.zoo:mlp", "--costs", "measured"], "--costs", ["estimate", "measure"]),
    (["trace", "planner.zoo:mlp", "--clock", "cpu-time"], "--clock", ["wall", "cpu"]),
    (["trace", "planner.zoo:mlp", "--dropout-masks", "bool"], "--dropout-masks",
     ["eager", "graph"]),
    (["trace", "planner.zoo:mlp", "--optimizer", "lion"], "--optimizer",
     ["sgd", "sgd-momentum", "adam", "adamw"]),
    (["partition", "{g}", "--schedule", "zb"], "--schedule",
     ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"]),
    (["memory", "{g}", "--optimizer", "lion"], "--optimizer",
     ["sgd", "sgd-momentum", "adam", "adamw"]),
    (["memory", "{g}", "--precision", "fp8"], "--precision", ["fp32", "bf16-mixed",
                                                            "fp16-mixed"]),
])
def test_choices_are_refused_by_the_library_and_listed_in_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, graph_path: Path,
    args: list[str], option: str, choices: list[str],
) -> None:
    args = [a.replace("{g}", str(graph_path)) for a in args]
    code, out, err = in_process(capsys, monkeypatch, *args)
    assert code == 2 and out == "", err
    [line] = err.splitlines()
    assert line.startswith(f"error: Invalid value for '{option}'"), line
    assert "is not one of " + ", ".join(f"'{c}'" for c in choices) in line, line
    assert "Value error" not in line
    code, out, _ = in_process(capsys, monkeypatch, args[0], "--help")
    assert code == 0 and "<" + "|".join(choices) + ">" in out, out


def test_min_budget_backends_are_mip_backends() -> None:
    from planner.cli.remat_cmds import MinBudgetBackend
    from planner.solvers.remat.backends import MIP_BACKENDS

    assert set(get_args(MinBudgetBackend)) == set(MIP_BACKENDS) - {"pulp-cbc"}


ANSWER: dict[str, Any] = {
    "id": "job-1", "status": "done", "method": "auto", "budget_bytes": 3 * 2**20,
    "progress": None, "cached": False,
    "report": {"backend": "auto:greedy", "peak_bytes": 3_000_000,
               "overhead_percent": 3.5532994923857872, "gap_percent": 1.25,
               "wall_seconds": 2.345},
}


def test_job_table_in_human_units(capsys: pytest.CaptureFixture[str]) -> None:
    from planner.cli.service_cmds import _show, job_rows

    rows = dict(job_rows(ANSWER, None))
    assert rows["budget"] == "3.00 MiB (3145728 B)"
    assert rows["peak"] == "2.86 MiB (3000000 B)"
    assert rows["compute overhead"] == "+3.55 %"
    assert rows["gap to bound"] == "1.25 %"
    assert rows["time"] == "2.35 s"
    assert rows["method"] == "auto / auto:greedy"
    _show(ANSWER, False, None)
    shown = capsys.readouterr().out
    assert "+3.55 %" in shown and "3.5532994923857872" not in shown
    _show(ANSWER, True, None)  # --json: the service's document as it is
    assert json.loads(capsys.readouterr().out)["report"]["overhead_percent"] == pytest.approx(
        3.5532994923857872)


def test_job_progress_is_said_in_overheads_not_as_a_dict(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from planner.cli.progress_view import EVERY_ENV
    from planner.cli.service_cmds import _poll, graph_compute_ms, progress_text

    monkeypatch.setenv(EVERY_ENV, "0.1")

    document = json.loads(training_graph(4, seed=1).model_dump_json())
    base = graph_compute_ms(document)
    assert base is not None
    assert base == pytest.approx(sum(n["compute_ms"] for n in document["nodes"]))
    assert progress_text({"best_objective": 1.1 * base, "best_bound": base}, base) == \
        "best +10.000 % · bound +0.000 %"
    assert progress_text({"best_objective": 441.0, "best_bound": None}, None) == \
        "best 441 ms · bound -"
    assert progress_text({"best_objective": None, "best_bound": None}, base) == ""

    running = {"best_objective": 1.5 * base, "best_bound": 1.2 * base}

    class Client:  # PlannerClient.wait's contract: on_change sees each change, then the answer
        def wait(self, plan_id: str, on_change: Any) -> dict[str, Any]:
            on_change({"status": "queued", "progress": None})
            time.sleep(0.3)
            on_change({"status": "running", "progress": running})
            time.sleep(0.3)
            return ANSWER

    assert _poll(Client(), "job-1", False, base_cost=base, time_limit_s=20) is ANSWER  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert out == ""  # stdout keeps the answer only
    lines = err.splitlines()  # every 0.1 s here (PLANNER_PROGRESS_EVERY_S)
    assert re.fullmatch(r"plan job-1: 0\.\d s of 20 s · queued", lines[0]), err
    assert lines[-1].endswith(" s of 20 s · running · best +50.000 % · bound +20.000 %"), err
    assert "{" not in err and "best_objective" not in err, err


def test_info_says_units(graph_path: Path) -> None:
    r = run_cli("info", graph_path, env=NARROW)
    assert r.returncode == 0, r.stderr
    cost = next(line for line in r.stdout.splitlines() if "total_compute_cost" in line)
    assert " ms" in cost, cost
    peak = next(line for line in r.stdout.splitlines() if "store_all_peak_bytes" in line)
    assert re.search(r"[\d.]+ MiB \(\d+ B\)", peak), peak
    phases = next(line for line in r.stdout.splitlines() if "phases" in line)
    assert "forward 24" in phases and "{" not in phases, phases


def _restore_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "level", logger.level)


def test_the_cli_quiets_http_request_logs(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _restore_levels(monkeypatch)
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    in_process(capsys, monkeypatch, "--version")
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("httpcore").level == logging.WARNING


class _Stop(Exception):
    pass


def test_the_agent_example_quiets_http_request_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/train_gpt.py logs the agent at INFO; httpx would add a line per poll."""
    _restore_levels(monkeypatch)
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    spec = importlib.util.spec_from_file_location("train_gpt_example",
                                                  REPO_ROOT / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from planner import zoo

    def stop(**_: Any) -> None:  # the model is built right after the logging set-up
        raise _Stop

    monkeypatch.setattr(zoo, "gpt", stop)
    with pytest.raises(_Stop):
        example.main(["--server", "http://127.0.0.1:9", "--steps", "1"])
    assert logging.getLogger("httpx").level == logging.WARNING
