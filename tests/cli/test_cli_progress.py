"""Long commands say they are working (issue 27, item 5): `solve` shows the incumbent and bound
as they improve with the elapsed time against its limit, `min-budget` and `sweep` are no longer
silent; on a terminal a live line, otherwise plain lines on stderr (at once, on each change at
most once a second, and every few seconds while nothing changes), so stdout and --json stay
clean."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from conftest import run_cli
from rich.console import Console

from planner.cli import progress_view
from planner.cli.progress_view import (
    EVERY_ENV,
    describe,
    heartbeat_s,
    solve_progress,
    work_status,
)
from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.synthetic import training_graph

EVERY = {EVERY_ENV: "0.5"}  # plain lines every half second (default 5 s)


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("progress") / "g.json"
    write_json(path, training_graph(24, skip=3, seed=5))
    return path


def test_describe_overheads() -> None:
    assert describe(110.0, 100.0, 100.0) == "best +10.000 % · bound +0.000 %"
    assert describe(None, None, 100.0) == "best - · bound -"


def test_solve_prints_progress_lines_on_stderr(graph_path: Path) -> None:
    r = run_cli("solve", graph_path, "--budget", "0.7", "--method", "cpsat-intervals",
                "--time-limit", "4", env=EVERY)
    assert r.returncode in (0, 3), r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("cpsat-intervals: ")]
    found = [ln for ln in lines if re.match(r"cpsat-intervals: \d+\.\d s of 4 s · best ", ln)]
    assert found and "bound +" in found[-1], r.stderr
    quiet = run_cli("solve", graph_path, "--budget", "1.0", "--method", "store-all",
                    "--time-limit", "2", "--json", env=EVERY)
    assert "best " not in quiet.stderr and "store-all:" not in quiet.stderr
    assert json.loads(quiet.stdout)["method"] == "store-all"


def test_min_budget_and_sweep_are_not_silent(graph_path: Path) -> None:
    r = run_cli("min-budget", graph_path, "--time-limit", "2", env=EVERY)
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert re.fullmatch(r"min-budget: \d\.\d s of 2 s · searching between [\d.]+ MiB \(lower "
                        r"bound\) and [\d.]+ MiB \(store-all\)", first), r.stderr
    assert "min-budget:" not in r.stdout
    r = run_cli("sweep", graph_path, "--budgets", "0.5,0.6", "--method", "cpsat-intervals",
                "--jobs", "1", "--time-limit", "1", env=EVERY)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sweep: ")]
    assert lines, r.stderr
    assert re.fullmatch(r"sweep: [\d.]+ s · [0-2]/2 budgets done \(1 s each, 1 at a time\)",
                        lines[0]), r.stderr
    assert lines[-1].endswith("· 2/2 budgets done (1 s each, 1 at a time)"), r.stderr
    assert "sweep:" not in r.stdout


def test_quick_commands_print_no_progress(graph_path: Path) -> None:
    """Done within the heartbeat, nothing on stderr: an error stays its one line there."""
    r = run_cli("sweep", graph_path, "--budgets", "0.3,1.0", "--method", "store-all",
                "--jobs", "1", "--time-limit", "5")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_the_heartbeat_is_a_number_of_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert heartbeat_s() == 5.0
    monkeypatch.setenv(EVERY_ENV, "0.25")
    assert heartbeat_s() == 0.25
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(EVERY_ENV, bad)
        with pytest.raises(InputError, match=EVERY_ENV):
            heartbeat_s()


def test_plain_lines_keep_coming_while_nothing_changes(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with work_status("probe", limit_s=9, detail="waiting", every_s=0.2) as status:
        time.sleep(1.5)  # the ticker wakes every 0.2 s here
        status.update("changed")
    lines = capsys.readouterr().err.splitlines()
    # the ticker's 0.2 s is stretched on a loaded machine: lines come, not their exact times
    assert re.fullmatch(r"probe: \d+\.\d s of 9 s · waiting", lines[0]), lines
    assert len([ln for ln in lines if ln.endswith("· waiting")]) >= 2, lines
    elapsed = [float(ln.split()[1]) for ln in lines]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 1.4
    assert lines[-1].endswith("s of 9 s · changed")
    with work_status("probe", quiet=True, every_s=0.1):
        time.sleep(0.3)
    assert capsys.readouterr().err == ""


def test_a_terminal_shows_elapsed_time_against_the_limit(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100, color_system=None)
    monkeypatch.setattr(progress_view, "progress_console", terminal)
    with solve_progress(100.0, quiet=False, label="auto", time_limit_s=60) as report:
        assert report is not None
        time.sleep(0.6)
        report(112.5, 101.0)
        time.sleep(0.6)
    drawn = screen.getvalue()
    assert re.search(r"auto: 0\.[3-9] s of 60 s · no plan yet", drawn), drawn
    assert re.search(r"auto: 1\.\d s of 60 s · best \+12\.500 % · bound \+1\.000 %", drawn), drawn


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
