"""planner-cli with host copies: the solve summary's transfer figures, `simulate --plot` with device
and host memory and the three streams, and bad offload input as one line with exit 2. Runs the
CLI in-process (planner.cli.main.main, as the console script does) to stay fast."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import plugin_methods

from planner.core.graph import Graph
from planner.core.io import load_plan, write_json
from planner.core.plan import ActionOp, PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.gantt_plot import stream_intervals
from planner.engine.registry import BUILTIN_METHODS
from planner.engine.transfer_report import simulated_transfer_figures
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all
from planner.solvers.request import MethodResult, SolveRequest

GRAPH = training_graph(12, skip=2, seed=7, fixed_bytes=4096)
HOST = 2**34
MACHINE = {"preset": "h100-pcie-gen5", "host_memory_bytes": HOST}


def hand_offload(request: SolveRequest) -> MethodResult:
    """A plugin method: store-all with every boundary tensor offloaded (a hand-built plan)."""
    from planner.runtime.offload_plans import boundary_offload

    actions = boundary_offload(request.graph, store_all(request.graph))
    return MethodResult(actions=actions, status=PlanStatus.feasible)


OFFLOAD = "offload-greedy"  # a planner of solvers/offload
assert OFFLOAD in BUILTIN_METHODS  # renamed or gone: say so, not plan with a stand-in


@pytest.fixture(scope="module", autouse=True)
def _hand_offload() -> Iterator[None]:
    """The plugin for this module's tests only (not at import: it would join other modules'
    lists of methods)."""
    with plugin_methods(hand_offload=f"{__name__}:hand_offload"):
        yield


def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        *args: object) -> tuple[int, str, str]:
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", *map(str, args)])
    monkeypatch.setenv("COLUMNS", "200")
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("offload-cli")
    write_json(root / "graph.json", GRAPH)
    write_json(root / "machine.json", MACHINE)
    return root


def test_solve_summary_shows_bytes_moved_and_hidden_transfers(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = work / "plan.json"
    code, stdout, err = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                            work / "machine.json", "--budget", "40GiB", "--method",
                            "hand-offload", "-o", out, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    plan = load_plan(out)
    sim = simulate(GRAPH, plan)
    storage = GRAPH.index.storage_bytes
    d2h = sum(storage[a.node] for a in plan.actions if a.op is ActionOp.offload)
    h2d = sum(storage[a.node] for a in plan.actions if a.op is ActionOp.prefetch)
    assert summary["d2h_bytes"] == d2h > 0 and summary["h2d_bytes"] == h2d > 0
    assert summary["host_peak_bytes"] == sim.host_peak_bytes > 0
    assert summary["host_memory_bytes"] == HOST
    assert summary["makespan_ms"] == pytest.approx(sim.makespan_ms)
    assert summary["transfer_exposed_ms"] == pytest.approx(sim.exposed_transfer_ms)
    assert summary["transfer_hidden_ms"] == pytest.approx(
        max(0.0, sim.transfer_ms - sim.exposed_transfer_ms))
    figures = simulated_transfer_figures(sim, GRAPH, plan.actions, HOST)
    assert figures is not None and figures.as_dict() == {
        k: summary[k] for k in figures.as_dict()}
    # the same machine as a preset plus --host-memory, in the table a user reads
    code, stdout, err = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                            "h100-pcie-gen5", "--host-memory", "16GiB", "--budget", "40GiB",
                            "--method", "hand-offload")
    assert code == 0, err
    for row in ("moved d2h / h2d", "transfers hidden / exposed", "host peak / host budget",
                "makespan", "16.00 GiB"):
        assert row in stdout, stdout
    # a planner's plan, as the command line asks for it
    code, stdout, err = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                            "h100-pcie-gen5", "--host-memory", "16GiB", "--budget", "80%",
                            "--method", OFFLOAD, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["d2h_bytes"] > 0 and summary["host_peak_bytes"] <= 16 * 2**30
    assert summary["peak_bytes"] <= summary["budget_bytes"] < summary["store_all_peak_bytes"]


def test_simulate_plot_draws_memory_and_the_three_streams(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = work / "plan-plot.json"
    code, _, err = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                       work / "machine.json", "--budget", "40GiB", "--method", "hand-offload",
                       "-o", out, "--json")
    assert code == 0, err
    png = work / "timeline.png"
    code, _, err = cli(capsys, monkeypatch, "simulate", work / "graph.json", out, "--plot", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # the Gantt bars: one per C/O/P action, copies as long as the link makes them
    plan = load_plan(out)
    sim = simulate(GRAPH, plan)
    resources = plan.resources
    assert resources is not None and resources.d2h is not None
    bars = stream_intervals(sim, GRAPH, resources)
    counts = {s: sum(1 for b in bars if b.stream == s) for s in ("compute", "d2h", "h2d")}
    ops = [a.op for a in plan.actions]
    assert counts == {"compute": ops.count(ActionOp.compute), "d2h": ops.count(ActionOp.offload),
                      "h2d": ops.count(ActionOp.prefetch)}
    for b in bars:
        assert b.end_ms is not None and 0 <= b.start_ms <= b.end_ms <= sim.makespan_ms + 1e-9
        if b.stream == "d2h":
            nbytes = GRAPH.index.storage_bytes[int(b.action[1:])]
            assert b.end_ms - b.start_ms == pytest.approx(resources.d2h.transfer_ms(nbytes))
    for stream in ("d2h", "h2d"):  # one copy at a time per stream
        mine = sorted((b.start_ms, b.end_ms) for b in bars if b.stream == stream)
        ends = [end for _, end in mine if end is not None]
        starts = [start for start, _ in mine]
        assert len(ends) == len(mine)
        assert all(e <= s + 1e-9 for e, s in zip(ends, starts[1:], strict=False))


def _one_line_exit_2(result: tuple[int, str, str], needle: str) -> None:
    code, _, err = result
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({**MACHINE, "h2d": {"bandwidth_bytes_per_s": 0}}, "h2d.bandwidth_bytes_per_s"),
        ({**MACHINE, "d2h": {"bandwidth_bytes_per_s": -1e9}}, "d2h.bandwidth_bytes_per_s"),
        ({"host_memory_bytes": HOST, "h2d": "pcie-gen5-x16"}, "names no device"),
        ({**MACHINE, "host_memory_bytes": 0}, "host_memory_bytes is 0"),
        ({"preset": "h100-pcie-gen5"}, "host_memory_bytes is unset"),
    ],
    ids=["zero-bandwidth", "negative-bandwidth", "no-device", "host-zero", "no-host"],
)
def test_bad_resources_one_line_exit_2(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    doc: dict[str, object], needle: str
) -> None:
    path = work / "bad.json"
    write_json(path, doc)
    result = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources", path,
                 "--budget", "40GiB", "--method", OFFLOAD)
    _one_line_exit_2(result, needle)


def test_host_memory_flag_refuses_zero_and_fractions(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ("solve", work / "graph.json", "--budget", "40GiB", "--method", "hand-offload")
    _one_line_exit_2(cli(capsys, monkeypatch, *base, "--resources", "h100-pcie-gen5",
                         "--host-memory", "0"), "--host-memory: '0': must be more than 0")
    _one_line_exit_2(cli(capsys, monkeypatch, *base, "--resources", "h100-pcie-gen5",
                         "--host-memory", "50%"), "give bytes with a unit")
    _one_line_exit_2(cli(capsys, monkeypatch, *base, "--host-memory", "1GiB"),
                     "--host-memory: needs resources")


def test_host_budget_below_what_the_plan_parks(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = work / "plan-park.json"
    code, _, err = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                       work / "machine.json", "--budget", "40GiB", "--method", "hand-offload",
                       "-o", out, "--json")
    assert code == 0, err
    parked = simulate(GRAPH, load_plan(out)).host_peak_bytes
    small = work / "small-host.json"
    write_json(small, {**MACHINE, "host_memory_bytes": parked // 2})
    for command in ("simulate", "validate"):
        result = cli(capsys, monkeypatch, command, work / "graph.json", out, "--resources", small)
        _one_line_exit_2(result, "host memory overflows")


def test_host_budget_below_what_the_planner_parks(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cli(capsys, monkeypatch, "solve", work / "graph.json", "--resources",
                 "h100-pcie-gen5", "--host-memory", "1KiB", "--budget", "75%", "--method",
                 OFFLOAD)
    _one_line_exit_2(result, "host_memory_bytes 1024 (1.00 KiB) is smaller than what method")


def test_graph_with_nothing_offloadable(
    work: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = GRAPH.model_dump(mode="json")
    for node in doc["nodes"]:
        node["offloadable"] = False
    path = work / "pinned.json"
    write_json(path, Graph.model_validate(doc))
    result = cli(capsys, monkeypatch, "solve", path, "--resources", work / "machine.json",
                 "--budget", "40GiB", "--method", OFFLOAD)
    _one_line_exit_2(result, "nothing can be offloaded")
