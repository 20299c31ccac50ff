"""kill -9 of the server while a job runs: after a restart the job completes (or is failed with
its reason, by policy) and every earlier plan is still served. SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from api_server import (
    ServerProcess,
    assert_valid_plan,
    database_url,
    process_gone,
    wait_finished,
    wait_status,
)

from planner.core.synthetic import training_graph

GRAPH = training_graph(12, skip=3, seed=2)
DOC = GRAPH.model_dump(mode="json")


def _running_pid(server: ServerProcess, plan_id: str) -> int:
    with server.client() as c:
        body = wait_status(c, plan_id, "running")
        deadline = time.monotonic() + 10
        while body["worker_pid"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
            body = c.get(f"/v1/plans/{plan_id}").json()
    assert body["worker_pid"] is not None
    return int(body["worker_pid"])


@pytest.mark.parametrize(
    ("backend", "policy"), [("sqlite", "requeue"), ("sqlite", "fail"), ("postgres", "requeue")]
)
@pytest.mark.slow
def test_kill9_during_a_solve_then_restart(backend: str, policy: str, tmp_path: Path) -> None:
    with database_url(backend, tmp_path) as url:
        server = ServerProcess(tmp_path, url, workers=1, recover_running=policy).start()
        try:
            with server.client() as c:
                earlier_ids = []
                for budget in (0.8, 1.0):
                    r = c.post("/v1/plans", json={"graph": DOC, "budget": budget,
                                                  "method": "chen-greedy"})
                    earlier_ids.append(r.json()["id"])
                earlier = {i: wait_finished(c, i) for i in earlier_ids}
                for answer in earlier.values():
                    assert_valid_plan(GRAPH, answer)
                # long enough to be still running at the kill on a loaded machine
                r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "slow-test",
                                              "options": {"sleep_s": 6}})
                assert r.status_code == 202
                slow_id = r.json()["id"]
            solver_pid = _running_pid(server, slow_id)

            server.kill9()
            # The orphaned solver sees its lifeline close and exits by itself.
            assert process_gone(solver_pid), f"solver {solver_pid} outlived the killed server"

            server.start()
            with server.client() as c:
                answer = wait_finished(c, slow_id)
                if policy == "requeue":
                    assert answer["attempts"] == 2
                    assert_valid_plan(GRAPH, answer)
                else:
                    assert answer["status"] == "failed"
                    assert "server stopped" in answer["error"], answer["error"]
                for plan_id, before in earlier.items():
                    now = c.get(f"/v1/plans/{plan_id}").json()
                    assert now["status"] == "done" and now["plan"] == before["plan"]
                cached = c.post("/v1/plans", json={"graph": DOC, "budget": 0.8,
                                                   "method": "chen-greedy"})
                assert cached.status_code == 200 and cached.json()["id"] == earlier_ids[0]
        finally:
            server.stop()


@pytest.mark.slow
def test_graceful_stop_requeues_then_time_limit_kills(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, f"sqlite:///{tmp_path / 's.db'}", workers=1,
                           kill_grace_s=0.5).start()
    try:
        with server.client() as c:
            r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "slow-test",
                                          "options": {"sleep_s": 30}})
            slow_id = r.json()["id"]
        solver_pid = _running_pid(server, slow_id)
        server.stop()
        assert process_gone(solver_pid)
        server.start()
        with server.client() as c:
            body = c.get(f"/v1/plans/{slow_id}").json()
            assert body["status"] in ("queued", "running")
            assert "shut down" in (body["error"] or "")
            assert c.delete(f"/v1/plans/{slow_id}").json()["status"] == "cancelled"
            # A solver process that stops answering (frozen: not even the engine's fallback can
            # answer at the limit) is killed soon after its time limit and marked failed.
            r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "slow-test",
                                          "options": {"sleep_s": 60, "freeze": True},
                                          "time_limit": 1})
            stuck_id = r.json()["id"]
            pid = _running_pid(server, stuck_id)
            answer = wait_finished(c, stuck_id, timeout_s=30)
            assert answer["status"] == "failed" and "time limit of 1 s" in answer["error"]
            assert answer["solve_seconds"] < 20
            assert process_gone(pid)
    finally:
        server.stop()
