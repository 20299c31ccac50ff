"""`planner-cli solve` shows the incumbent and bound as they improve (plain lines when stdout is
not a terminal), and keeps --json output clean."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

from planner.cli.progress_view import describe
from planner.io import write_json
from planner.synthetic import training_graph


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
