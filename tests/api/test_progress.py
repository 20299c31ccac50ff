"""Progress while solving: auto, milp and cpsat-intervals report (best objective, best bound) as
they improve, through the engine API and through the service's job resource."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from api_server import ServerProcess, assert_valid_plan, running_server, wait_finished
from corpus_like import corpus_like

from planner.core.plan import PlanStatus
from planner.engine.solve import solve
from planner.solvers.baselines import store_all_peak_bytes

GRAPH = corpus_like(14, 3, 1)  # no method proves its optimum at 0.7 within a few seconds
BUDGET = math.ceil(0.7 * store_all_peak_bytes(GRAPH))


@pytest.mark.parametrize("method", ["auto", "milp", "cpsat-intervals"])
def test_engine_reports_objective_and_bound_as_they_improve(method: str) -> None:
    seen: list[tuple[float | None, float | None]] = []
    plan = solve(GRAPH, BUDGET, method, time_limit_s=3, threads=1,
                 progress=lambda objective, bound: seen.append((objective, bound)))
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible), plan.notes
    pairs = [(o, b) for o, b in seen if o is not None and b is not None]
    assert pairs, f"{method}: no (objective, bound) pair among {seen}"
    objectives = [o for o, _ in pairs]
    bounds = [b for _, b in pairs]
    assert objectives == sorted(objectives, reverse=True)  # never rises
    assert bounds == sorted(bounds)  # never falls
    assert all(GRAPH.total_compute_ms <= b <= o for o, b in pairs)
    # The last report is the engine's judgement: the simulator's cost of the returned plan.
    assert objectives[-1] == pytest.approx(plan.objective, rel=1e-12)


def test_a_broken_progress_callback_does_not_end_the_solve() -> None:
    def broken(objective: float | None, bound: float | None) -> None:
        raise RuntimeError("display gone")

    plan = solve(GRAPH, BUDGET, "milp", time_limit_s=1, threads=1, progress=broken)
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("progress")
    with running_server(workdir, f"sqlite:///{workdir / 'planner.db'}", workers=1,
                        max_time_limit_s=60) as srv:
        yield srv


@pytest.mark.slow
def test_a_running_job_shows_its_progress(server: ServerProcess) -> None:
    doc = GRAPH.model_dump(mode="json")
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": doc, "budget": BUDGET, "method": "cpsat-intervals",
                                      "time_limit": 6})
        assert r.status_code in (200, 201, 202), r.text
        plan_id = r.json()["id"]
        deadline = time.monotonic() + 30
        progress = None
        while time.monotonic() < deadline:
            body = c.get(f"/v1/plans/{plan_id}").json()
            if body["status"] not in ("queued", "running"):
                break
            p = body.get("progress") or {}
            if p.get("best_objective") is not None and p.get("best_bound") is not None:
                progress = p
                break
            time.sleep(0.1)
        assert progress is not None, f"no progress while running: {body}"
        assert GRAPH.total_compute_ms <= progress["best_bound"] <= progress["best_objective"]
        assert_valid_plan(GRAPH, wait_finished(c, plan_id))
