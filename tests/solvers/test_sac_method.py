"""Method `sac`: plans in the space torch.compile executes (solvers/remat/sac.py, sac_space.py).

No torch.compile here (tests/runtime/test_runtime_compile.py compiles); the plans go through
runtime.compiled.decide, which refuses or projects what compile cannot run.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402
from torch import nn  # noqa: E402

from planner.core.graph import Graph  # noqa: E402
from planner.core.plan import PlanStatus  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.compiled import compiled_schedule as runtime_schedule  # noqa: E402
from planner.runtime.compiled import decide  # noqa: E402
from planner.solvers.remat.sac import solve_exact  # noqa: E402
from planner.solvers.remat.sac_space import SacSpace, compiled_schedule, search  # noqa: E402
from planner.tracing.api import trace  # noqa: E402


def gpt_graph(layers: int = 2, batch_size: int = 8, context: int = 64) -> Graph:
    # context 64: the attention scores outweigh the parameters, so recomputation matters (at
    # context 8 every recomputed set peaks alike)
    model, inputs = tiny_gpt(batch_size=batch_size, context=context, layers=layers,
                              dropout=0.0)
    return trace(model, inputs, costs="estimate").graph


@pytest.fixture(scope="module")
def gpt() -> Graph:
    return gpt_graph()


@pytest.fixture(scope="module")
def mlp() -> Graph:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.GELU(), nn.Linear(128, 128), nn.Tanh(),
                          nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 4))
    return trace(model, (torch.randn(512, 16),), costs="estimate").graph


def store_all_peak(graph: Graph) -> int:
    return SacSpace(graph).run(()).peak_bytes


def test_schedule_builder_moved_to_the_solvers_layer() -> None:
    assert runtime_schedule is compiled_schedule


def test_plan_fits_and_is_the_compiled_schedule_compile_accepts(gpt: Graph) -> None:
    budget = int(0.8 * store_all_peak(gpt))
    plan = solve(gpt, budget, "sac", time_limit_s=20)
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible) and plan.predicted
    assert plan.predicted.peak_bytes <= budget
    decisions = decide(plan, gpt)  # raises unless torch.compile runs it as it is
    assert decisions.exact and decisions.recomputed
    assert list(plan.actions) == compiled_schedule(gpt, decisions.recomputed)
    # the bound holds in the compiled space only: reported in details, not claimed as the plan's
    assert plan.lower_bound is None or plan.lower_bound <= gpt.total_compute_ms * (1 + 1e-9)
    bound = plan.details["space_lower_bound_ms"]
    assert bound is not None and bound <= plan.objective + 1e-12


def test_auto_compiled_space_runs_sac(gpt: Graph) -> None:
    budget = int(0.8 * store_all_peak(gpt))
    plan = solve(gpt, budget, "auto", time_limit_s=20, options={"space": "compiled"})
    assert plan.backend.startswith("sac")
    assert decide(plan, gpt).exact


def test_exact_equals_brute_force_and_bounds_every_set(mlp: Graph) -> None:
    space = SacSpace(mlp)
    assert 0 < len(space.candidates) <= 12
    runs = [space.run(r) for k in range(len(space.candidates) + 1)
            for r in itertools.combinations(space.candidates, k)]
    peaks = sorted({r.peak_bytes for r in runs})
    assert len(peaks) >= 3  # the budgets below make different choices
    for budget in [*peaks, peaks[0] - 1]:
        fits = [r.compute_ms for r in runs if r.peak_bytes <= budget]
        answer = solve_exact(space, budget, time_limit_s=20)
        assert answer.proven
        if not fits:
            assert answer.run is None
            continue
        assert answer.run is not None and answer.run.peak_bytes <= budget
        assert answer.run.compute_ms == pytest.approx(min(fits), rel=1e-12)
        assert answer.extra_bound_ms is not None
        assert mlp.total_compute_ms + answer.extra_bound_ms <= min(fits) * (1 + 1e-9)


def test_exact_no_worse_than_heuristic_and_bound_below_it(gpt: Graph) -> None:
    space = SacSpace(gpt)
    budget = int(0.7 * store_all_peak(gpt))
    heuristic = search(space, budget, time.perf_counter() + 5)
    assert heuristic is not None and heuristic.peak_bytes <= budget
    answer = solve_exact(space, budget, time_limit_s=30, hint=heuristic)
    assert answer.run is not None and answer.run.peak_bytes <= budget
    assert answer.run.compute_ms <= heuristic.compute_ms
    assert answer.extra_bound_ms is not None
    assert gpt.total_compute_ms + answer.extra_bound_ms <= heuristic.compute_ms * (1 + 1e-9)


def test_cost_monotone_in_the_budget(gpt: Graph) -> None:
    top = store_all_peak(gpt)
    costs: list[float] = []
    for share in (0.7, 0.75, 0.8, 0.9, 1.0):
        plan = solve(gpt, int(share * top), "sac", time_limit_s=20)
        assert plan.objective is not None and plan.predicted is not None
        assert plan.predicted.peak_bytes <= int(share * top)
        costs.append(plan.objective)
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(costs)), costs
    assert costs[-1] == pytest.approx(gpt.total_compute_ms)  # store-all fits: nothing recomputed


def test_budget_below_every_set_answers_no_plan(gpt: Graph) -> None:
    plan = solve(gpt, int(0.3 * store_all_peak(gpt)), "sac", time_limit_s=10)
    assert plan.status not in (PlanStatus.optimal, PlanStatus.feasible)


@pytest.mark.slow
def test_heuristic_within_10_s_on_800_nodes() -> None:
    graph = gpt_graph(layers=14, batch_size=4)
    assert len(graph.nodes) >= 800
    space = SacSpace(graph)
    budget = int(0.5 * store_all_peak(graph))
    started = time.perf_counter()
    run: Any = search(space, budget, started + 9.0)
    assert time.perf_counter() - started < 30.0  # a hang guard for a 9 s deadline
    assert run is not None and run.peak_bytes <= budget
    plan = solve(graph, budget, "sac", time_limit_s=10, options={"exact": False})
    assert plan.predicted is not None and plan.objective is not None
    assert plan.predicted.peak_bytes <= budget
