"""planner-cli with the machine named (`--resources`), the resources schema and the model-state
breakdown of `info`, as a user runs them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult, run_cli

from planner.core.io import load_plan, write_json
from planner.core.model_state import ModelState, ParameterState
from planner.core.resources import resources_preset
from planner.core.synthetic import training_graph

Cli = Callable[..., CliResult]
GRAPH = training_graph(8, skip=2, seed=7, fixed_bytes=4096)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-resources")
    write_json(root / "graph.json", GRAPH)
    write_json(root / "machine.json", {"preset": "a100-80g", "host_memory_bytes": 2**34})
    return root


def test_solve_on_a_preset_records_the_machine(work: Path) -> None:
    out = work / "plan.json"
    r = run_cli("solve", work / "graph.json", "--budget", "0.9", "--method", "best-baseline",
                "--resources", "h100-pcie-gen5", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["resources"] == resources_preset("h100-pcie-gen5").model_dump(mode="json")
    plan = load_plan(out)
    assert plan.schema_version == "2" and plan.resources == resources_preset("h100-pcie-gen5")


def test_resources_file_and_its_device_memory_as_budget(work: Path) -> None:
    big = {"device_memory_bytes": 10**12, "device_name": "big"}
    write_json(work / "big.json", big)
    r = run_cli("solve", work / "graph.json", "--method", "store-all",
                "--resources", work / "big.json", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["budget_bytes"] == 10**12
    r = run_cli("validate", work / "graph.json", "--resources", work / "machine.json", "--json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--budget", "0.9", "--resources", "tpu-v9"], "--resources: preset 'tpu-v9'"),
        ([], "--budget: missing"),
        (["--resources", "nothing.json"], "nothing.json: no such file"),
    ],
)
def test_bad_resources_one_line(work: Path, args: list[str], needle: str) -> None:
    r = run_cli("solve", work / "graph.json", *args, cwd=work)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_link_in_a_file(work: Path) -> None:
    write_json(work / "bad.json", {"device_memory_bytes": 10**9,
                                   "h2d": {"bandwidth_bytes_per_s": -1}})
    r = run_cli("solve", work / "graph.json", "--resources", work / "bad.json")
    assert r.returncode == 2 and "h2d" in r.stderr and "Traceback" not in r.stderr


def test_schema_resources() -> None:
    r = run_cli("schema", "resources")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert {"device_memory_bytes", "h2d", "d2h", "host_memory_bytes"} <= set(schema["properties"])


def test_info_shows_the_model_state_breakdown(tmp_path: Path) -> None:
    grads = [n.id for n in GRAPH.nodes if n.phase.value == "backward"][:2]
    state = ModelState(
        parameters=[
            ParameterState(name="a.weight", module_path="a", bytes=4000, gradient_node=grads[0]),
            ParameterState(name="b.weight", module_path="b", bytes=2000, gradient_node=grads[1]),
        ],
        optimizer="adam",
        gradient_lifetime="backward",
    )
    graph = GRAPH.model_copy(update={"model_state": state, "fixed": GRAPH.fixed.model_copy(
        update={"parameters_bytes": 0, "other_bytes": 0})})
    write_json(tmp_path / "g.json", graph)
    r = run_cli("info", tmp_path / "g.json", "--json")
    assert r.returncode == 0, r.stderr
    ms = json.loads(r.stdout)["model_state"]
    assert ms["source"] == "model_state" and ms["optimizer"] == "adam"
    assert ms["parameters_bytes"] == 6000 and ms["optimizer_bytes"] == 2 * 6000
    assert ms["gradients_held_from_backward_bytes"] == 6000
    assert ms["per_module"] == {"a": 4000 * 4, "b": 2000 * 4}
    text = run_cli("info", tmp_path / "g.json")
    assert text.returncode == 0 and "model state" in text.stdout
