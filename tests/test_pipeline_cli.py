"""planner-cli partition / memory and POST /v1/partitions: outputs, exit codes, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from planner.cli import main as cli_main
from planner.cli import pipeline_cmds
from planner.core.io import load_plan, write_json
from planner.core.pipeline_actions import rank_actions_from_csv
from planner.service.errors import install_error_handlers
from planner.service.pipeline_routes import pipeline_router
from planner.sim.simulator import simulate
from planner.solvers.pipeline.chains import chain_graph, transformer_layers

GRAPH = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 2))  # tok, h.0..h.5, head


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    if not any(c.name == "partition" for c in cli_main.app.registered_commands):
        pipeline_cmds.register(cli_main.app)
    old = sys.argv
    sys.argv = ["planner-cli", *map(str, args)]
    try:
        cli_main.main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipe") / "graph.json"
    write_json(path, GRAPH)
    return path


def test_partition_writes_a_simulated_plan(capsys: pytest.CaptureFixture[str], graph_path: Path,
                                           tmp_path: Path) -> None:
    plan_path, csv_path, png = tmp_path / "plan.json", tmp_path / "p.csv", tmp_path / "grid.png"
    code, out, err = run(capsys, "partition", graph_path, "--devices", "4", "--device-memory",
                         "2GiB", "--microbatches", "8", "--schedule", "1f1b", "-o", plan_path,
                         "--csv", csv_path, "--plot", png)
    assert code == 0, err
    assert "peak / limit" in out and "step time (simulated)" in out
    plan = load_plan(plan_path)
    sim = simulate(GRAPH, plan)
    assert plan.predicted is not None and plan.predicted.makespan_ms == sim.makespan_ms
    assert max(sim.per_rank_peak_bytes) <= 2 * 2**30
    assert rank_actions_from_csv(csv_path.read_text()) == plan.rank_actions
    assert png.stat().st_size > 1000


def test_json_sweep_and_memory(capsys: pytest.CaptureFixture[str], graph_path: Path) -> None:
    code, out, err = run(capsys, "partition", graph_path, "--devices", "2", "--device-memory",
                         "4GiB", "--sweep", "--sweep-microbatches", "4,5",
                         "--sweep-schedules", "1f1b,interleaved-1f1b", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 4
    bad = [r for r in rows if r["schedule"] == "interleaved-1f1b" and r["microbatches"] == 5]
    assert bad and "multiple of 2" in bad[0]["note"]
    code, out, err = run(capsys, "memory", graph_path, "--zero", "2", "--dp", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    full = GRAPH.model_state.total()  # type: ignore[union-attr]
    assert data["per_device"]["gradients_bytes"] < full.gradients_bytes
    assert data["per_device"]["parameters_bytes"] == full.parameters_bytes  # ZeRO-2 keeps weights


@pytest.mark.parametrize("args,message", [
    (["--devices", "0"], "at least 1 device"),
    (["--devices", "20"], "more stages|layers"),
    (["--devices", "4", "--schedule", "interleaved-1f1b", "--microbatches", "6"], "multiple of 4"),
    (["--devices", "2", "--device-memory", "1MiB"], "below the model state"),
    (["--devices", "2", "--split", "h.9"], "no such layer"),
    (["--devices", "2", "--method", "magic"], "--method"),
    (["--devices", "2", "--device-memory", "80%"], "not a fraction"),
    (["--devices", "2", "--microbatches", "0"], "at least 1"),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], graph_path: Path,
                                      args: list[str], message: str) -> None:
    if "--microbatches" not in args:
        args = [*args, "--microbatches", "8"]
    code, out, err = run(capsys, "partition", graph_path, *args)
    assert code == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    import re
    assert re.search(message, err), err


def test_no_fit_names_the_rank_and_the_least_memory(capsys: pytest.CaptureFixture[str],
                                                     graph_path: Path) -> None:
    code, out, err = run(capsys, "partition", graph_path, "--devices", "2", "--device-memory",
                         "700MiB", "--microbatches", "8")
    assert code == 3, (out, err)
    assert "rank" in err and "over" in err and "least device memory" in err
    code, out, err = run(capsys, "partition", graph_path, "--devices", "2", "--device-memory",
                         "700MiB", "--microbatches", "8", "--method", "compute-balanced")
    assert code == 3 and "OVER" in out


def test_api_partitions() -> None:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(pipeline_router())
    client = TestClient(app)
    body = {"graph": GRAPH.model_dump(mode="json"), "devices": 2, "device_memory": "4GiB",
            "microbatches": 4, "schedule": "zb-h1", "method": "ilp", "time_limit": 5}
    r = client.post("/v1/partitions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["fits"] and data["plan"]["kind"] == "pipeline" and len(data["stages"]) == 2
    assert data["peak_bytes"] <= 4 * 2**30
    r = client.post("/v1/partitions", json={**body, "device_memory": "700MiB", "method": "dp"})
    assert r.status_code == 200 and not r.json()["fits"]
    assert r.json()["least_memory_bytes"] > 700 * 2**20
    r = client.post("/v1/partitions", json={**body, "devices": 0})
    assert r.status_code == 422 and "at least 1 device" in r.json()["error"]["message"]
    r = client.post("/v1/partitions", json={**body, "split": ["nope"]})
    assert r.status_code == 422 and "no such layer" in r.json()["error"]["message"]
