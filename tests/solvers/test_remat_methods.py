"""Remat methods through solve() and the CLI: infeasible budgets, time limits, min-budget,
sweeps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from remat_bruteforce import brute_force_min_peak

from planner.core.synthetic import random_dag, training_graph
from planner.engine.solve import solve
from planner.engine.sweep import parse_budgets, run_sweep
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.remat.min_budget import min_budget
from planner.solvers.remat.problem import problem_from_graph

CLI = [sys.executable, "-m", "planner.cli.main"]


def _write(tmp_path: Path, graph) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / "graph.json"
    path.write_text(graph.model_dump_json())
    return path


@pytest.mark.parametrize("method", ["milp", "auto", "lp-rounding", "cpsat-intervals"])
@pytest.mark.slow
def test_methods_plans_within_budget(method: str) -> None:
    g = training_graph(6, skip=2, seed=4)
    budget = (lower_bound_peak_bytes(g) + store_all_peak_bytes(g)) // 2
    plan = solve(g, budget, method, time_limit_s=20)
    assert plan.status.value in ("optimal", "feasible")
    assert simulate(g, plan.actions).peak_bytes <= budget
    exact = solve(g, budget, "milp", time_limit_s=20)
    assert exact.status.value == "optimal"
    if method == "milp":
        assert plan.objective == pytest.approx(exact.objective)
    elif method == "auto":  # auto may also reorder first computations: never worse
        assert plan.objective <= exact.objective + 1e-9


def test_min_budget_matches_brute_force() -> None:
    for seed in range(5):
        g = random_dag(6, seed=seed, edge_probability=0.4)
        r = min_budget(g, time_limit_s=20)
        expected = brute_force_min_peak(problem_from_graph(g, 0))
        assert r.proven and r.peak_bytes == expected
        assert simulate(g, r.actions).peak_bytes == r.peak_bytes


def test_infeasible_budget_reports_smallest_and_exit_3(tmp_path: Path) -> None:
    g = random_dag(7, seed=2, edge_probability=0.4)
    least = min_budget(g, time_limit_s=20).peak_bytes
    plan = solve(g, least - 1, "milp", time_limit_s=20)
    assert plan.status.value == "infeasible"
    assert plan.details["smallest_feasible_bytes"] == least
    assert solve(g, least, "milp", time_limit_s=20).status.value == "optimal"
    path = _write(tmp_path, g)
    run = subprocess.run([*CLI, "solve", str(path), "-b", f"{least - 1}B", "-m", "milp"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr
    assert f"{least} bytes" in run.stderr


def test_time_limit_is_honoured() -> None:
    g = training_graph(25, skip=3, seed=1)
    budget = int(0.45 * store_all_peak_bytes(g))
    for method in ("auto", "milp"):
        started = time.perf_counter()
        plan = solve(g, budget, method, time_limit_s=2)
        wall = time.perf_counter() - started
        assert wall < 30, f"{method} took {wall:.1f} s for a 2 s limit"  # a hang guard
        assert plan.status.value in ("optimal", "feasible"), method
        assert simulate(g, plan.actions).peak_bytes <= budget


def test_sweep_overhead_non_increasing(tmp_path: Path) -> None:
    g = training_graph(6, skip=2, seed=3)
    store_all = store_all_peak_bytes(g)
    budgets = parse_budgets("0.4:1.0:0.1", store_all)
    points = run_sweep(g, budgets, method="milp", time_limit_s=10, jobs=1)
    overheads = [p.overhead for p in points if p.overhead is not None]
    assert overheads and overheads == sorted(overheads, reverse=True)
    assert points[-1].overhead == 0.0
    for p in points:
        if p.overhead is not None:
            assert p.peak_bytes is not None and p.peak_bytes <= p.budget_bytes
    path = _write(tmp_path, g)
    out = tmp_path / "s.json"
    run = subprocess.run([*CLI, "sweep", str(path), "--budgets", "0.5:1.0:0.25", "--jobs", "2",
                          "--time-limit", "5", "--json-out", str(out), "--csv",
                          str(tmp_path / "s.csv"), "--png", str(tmp_path / "s.png")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["points"]
    assert [r["fraction"] for r in rows] == [0.5, 0.75, 1.0]
    assert (tmp_path / "s.png").stat().st_size > 0
    assert (tmp_path / "s.csv").read_text().startswith("fraction,")


def test_bad_budget_spec_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, random_dag(4, seed=1))
    run = subprocess.run([*CLI, "sweep", str(path), "--budgets", "0.9:0.3:0.1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1


def test_memory_aware_orders_are_topological_and_can_fit_more() -> None:
    from planner.solvers.baselines import store_all
    from planner.solvers.remat.orders import candidate_orders, explore_orders, with_order

    g = random_dag(30, seed=7, edge_probability=0.15, max_bytes=50)
    edges = [(e.source, e.target) for e in g.edges]
    given_peak = store_all_peak_bytes(g)
    peaks = []
    for name, order in list(candidate_orders(g).items()) + list(
        explore_orders(g, 0, time.perf_counter() + 1.0)
    ):
        pos = {v: i for i, v in enumerate(order)}
        assert sorted(order) == sorted(n.id for n in g.nodes), name
        assert all(pos[u] < pos[v] for u, v in edges), name
        ordered = with_order(g, order)
        sim = simulate(g, store_all(ordered))  # the plan runs on the original graph
        assert sim.recomputations == 0
        peaks.append(sim.peak_bytes)
    assert min(peaks) <= given_peak


def test_pareto_axis_reads_in_the_graphs_own_unit(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: the sweep's Pareto plot said GiB for a MiB-sized graph."""
    import matplotlib.figure

    from planner.cli.remat_cmds import _pareto_png

    labels: list[str] = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: labels.append(fig.axes[0].get_xlabel()))
    rows = [{"budget_bytes": b * 2**20, "overhead_percent": o} for b, o in ((20, 5.0), (30, 0.0))]
    _pareto_png(tmp_path / "p.png", rows, "t")
    rows = [{"budget_bytes": b * 2**30, "overhead_percent": o} for b, o in ((20, 5.0), (30, 0.0))]
    _pareto_png(tmp_path / "p.png", rows, "t")
    assert labels == ["memory budget (MiB)", "memory budget (GiB)"]
