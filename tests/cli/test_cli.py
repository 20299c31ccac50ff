"""planner-cli end to end, in a subprocess as a user runs it: outputs, files, exit codes."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CliResult, run_cli

from planner.core.io import load_plan, write_json
from planner.core.plan import Plan, PlanStatus, actions_from_text
from planner.core.synthetic import training_graph
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import BASELINES, store_all_peak_bytes

Cli = Callable[..., CliResult]
GRAPH = training_graph(8, skip=2, seed=7, fixed_bytes=4096)
BASELINE = "best-baseline"  # needs no solver: fast and deterministic


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graph.json and a plan.json solved for it, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("cli")
    write_json(root / "graph.json", GRAPH)
    result = run_cli("solve", root / "graph.json", "--budget", "0.7", "-m", BASELINE,
                     "-o", root / "plan.json")
    assert result.returncode == 0, result.stderr
    return root


def ok_json(result: CliResult) -> Any:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def bad_input(result: CliResult, *fragments: str) -> str:
    """Exit 2 with exactly one line on stderr, no traceback, naming what is wrong."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip("\n").split("\n")
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- commands that succeed ----------------------------------------------------------------------


@pytest.mark.parametrize(("which", "key"), [("graph", "nodes"), ("plan", "actions")])
def test_schema(cli: Cli, which: str, key: str) -> None:
    schema = ok_json(cli("schema", which))
    assert key in schema["properties"]
    version = schema["properties"]["schema_version"]
    # graph.json is at version 1; plan.json writes version 2 and still reads version 1
    expected = ["1"] if which == "graph" else ["1", "2"]
    assert version.get("enum", [version.get("const")]) == expected
    if which == "plan":
        assert version["default"] == "2"


