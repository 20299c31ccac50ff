"""The layer rule of DESIGN.md holds: `lint-imports` keeps every contract in pyproject.toml, and
no module of the project sits outside the layers (a new module must be placed in one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layered_modules() -> set[str]:
    names: set[str] = set()
    for contract in _config()["contracts"]:
        for layer in contract.get("layers", []):
            for part in layer.replace("|", ":").split(":"):
                names.add(part.strip().strip("()"))
    return names


def test_every_module_has_a_layer() -> None:
    layered = _layered_modules()
    unplaced = []
    for package in ("planner", "solvers", "api", "runtime"):
        for path in sorted((ROOT / package).glob("*")):
            if path.name.startswith(("_", ".")) or path.name in ("examples", "device_profiles"):
                continue
            if path.suffix != ".py" and not (path / "__init__.py").exists():
                continue
            module = f"{package}.{path.stem}"
            if module not in layered and package not in layered:
                unplaced.append(module)
    assert not unplaced, f"modules outside every layer of pyproject.toml: {unplaced}"


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
