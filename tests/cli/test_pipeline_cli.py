"""planner-cli partition / memory and POST /v1/partitions: outputs, exit codes, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServerProcess, running_server, wait_finished
from cli_run import run

from planner.core.io import load_plan, write_json
from planner.core.pipeline_actions import rank_actions_from_csv
from planner.sim.simulator import simulate
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.pipeline.schedules import SCHEDULES

GRAPH = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 2))  # tok, h.0..h.5, head


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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("partitions-api")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000, max_time_limit_s=30) as srv:
        yield srv


@pytest.mark.slow
def test_api_partitions_is_the_plans_route(server: ServerProcess) -> None:
    """POST /v1/partitions is a plan job like POST /v1/plans (method pipeline-<method>, the
    machine as resources), answered with the plan when it is done; bad input is a 422 naming
    the body's own field, at submission."""
    body = {"graph": GRAPH.model_dump(mode="json"), "devices": 2, "device_memory": "4GiB",
            "microbatches": 4, "schedule": "zb-h1", "method": "ilp", "time_limit": 5}
    with server.client() as c:
        r = c.post("/v1/partitions", json=body)
        assert r.status_code in (200, 202), r.text
        job = wait_finished(c, r.json()["id"])
        assert job["method"] == "pipeline-ilp" and job["status"] == "done", job
        plan = job["plan"]
        assert plan["kind"] == "pipeline" and len(plan["partition"]["stages"]) == 2
        assert plan["status"] in ("optimal", "feasible")
        assert max(plan["predicted"]["per_rank_peak_bytes"]) <= 4 * 2**30
        assert job["resources"]["device_count"] == 2
        same = c.post("/v1/plans?wait=30", json={
            "graph": body["graph"], "budget": "4GiB", "method": "pipeline-ilp", "time_limit": 5,
            "options": {"chunks": 2},
            "resources": {"device_count": 2, "microbatches": 4, "pipeline_schedule": "zb-h1"}})
        assert same.status_code == 200 and same.json()["id"] == job["id"]  # one question
        r = c.post("/v1/partitions?wait=30", json={**body, "device_memory": "700MiB",
                                                   "method": "dp"})
        assert r.status_code == 200, r.text
        tight = r.json()["plan"]
        assert tight["status"] == "infeasible"
        assert tight["details"]["smallest_feasible_bytes"] > 700 * 2**20
        r = c.post("/v1/partitions", json={**body, "devices": 0})
        assert r.status_code == 422 and "devices" in r.json()["error"]["message"]
        r = c.post("/v1/partitions", json={**body, "split": ["nope"]})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert message.startswith("split:") and "no such layer" in message
        # schedule auto: every schedule planned and simulated, the fastest kept and listed
        r = c.post("/v1/partitions?wait=30", json={**body, "schedule": "auto", "method": "dp"})
        assert r.status_code == 200, r.text
        chosen = r.json()["plan"]
        rows = chosen["details"]["choice"]
        assert {row["schedule"] for row in rows} == set(SCHEDULES)
        fastest = min(row["step_ms"] for row in rows if row["fits"])
        assert chosen["predicted"]["makespan_ms"] == pytest.approx(fastest)
        r = c.post("/v1/partitions", json={**body, "schedule": "auto", "split": ["h.3"]})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"].startswith("schedule:"), r.text


def test_a_whole_job_plan_shows_its_selective_checkpoints(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`--method whole` on an op-level trace below the plain least memory: the table names the
    modules (and submodules) recomputed, selectively or not, and the micro-batches of a second
    unit plan, and plan.json carries them."""
    from models import tiny_gpt

    from planner.engine.partition import make_problem
    from planner.solvers.pipeline.dp import least_memory_split
    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    graph = trace(model, inputs).graph
    path, plan_path = tmp_path / "gpt.json", tmp_path / "plan.json"
    write_json(path, graph)
    least = least_memory_split(make_problem(graph, devices=2, memory_bytes=None,
                                            microbatches=4, schedule="1f1b"))[0]
    # 0.88: the plain least credits what a stage's backward frees as it runs, and each
    # checkpoint's RNG state is charged on a CPU run (at 0.8-0.85 of it the fastest fitting
    # plans recompute whole modules only)
    code, out, err = run(capsys, "partition", path, "--devices", "2", "--device-memory",
                         str(int(0.88 * least)), "--microbatches", "4", "--method", "whole",
                         "--time-limit", "5", "-o", plan_path)
    assert code == 0, err
    assert "selective" in out, out
    plan = load_plan(plan_path)
    assert plan.partition is not None
    assert any(ops for s in plan.partition.stages for ops in s.unit_saved_ops.values())
    # submodules recomputed alone ('h.1.mlp': the rest of h.1 keeps its activations)
    inner = [u for s in plan.partition.stages for u in s.unit_policies if u not in s.modules]
    assert inner and all(u in out for u in inner), (inner, out)
    # stage 0 holds 2 micro-batches at once: it recomputes more in every other one only
    mixed = [s for s in plan.partition.stages if s.variants]
    assert mixed and mixed[0].variants[0].microbatches == [0, 2]
    assert "in mb 0,2:" in out, out
