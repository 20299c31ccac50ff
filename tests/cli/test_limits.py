"""Time limits: one validation (planner.core.limits) for every CLI command and the API; `inf`,
`nan`, 0 and absurd values are one line and exit 2, never a traceback (issue 13, item 10)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from planner.cli.main import main
from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.limits import MAX_TIME_LIMIT_S, check_time_limit
from planner.core.synthetic import training_graph


@pytest.mark.parametrize(("value", "expected"), [
    (30, 30.0), (0.5, 0.5), ("20", 20.0), ("1e-3", 0.001), (MAX_TIME_LIMIT_S, MAX_TIME_LIMIT_S),
])
def test_good_time_limits(value: object, expected: float) -> None:
    assert check_time_limit(value) == expected


@pytest.mark.parametrize(("value", "fragment"), [
    (math.inf, "finite"), (-math.inf, "finite"), (math.nan, "finite"), ("inf", "finite"),
    ("nan", "finite"), ("1e400", "finite"), (0, "more than 0"), (0.0, "more than 0"),
    (-1, "more than 0"), (MAX_TIME_LIMIT_S + 1, "largest time limit"), ("soon", "seconds"),
    (True, "seconds"), (None, "seconds"), ([30], "seconds"),
])
def test_bad_time_limits_are_one_line(value: object, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        check_time_limit(value, "time_limit")
    message = str(info.value)
    assert message.startswith("time_limit: ") and fragment in message and "\n" not in message


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "graph.json"
    write_json(path, training_graph(6, skip=2, seed=1))
    return path


def _in_process(args: list[str], capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """planner-cli's main() in this process (fast): (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["planner-cli", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


COMMANDS = {
    "solve": ["solve", "{g}", "--budget", "0.9", "-m", "store-all"],
    "demo": ["demo", "-m", "store-all"],
    "min-budget": ["min-budget", "{g}"],
    "sweep": ["sweep", "{g}", "--budgets", "0.9", "-m", "store-all"],
    "submit": ["submit", "{g}", "--budget", "0.9", "--server", "http://127.0.0.1:9"],
}


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-2", "1e400", "100000"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_bad_time_limits(
    command: str, value: str, graph_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = [a.format(g=graph_path) for a in COMMANDS[command]] + ["--time-limit", value]
    code, err = _in_process(args, capsys, monkeypatch)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --time-limit: "), err


def test_inf_is_one_line_as_a_user_runs_it(graph_path: Path) -> None:
    # Before: an OverflowError traceback from the MILP back-end.
    r = run_cli("solve", graph_path, "--budget", "0.5", "--method", "milp", "--time-limit", "inf")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (
        "error: --time-limit: inf: must be a finite number of seconds (at most 86400, one day)"
    )