def test_import_checkmate(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "tiny_train.json"
    src.write_text(json.dumps({
        "directed": True, "multigraph": False, "graph": {"name": "tiny"},
        "nodes": [
            {"name": "a", "backward": False, "cost_cpu": 1, "cost_ram": 10, "id": 4},
            {"name": "Loss", "backward": True, "cost_cpu": 0, "cost_ram": 1, "id": 2},
            {"name": "a_grad", "backward": True, "cost_cpu": 2, "cost_ram": 10, "id": 9},
        ],
        "links": [{"source": 4, "target": 2}, {"source": 2, "target": 9},
                  {"source": 4, "target": 9}],
    }))
    out = tmp_path / "graph.json"
    summary = ok_json(cli("import-checkmate", src, "-o", out, "--json"))
    assert summary["nodes"] == 3 and summary["edges"] == 3
    info = ok_json(cli("info", out, "--json"))
    assert info["hash"] == summary["hash"]
    assert info["store_all_peak_bytes"] == 21  # C9 with 4, 2 resident: 10 + 1 + 10
    # Plain output for people.
    result = cli("import-checkmate", src, "-o", out)
    assert result.returncode == 0 and "3 nodes" in result.stdout


def test_info_json(cli: Cli, work: Path) -> None:
    info = ok_json(cli("info", work / "graph.json", "--json"))
    assert info["nodes"] == len(GRAPH.nodes)
    assert info["edges"] == len(GRAPH.edges)
    assert info["fixed_bytes"] == 4096
    assert info["store_all_peak_bytes"] == store_all_peak_bytes(GRAPH)
    assert info["lower_bound_peak_bytes"] == lower_bound_peak_bytes(GRAPH)
    assert info["total_compute_cost"] == GRAPH.total_compute_ms
    assert info["hash"] == GRAPH.content_hash()
    plain = cli("info", work / "graph.json")
    assert plain.returncode == 0 and str(store_all_peak_bytes(GRAPH)) in plain.stdout


def test_validate(cli: Cli, work: Path) -> None:
    graph_only = ok_json(cli("validate", work / "graph.json", "--json"))
    assert graph_only["graph_valid"] is True and "plan_valid" not in graph_only
    both = ok_json(cli("validate", work / "graph.json", work / "plan.json", "--json"))
    assert both["plan_valid"] is True and both["within_budget"] is True
    plain = cli("validate", work / "graph.json", work / "plan.json")
    assert plain.returncode == 0 and "valid plan" in plain.stdout


def test_solve_writes_a_plan_the_simulator_accepts(cli: Cli, work: Path) -> None:
    out = work / "chen.json"
    summary = ok_json(cli("solve", work / "graph.json", "--budget", "0.9", "--method",
                          "chen-greedy", "-o", out, "--json"))
    budget = math.ceil(0.9 * store_all_peak_bytes(GRAPH))
    assert summary["budget_bytes"] == budget
    assert summary["status"] in ("feasible", "optimal")
    assert summary["output"] == str(out)
    plan = load_plan(out)
    sim = simulate(GRAPH, plan)
    assert summary["peak_bytes"] == sim.peak_bytes == plan.predicted.peak_bytes  # type: ignore[union-attr]
    assert sim.peak_bytes <= budget
    assert plan.method == "chen-greedy" and plan.graph_hash == GRAPH.content_hash()
    assert summary["overhead_percent"] == pytest.approx(100 * sim.overhead)


def test_solve_accepts_units_and_prints_a_summary(cli: Cli, work: Path) -> None:
    peak = store_all_peak_bytes(GRAPH)
    result = cli("solve", work / "graph.json", "--budget", f"{peak}B", "-m", "store-all")
    assert result.returncode == 0, result.stderr
    assert "optimal" in result.stdout and "store-all" in result.stdout


@pytest.mark.slow
def test_simulate_json_and_plot(cli: Cli, work: Path) -> None:
    png = work / "timeline.png"
    data = ok_json(cli("simulate", work / "graph.json", work / "plan.json", "--plot", png,
                       "--json"))
    sim = simulate(GRAPH, load_plan(work / "plan.json"))
    assert data["peak_bytes"] == sim.peak_bytes
    assert data["compute_cost"] == sim.compute_cost
    assert len(data["timeline"]) == len(sim.timeline)
    assert max(point[2] for point in data["timeline"]) == sim.peak_bytes
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = cli("simulate", work / "graph.json", work / "plan.json")
    assert plain.returncode == 0 and "peak" in plain.stdout


def test_demo(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "demo_plan.json"
    summary = ok_json(cli("demo", "--json", "-m", BASELINE, "-o", out))
    assert summary["status"] in ("feasible", "optimal")
    assert summary["peak_bytes"] <= summary["budget_bytes"]
    assert load_plan(out).status in (PlanStatus.feasible, PlanStatus.optimal)
    plain = cli("demo", "-m", BASELINE)
    assert plain.returncode == 0 and "status" in plain.stdout


def test_methods_and_help(cli: Cli) -> None:
    described = ok_json(cli("methods", "--json"))  # each method's spec, described
    assert set(BASELINES) <= {m["name"] for m in described}
    assert all("plan_kinds" in m and "options" in m for m in described)
    result = cli("--help")
    assert result.returncode == 0 and "solve" in result.stdout
    bare = cli()
    assert bare.returncode == 0 and "Usage" in bare.stdout


# -- no plan fits: exit 3 with the smallest budget that works ------------------------------------


def test_impossible_budget_exits_3_with_the_smallest_budget(cli: Cli, work: Path) -> None:
    result = cli("solve", work / "graph.json", "--budget", "100B", "-m", BASELINE,
                 "-o", work / "none.json")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    smallest = min(simulate(GRAPH, fn(GRAPH, None)).peak_bytes for fn in BASELINES.values())
    lines = result.stderr.strip().split("\n")
    assert len(lines) == 1
    numbers = [int(n) for n in re.findall(r"\b(\d+) bytes", lines[0])]
    assert smallest in numbers, lines[0]
    assert not (work / "none.json").exists()
    # That budget does work.
    ok = cli("solve", work / "graph.json", "--budget", f"{smallest}B", "-m", BASELINE, "--json")
    assert ok.returncode == 0, ok.stderr


# -- bad input: exit 2, one line, no traceback --------------------------------------------------


def graph_doc() -> dict[str, Any]:
    return json.loads(GRAPH.model_dump_json())


def _cycle(d: dict[str, Any]) -> None:
    d["edges"].append({"source": 5, "target": 0})


def _dangling(d: dict[str, Any]) -> None:
    d["edges"].append({"source": 3, "target": 999})


def _duplicate(d: dict[str, Any]) -> None:
    d["nodes"][4]["id"] = 2


def _negative(d: dict[str, Any]) -> None:
    d["nodes"][3]["compute_ms"] = -2.0


def _nan(d: dict[str, Any]) -> None:
    d["nodes"][3]["output_bytes"] = math.nan


def _missing(d: dict[str, Any]) -> None:
    del d["nodes"][3]["id"]


BAD_GRAPH_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], tuple[str, ...]]] = {
    "cycle": (_cycle, ("cycle",)),
    "dangling edge": (_dangling, ("missing node 999",)),
    "duplicate id": (_duplicate, ("duplicate node id 2",)),
    "negative cost": (_negative, ("nodes[3]", "compute_ms")),
    "NaN bytes": (_nan, ("nodes[3]", "output_bytes")),
    "missing field": (_missing, ("nodes[3]", "missing id")),
}


