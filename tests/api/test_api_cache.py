"""The result cache honours time limits: a plan that is not proven optimal answers only requests
that allow no more search than it had; `force` solves again; identical concurrent submissions
share one job (a uniqueness guarantee in the store). SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from api_server import ServerProcess, database_url, running_server, wait_finished

from planner.core.synthetic import training_graph
from planner.solvers.baselines import store_all_peak_bytes

GRAPH = training_graph(10, skip=2, seed=5)
DOC = GRAPH.model_dump(mode="json")
PEAK = store_all_peak_bytes(GRAPH)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp(f"cache-{request.param}")
    with database_url(request.param, workdir) as url:
        with running_server(workdir, url, workers=2, max_time_limit_s=120,
                            default_time_limit_s=60) as srv:
            yield srv


def _post(server: ServerProcess, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with server.client() as c:
        r = c.post("/v1/plans", json=body)
        assert r.status_code in (200, 202), r.text
        answer = r.json()
        if r.status_code == 202:
            answer = wait_finished(c, answer["id"])
        return r.status_code, answer


@pytest.mark.slow
def test_a_feasible_plan_does_not_answer_a_request_with_more_time(server: ServerProcess) -> None:
    with server.client() as c:
        gid = c.post("/v1/graphs", json=DOC).json()["id"]
    budget = int(0.8 * PEAK)
    # By graph id and bytes, so the in-memory fast path is asked too, not only the store.
    ask = {"graph_id": gid, "budget": budget, "method": "best-baseline"}
    code, short = _post(server, {**ask, "time_limit": 0.5})
    assert code == 202 and short["report"]["status"] == "feasible", short
    code, again = _post(server, {**ask, "time_limit": 0.5})
    assert code == 200 and again["cached"] and again["id"] == short["id"]

    code, longer = _post(server, {**ask, "time_limit": 30})
    assert code == 202 and not longer["cached"] and longer["id"] != short["id"], longer
    assert longer["time_limit_s"] == 30
    # Now a 30 s answer exists: it serves 30 s and shorter requests, and the default (60 s)
    # still gets a solve of its own.
    for limit in (30, 10, 0.5):
        code, cached = _post(server, {**ask, "time_limit": limit})
        assert code == 200 and cached["cached"] and cached["time_limit_s"] >= limit, cached
    code, default = _post(server, ask)
    assert code == 202 and default["time_limit_s"] == 60

    code, forced = _post(server, {**ask, "time_limit": 30, "force": True})
    assert code == 202 and not forced["cached"]
    assert forced["id"] not in (short["id"], longer["id"], default["id"])


def test_optimal_and_proven_infeasible_answers_serve_any_time_limit(server: ServerProcess
                                                                    ) -> None:
    proof = ("100B", "chen-greedy", None)  # below what one node needs: infeasible by proof
    for budget, method, status in ((PEAK, "store-all", "optimal"), proof):
        ask = {"graph": DOC, "budget": budget, "method": method}
        code, first = _post(server, {**ask, "time_limit": 0.5})
        assert code == 202, first
        if status:
            assert first["report"]["status"] == status
        else:
            assert first["status"] == "infeasible" and first["report"]["backend"] == "proof"
        code, later = _post(server, {**ask, "time_limit": 100})
        assert code == 200 and later["cached"] and later["id"] == first["id"], later


def test_twenty_identical_concurrent_posts_make_one_job(server: ServerProcess) -> None:
    body = {"graph": DOC, "budget": int(0.85 * PEAK), "method": "slow-test",
            "options": {"sleep_s": 1.0}, "time_limit": 20}
    start = threading.Barrier(20)

    def submit(_: int) -> str:
        with server.client() as c:
            start.wait()
            r = c.post("/v1/plans", json=body)
            assert r.status_code in (200, 202), r.text
            return str(r.json()["id"])

    with ThreadPoolExecutor(max_workers=20) as pool:
        ids = set(pool.map(submit, range(20)))
    assert len(ids) == 1, ids
    with server.client() as c:
        answer = wait_finished(c, ids.pop())
    assert answer["status"] == "done" and answer["attempts"] == 1
