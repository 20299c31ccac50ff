"""The CLI against the hostile inputs of issue 50, item 10: each is one line and exit 2, said
before any work, never a traceback, a hang, a `.tmp` left behind or a replaced device node."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult

from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.out_files import write_text
from planner.core.synthetic import training_graph

GRAPH = training_graph(8, skip=2, seed=3)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write_json(tmp_path / "g.json", GRAPH)
    return tmp_path


def _one_line_error(r: CliResult, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(("args", "needles"), [
    (("simulate", "g.json", "g.json", "--plot", "t.xyz"), ("t.xyz", "cannot draw")),
    (("sweep", "g.json", "--budgets", "0.5,0.8", "--png", "/nonexistent/p.png"),
     ("/nonexistent/p.png", "no such folder")),
    (("sweep", "g.json", "--budgets", "0.3:1.0:0.0000007"), ("1000001 budgets", "at most")),
    (("sweep", "g.json", "--budgets", "0.5", "--csv", "missing/t.csv"), ("no such folder",)),
    (("solve", "g.json", "-b", "0.8", "-o", "missing/p.json"), ("missing/p.json",)),
    (("partition", "g.json", "--devices", "2", "--microbatches", "1000000000",
      "--device-memory", "1GiB"), ("--microbatches", "at most 4096")),
    (("trace", "planner.zoo:gpt", "--arg", "layers=-1", "-o", "neg.json"),
     ("layers=-1", "give 0 or more")),
])
def test_bad_paths_and_sizes_are_one_line_before_any_work(
        cli: Callable[..., CliResult], files: Path, args: tuple[str, ...],
        needles: tuple[str, ...]) -> None:
    _one_line_error(cli(*args, cwd=files, timeout=120), *needles)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux device files")
def test_devices_are_not_json_files_nor_replaced(cli: Callable[..., CliResult],
                                                 files: Path) -> None:
    _one_line_error(cli("info", "/dev/zero", timeout=60), "/dev/zero", "not a regular file")
    _one_line_error(cli("info", "/dev/urandom", timeout=60), "not a regular file")
    r = cli("solve", "g.json", "-b", "0.9", "--time-limit", "2", "-o", "/dev/full", cwd=files)
    _one_line_error(r, "/dev/full", "No space left")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device, not a plan file


def test_a_factory_that_raises_is_one_line(cli: Callable[..., CliResult], files: Path) -> None:
    (files / "badfactory.py").write_text("def model():\n    raise ValueError('no such size')\n")
    r = cli("trace", "badfactory:model", "-o", "x.json", cwd=files,
            env={"PYTHONPATH": str(files)})
    _one_line_error(r, "the factory raised ValueError: no such size")


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)  # the disk fills at the rename
    with pytest.raises(InputError, match="No space left"):
        write_text(tmp_path / "plan.json", "{}")
    assert list(tmp_path.iterdir()) == []


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_sweep_leaves_no_workers(files: Path) -> None:
    import signal
    import subprocess
    import time

    sweep = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", "sweep", "g.json", "--budgets",
         "0.5,0.6,0.7,0.8", "--time-limit", "300", "--jobs", "2"],
        cwd=files, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        workers = _children(sweep.pid)
    assert len(workers) >= 2, "the sweep's workers never started"
    time.sleep(1.0)  # the workers are solving
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    deadline = time.monotonic() + 60  # a hang guard: they end within seconds
    while any(Path(f"/proc/{w}").exists() and "Z" not in _state(w) for w in workers):
        assert time.monotonic() < deadline, "the workers outlived the killed sweep"
        time.sleep(0.2)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
