"""Shared fixtures: small hand-built graphs, the shared benchmark folder, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Inductor's C++ builder imports setuptools, whose distutils shim asserts that `distutils` is its
# own copy; after another test has loaded the standard library's (Python 3.11 still has it), the
# compile tests failed in the whole suite only. The standard library's serves inductor as well.
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

# The capture store (planner.tracing.capture_store) of this run only: a capture kept by an earlier
# run (older code, a user's models) is never what a test reuses; each worker has its own.
if "PLANNER_TRACE_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _captures = tempfile.mkdtemp(prefix="planner-captures-")
    os.environ["PLANNER_TRACE_CACHE"] = _captures
    atexit.register(shutil.rmtree, _captures, True)

from planner.core.graph import Edge, FixedMemory, Graph, Node

REPO_ROOT = Path(__file__).resolve().parents[1]
# ../shared next to the repository: benchmark graphs that a user's clone does not have.
SHARED_DIR = REPO_ROOT.parent / "shared"
CHECKMATE_DIR = SHARED_DIR / "graphs" / "checkmate"


def make_graph(
    sizes: dict[int, int],
    edges: list[tuple[int, int]],
    *,
    costs: dict[int, float] | None = None,
    fixed_bytes: int = 0,
    **node_fields: dict[int, Any],
) -> Graph:
    """A graph from {id: output_bytes} and edge pairs; extra per-node fields as {id: value}."""
    nodes = []
    for node_id, size in sizes.items():
        extra = {k: v[node_id] for k, v in node_fields.items() if node_id in v}
        cost = (costs or {}).get(node_id, 1.0)
        nodes.append(
            Node(id=node_id, name=f"n{node_id}", compute_ms=cost, output_bytes=size, **extra)
        )
    return Graph(
        nodes=nodes,
        edges=[Edge(source=u, target=v) for u, v in edges],
        fixed=FixedMemory(other_bytes=fixed_bytes),
    )


@pytest.fixture
def chain3() -> Graph:
    """0 -> 1 -> 2 with 10/20/30 bytes, node 1 needs 50 bytes of workspace, 100 fixed."""
    return make_graph(
        {0: 10, 1: 20, 2: 30},
        [(0, 1), (1, 2)],
        costs={0: 1.0, 1: 2.0, 2: 3.0},
        fixed_bytes=100,
        workspace_bytes={1: 50},
    )


@pytest.fixture
def shared_checkmate_dir() -> Path:
    if not CHECKMATE_DIR.is_dir():
        pytest.skip(f"{CHECKMATE_DIR} is absent (benchmark graphs are not part of the repository)")
    return CHECKMATE_DIR


@pytest.fixture(autouse=True)
def _plugins_stay_in_their_test() -> Iterator[None]:
    """Whatever a test registers (an in-process app's `extra_methods`, `plugin_methods`) is
    gone after it, so no later test's `method_names()` lists it."""
    from planner.engine import registry

    before = dict(registry._PLUGINS)
    yield
    registry._PLUGINS.clear()
    registry._PLUGINS.update(before)


@contextmanager
def plugin_methods(**targets: str) -> Iterator[None]:
    """Plugin methods (name with '_' for '-' -> "module:function") registered for the block
    only: a plugin that outlived its test would join other tests' lists of methods (a test
    parametrised over `method_names()` at collection time ran 12 cases for one)."""
    from planner.engine import registry

    names = {name.replace("_", "-"): target for name, target in targets.items()}
    before = {name: registry._PLUGINS.get(name) for name in names}
    for name, target in names.items():
        registry.register_method(name, target)
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                registry._PLUGINS.pop(name, None)
            else:
                registry._PLUGINS[name] = old


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str | Path, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> CliResult:
    """planner-cli in a subprocess, as a user runs it (stdout and stderr are pipes); `env`
    adds to or overrides the environment (COLUMNS=80: a narrow terminal's pipe)."""
    env = {**os.environ, "MPLBACKEND": "Agg", "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    return run_cli
