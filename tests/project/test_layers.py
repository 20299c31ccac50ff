"""The layer rule of DESIGN.md holds: `lint-imports` keeps every contract in pyproject.toml (its
layers contract is exhaustive: a folder of planner/ in no layer breaks it), and installed, the
project is the one import package `planner`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _layers_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["type"] == "layers")


def test_every_folder_is_a_layer() -> None:
    """The contract names its containers' layers exhaustively, so lint-imports places a new
    folder; each layer named is a folder (or module) of planner/ that exists."""
    contract = _layers_contract()
    assert contract["containers"] == ["planner"] and contract["exhaustive"] is True
    named = {part.strip() for layer in contract["layers"] for part in layer.split(":")}
    for name in named:
        assert (ROOT / "planner" / name / "__init__.py").exists() or (
            ROOT / "planner" / f"{name}.py"
        ).exists(), f"layer {name} is not a folder of planner/"
    folders = {p.name for p in (ROOT / "planner").iterdir() if (p / "__init__.py").exists()}
    assert folders <= named, f"folders of planner/ in no layer: {sorted(folders - named)}"


def test_one_top_level_import_package(tmp_path: Path) -> None:
    """From outside the repository the virtualenv finds `planner` and its layers, and no
    top-level `api`, `runtime` or `solvers` that would shadow a user's own packages."""
    code = (
        "import importlib.util as u, json\n"
        "names = ['api', 'runtime', 'solvers', 'planner', 'planner.solvers', 'planner.api',"
        " 'planner.runtime', 'planner.sim', 'planner.core']\n"
        "print(json.dumps({n: u.find_spec(n) is not None for n in names}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found == {"api": False, "runtime": False, "solvers": False, "planner": True,
                     "planner.solvers": True, "planner.api": True, "planner.runtime": True,
                     "planner.sim": True, "planner.core": True}


def test_lint_imports_keeps_every_contract() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    command = [str(exe) if exe.exists() else shutil.which("lint-imports") or "lint-imports",
               "--no-cache"]
    if not exe.exists() and shutil.which("lint-imports") is None:
        pytest.fail("lint-imports is not installed: scripts/setup installs import-linter")
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_service_sweep_uses_the_engine_rule() -> None:
    """A larger budget never reports a worse plan than a smaller one (CLI and service alike)."""
    from planner.engine.sweep import monotone, record_from_summary

    def summary(overhead_pct: float) -> dict[str, object]:
        cost = 100 * (1 + overhead_pct / 100)
        return {"status": "feasible", "peak_bytes": 10, "overhead_percent": overhead_pct,
                "compute_cost": cost, "lower_bound": 100.0, "wall_seconds": 1.0}

    reports = {100: summary(5.0), 200: summary(9.0), 300: summary(1.0)}
    points = monotone([(None, b) for b in reports],
                      {b: record_from_summary(s, b) for b, s in reports.items()})
    overheads = [p.overhead for p in points]
    assert overheads == pytest.approx([0.05, 0.05, 0.01])
    assert [p.source_budget_bytes for p in points] == [100, 100, 300]
    assert record_from_summary(None, 5)["status"] == "queued"
