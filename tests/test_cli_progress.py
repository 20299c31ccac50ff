"""`planner-cli solve` shows the incumbent and bound as they improve (plain lines when stdout is
not a terminal), and keeps --json output clean."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

from planner.cli.progress_view import describe
from planner.core.io import write_json
from planner.core.synthetic import training_graph


def test_describe_overheads() -> None:
    assert describe(110.0, 100.0, 100.0) == "best +10.000 % · bound +0.000 %"
    assert describe(None, None, 100.0) == "best - · bound -"


def test_solve_prints_progress_lines_on_stderr(tmp_path: Path) -> None:
    write_json(tmp_path / "g.json", training_graph(24, skip=3, seed=5))
    r = run_cli("solve", tmp_path / "g.json", "--budget", "0.7", "--method", "cpsat-intervals",
                "--time-limit", "4")
    assert r.returncode in (0, 3), r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("cpsat-intervals: best ")]
    assert lines, r.stderr
    assert "bound +" in lines[-1]
    quiet = run_cli("solve", tmp_path / "g.json", "--budget", "0.7", "--method",
                    "cpsat-intervals", "--time-limit", "2", "--json")
    assert "best " not in quiet.stderr
    assert json.loads(quiet.stdout)["method"] == "cpsat-intervals"


def _invalid_plan(request):  # type: ignore[no-untyped-def]
    from planner.core.plan import PlanStatus, compute
    from planner.solvers.request import MethodResult

    return MethodResult(actions=[compute(request.graph.nodes[-1].id)], status=PlanStatus.feasible)


def test_refused_answer_exits_1_not_3(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from planner.cli.main import app
    from planner.engine import registry

    monkeypatch.setattr(registry, "_PLUGINS", {"broken": f"{__name__}:_invalid_plan"})
    write_json(tmp_path / "g.json", training_graph(4, seed=1))
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "g.json"), "--budget", "0.9",
                                      "--method", "broken"])
    assert result.exit_code == 1, result.output
    assert "solver error (broken/none)" in result.output
