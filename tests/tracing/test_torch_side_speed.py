"""The torch side fast and talkative (issue 49 item 6): listing and validating commands import
no torch and no solver; a trace says its phases; `apply` uses the plan's recorded capture when
the model is the one the plan was traced from, and says why it captured again otherwise.

No wall-clock assertion: what is checked is what is imported and what is called."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("torch", "ortools", "pulp", "networkx", "numpy", "scipy", "planner.core.graph",
         "planner.sim.simulator", "planner.solvers.baselines", "planner.solvers.remat.exact")

_LISTING = """
import contextlib, io, json, sys
sys.argv = ["planner-cli", *json.loads(sys.argv[1])]
from planner.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main._main()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def _run_cli(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _LISTING, json.dumps(args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("args", [["methods"], ["methods", "--json"], ["--help"],
                                  ["--version"], ["trace", "--help"]])
def test_listing_commands_import_no_torch_and_no_solver(args: list[str]) -> None:
    result = _run_cli(args)
    assert result["code"] in (0, None)
    loaded = [m for m in HEAVY if m in result["modules"]]
    assert loaded == [], f"planner-cli {' '.join(args)} imported {loaded}"
    if args == ["methods", "--json"]:
        names = {m["name"] for m in json.loads(result["out"])}
        assert {"auto", "store-all", "rotor", "offload-greedy", "pipeline-dp", "sac"} <= names


def test_info_and_validate_import_no_torch_and_no_solver_code(tmp_path: Path) -> None:
    from planner.core.io import write_json
    from planner.core.synthetic import training_graph

    path = tmp_path / "g.json"
    write_json(path, training_graph(6))
    for args in (["info", str(path)], ["validate", str(path)]):
        result = _run_cli(args)
        assert result["code"] in (0, None), result
        loaded = [m for m in ("torch", "ortools", "pulp", "planner.solvers.remat.exact")
                  if m in result["modules"]]
        assert loaded == [], f"planner-cli {' '.join(args)} imported {loaded}"


def test_constants_said_twice_for_light_specs_agree() -> None:
    """The specs' modules name these without importing the solvers that define them."""
    from planner.solvers.chain import linearize
    from planner.solvers.chain import methods as chain_methods
    from planner.solvers.offload import heuristics, options
    from planner.solvers.pipeline import baselines
    from planner.solvers.pipeline import methods as pipeline_methods

    assert options.DEFAULT_MIN_BYTES == heuristics.DEFAULT_MIN_BYTES
    assert chain_methods.MAX_SEGMENTS == linearize.MAX_SEGMENTS
    assert tuple(pipeline_methods._BASELINE_SUMMARIES) == baselines.BASELINES


# -- tracing ------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")

from runtime_helpers import eager_step, planned_step  # noqa: E402

from planner import zoo  # noqa: E402
from planner.tracing.api import trace  # noqa: E402


def _tiny() -> tuple[Any, tuple[Any, ...]]:
    return zoo.gpt(batch_size=2, context=8, dim=16, layers=1, vocab=32, dropout=0.2)  # type: ignore[no-any-return]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "captures"
    monkeypatch.setenv("PLANNER_TRACE_CACHE", str(folder))
    return folder


@pytest.fixture
def captures(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts op-level captures (dynamo + AOTAutograd) through their one seam."""
    import planner.tracing.capture as capture

    calls: list[int] = []
    real = capture.capture_joint

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capture, "capture_joint", counting)
    return calls


def test_trace_reports_its_phases(store: Path) -> None:
    model, inputs = _tiny()
    heard: list[tuple[str, int, int]] = []
    trace(model, inputs, progress=lambda stage, done, total: heard.append((stage, done, total)))
    stages = [s for s, _, _ in heard]
    expected = ["capture: importing dynamo", "capture: forward (dynamo)",
                "capture: backward (AOTAutograd",
                "capture: joint forward+backward graph", "capture: keeping it",
                "op graph: records of", "costs: roofline estimate", "workspace:",
                "op graph: fusing"]
    positions = []
    for phase in expected:
        found = [i for i, s in enumerate(stages) if s.startswith(phase)]
        assert found, f"no phase {phase!r} in {stages}"
        positions.append(found[0])
    assert positions == sorted(positions), stages
    counted = [(d, t) for s, d, t in heard if s.startswith("costs:")]
    assert counted[-1][0] == counted[-1][1] > 0  # the estimate counts its ops up to all of them


def test_trace_measure_reports_each_timed_run(store: Path) -> None:
    model, inputs = _tiny()
    heard: list[tuple[str, int, int]] = []
    trace(model, inputs, costs="measure", repeats=2, warmup=1,
          progress=lambda stage, done, total: heard.append((stage, done, total)))
    runs = [(d, t) for s, d, t in heard if s.startswith("timing ")]
    assert runs[0] == (0, 3) and runs[-1] == (3, 3)


def test_a_recorded_capture_gives_the_same_trace(store: Path, captures: list[int]) -> None:
    model, inputs = _tiny()
    fresh = trace(model, inputs, dropout_masks="graph")
    assert captures == [1] and fresh.details["capture_source"] == "captured"
    assert list(store.glob("*.capture"))
    fingerprint = fresh.graph.trace_options["fingerprint"]
    again = trace(model, inputs, dropout_masks="graph", reuse_capture=fingerprint)
    assert captures == [1], "a matching recorded capture must not be captured again"
    assert again.details["capture_source"] == "recorded"
    assert again.graph.content_hash() == fresh.graph.content_hash()
    assert again.graph.trace_options == fresh.graph.trace_options
    for field in ("node_fx_names", "owner_fx_names", "primal_kinds", "primal_names",
                  "tangent_fx_names", "loss_fx_name", "gradient_fx_names"):
        assert getattr(again, field) == getattr(fresh, field), field

    def fx(result: Any) -> list[tuple[str, str, str, str]]:
        return [(n.name, n.op, str(n.target), str(n.args)) for n in result.joint.graph.nodes]

    assert fx(again) == fx(fresh)


def test_a_changed_model_is_captured_again_with_the_reason(store: Path,
                                                           captures: list[int]) -> None:
    model, inputs = _tiny()
    fingerprint = trace(model, inputs).graph.trace_options["fingerprint"]
    other, other_inputs = zoo.gpt(batch_size=2, context=8, dim=24, layers=1, vocab=32,
                                  dropout=0.2)
    result = trace(other, other_inputs, reuse_capture=fingerprint)
    assert captures == [1, 1] and result.details["capture_source"] == "captured"
    note = result.details["capture_note"]
    assert "differs" in note and "parameter" in note and "[24" in note, note


# -- apply --------------------------------------------------------------------------------------
def _plan_for(graph: Any) -> Any:
    from planner.engine.solve import solve

    return solve(graph, 10**15, "chen-sqrt", time_limit_s=10.0)


def test_apply_uses_the_recorded_capture_of_the_same_model(store: Path, captures: list[int],
                                                           tmp_path: Path) -> None:
    from planner.core.io import write_json
    from planner.runtime import apply

    model, inputs = _tiny()
    traced = trace(model, inputs)  # the CLI's default: eager-sized masks
    plan = _plan_for(traced.graph)
    assert plan.trace_options["fingerprint"] == traced.graph.trace_options["fingerprint"]
    write_json(tmp_path / "plan.json", plan)
    assert captures == [1]
    twin, twin_inputs = _tiny()  # another process's model: same code, sizes and seed
    planned = apply(twin, tmp_path / "plan.json", twin_inputs)
    assert captures == [1], "apply captured the model although the plan's capture is kept"
    reference, ref_inputs = _tiny()
    loss, grads = planned_step(planned, twin_inputs, seed=3)
    expected, expected_grads = eager_step(reference, ref_inputs, seed=3)
    assert torch.equal(loss, expected)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name


def test_apply_without_a_kept_capture_captures_and_says_why(
        store: Path, captures: list[int], caplog: pytest.LogCaptureFixture) -> None:
    from planner.runtime import apply

    model, inputs = _tiny()
    plan = _plan_for(trace(model, inputs).graph)
    for path in store.glob("*.capture"):
        path.unlink()  # as on another machine
    with caplog.at_level(logging.INFO, logger="planner.runtime"):
        apply(model, plan, inputs)
    assert captures == [1, 1]
    assert any("captured the model again" in r.getMessage() and "no capture of this model"
               in r.getMessage() for r in caplog.records), caplog.text


def test_the_store_can_be_turned_off(monkeypatch: pytest.MonkeyPatch,
                                     captures: list[int]) -> None:
    monkeypatch.setenv("PLANNER_TRACE_CACHE", "off")
    model, inputs = _tiny()
    first = trace(model, inputs)
    second = trace(model, inputs, reuse_capture=True)
    assert captures == [1, 1]
    assert "off" in second.details["capture_note"]
    assert first.graph.content_hash() == second.graph.content_hash()


def test_a_recorded_capture_under_autocast_gives_the_same_trace(store: Path,
                                                                captures: list[int]) -> None:
    model, inputs = _tiny()
    fresh = trace(model, inputs, autocast="bf16")
    again = trace(model, inputs, autocast="bf16", reuse_capture=True)
    assert captures == [1] and again.details["capture_source"] == "recorded"
    assert again.graph.content_hash() == fresh.graph.content_hash()


def test_a_store_file_runs_no_code(store: Path, tmp_path: Path) -> None:
    """A crafted file in the store is refused, not executed: the store reads plain data."""
    import pickle

    from planner.tracing import capture_store

    marker = tmp_path / "ran"

    class Crafted:
        def __reduce__(self) -> Any:
            return (Path.touch, (marker,))

    path = capture_store.capture_path("sha256:" + "0" * 64)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"format": capture_store.FORMAT,
                                   "fingerprint": "sha256:" + "0" * 64, "x": Crafted()}))
    assert capture_store.load("sha256:" + "0" * 64) is None
    assert capture_store.recorded_parts("sha256:" + "0" * 64) is None
    assert not marker.exists()