@pytest.mark.parametrize("case", list(BAD_GRAPH_CASES))
@pytest.mark.parametrize("command", ["info", "validate", "solve"])
def test_bad_graphs(cli: Cli, tmp_path: Path, case: str, command: str) -> None:
    mutate, fragments = BAD_GRAPH_CASES[case]
    doc = graph_doc()
    mutate(doc)
    path = tmp_path / "bad_graph.json"
    path.write_text(json.dumps(doc))  # NaN is written as the NaN literal
    args: list[Any] = [command, path]
    if command == "solve":
        args += ["--budget", "0.5", "-m", BASELINE]
    bad_input(cli(*args), str(path), *fragments)


def test_not_json(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"nodes": [')
    bad_input(cli("info", path), str(path), "not JSON")
    bad_input(cli("import-checkmate", path, "-o", tmp_path / "out.json"), "not JSON")


def test_missing_file(cli: Cli, tmp_path: Path, work: Path) -> None:
    bad_input(cli("info", tmp_path / "absent.json"), "absent.json", "no such file")
    bad_input(cli("validate", work / "graph.json", tmp_path / "absent_plan.json"),
              "absent_plan.json", "no such file")
    bad_input(cli("import-checkmate", tmp_path / "absent.json", "-o", tmp_path / "o.json"),
              "no such file")


def test_unknown_method(cli: Cli, work: Path) -> None:
    bad_input(cli("solve", work / "graph.json", "--budget", "0.5", "--method", "magic"),
              "unknown method 'magic'", "store-all")


@pytest.mark.parametrize("budget", ["lots", "5XB", "0", "-3GiB"])
def test_unparsable_budget(cli: Cli, work: Path, budget: str) -> None:
    bad_input(cli("solve", work / "graph.json", "--budget", budget, "-m", BASELINE), "budget")


def test_usage_errors_are_one_line(cli: Cli, work: Path) -> None:
    bad_input(cli("solve", work / "graph.json"), "--budget")
    bad_input(cli("frobnicate"), "frobnicate")
    bad_input(cli("solve", work / "graph.json", "-b", "0.5", "--threads", "0"), "--threads")
    bad_input(cli("solve", work / "graph.json", "-b", "0.5", "--time-limit", "-1"),
              "--time-limit: -1", "more than 0")
    bad_input(cli("schema", "nope"), "'nope' is not one of 'graph', 'plan', 'resources'")
    bad_input(cli("simulate", work / "graph.json", work / "plan.json", "--plot",
                  work / "no_such_dir" / "t.png"), "no such folder")


def test_plan_for_another_graph(cli: Cli, work: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    write_json(other, training_graph(8, skip=2, seed=8))
    for command in ("validate", "simulate"):
        bad_input(cli(command, other, work / "plan.json"), "plan.json", "not this graph")


def test_plan_using_a_freed_node(cli: Cli, work: Path, tmp_path: Path) -> None:
    plan = Plan(
        graph_hash=GRAPH.content_hash(),
        method="hand",
        status=PlanStatus.feasible,
        actions=actions_from_text("C0 F0 C1"),
    )
    path = tmp_path / "freed.json"
    write_json(path, plan)
    for command in ("validate", "simulate"):
        bad_input(cli(command, work / "graph.json", path), "freed.json", "action 2",
                  "freed at action 1")


def test_bad_plan_document(cli: Cli, work: Path, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    doc = json.loads((work / "plan.json").read_text())
    doc["actions"][0]["op"] = "teleport"
    path.write_text(json.dumps(doc))
    bad_input(cli("validate", work / "graph.json", path), "actions[0].op")
    path.write_text("[]")
    bad_input(cli("simulate", work / "graph.json", path), "expected a JSON object")


def test_serve_on_a_busy_port_exits_4_and_creates_no_database(cli: Cli, tmp_path: Path) -> None:
    """A command's own exit code (typer.Exit) reaches the shell: `serve` on a port in use is
    exit 4 with one line, before any database is opened."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        db = tmp_path / "s.db"
        r = cli("serve", "--port", str(port), "--database-url", f"sqlite:///{db}")
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert r.stderr.strip().startswith(f"error: 127.0.0.1:{port} is already in use")
    assert not db.exists()
