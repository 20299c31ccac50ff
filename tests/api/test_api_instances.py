"""Several service instances on one database (SQLite file; PostgreSQL when
PLANNER_TEST_POSTGRES_URL is set): each holds a lease, a running job names its instance, and only
the jobs of an instance whose lease expired are taken over. A second server started on a busy
port exits at once (code 4) without touching the running jobs; a clean stop re-queues without
counting the interrupted attempt."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
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

GRAPH = training_graph(12, skip=3, seed=4)
DOC = GRAPH.model_dump(mode="json")
LEASE_S = 2.0
EXIT_PORT_IN_USE = 4


def _slow(server: ServerProcess, sleep_s: float, budget: float = 0.9) -> str:
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": DOC, "budget": budget, "method": "slow-test",
                                      "options": {"sleep_s": sleep_s}})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])


def _running(server: ServerProcess, plan_id: str) -> dict[str, Any]:
    with server.client() as c:
        body = wait_status(c, plan_id, "running")
        deadline = time.monotonic() + 10
        while (body["worker_pid"] is None or body["instance"] is None) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
            body = c.get(f"/v1/plans/{plan_id}").json()
    assert body["worker_pid"] is not None and body["instance"] is not None, body
    return body


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.slow
def test_two_instances_share_one_database(backend: str, tmp_path: Path) -> None:
    with database_url(backend, tmp_path) as url:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = ServerProcess(tmp_path / "a", url, workers=1, instance_lease_s=LEASE_S).start()
        b = ServerProcess(tmp_path / "b", url, workers=1, instance_lease_s=LEASE_S).start()
        try:
            ids = {httpx.get(s.url + "/readyz").json()["instance"] for s in (a, b)}
            assert len(ids) == 2
            # Jobs submitted to either instance run once, on whichever claims them, and are
            # served by both.
            submitted = []
            for i, budget in enumerate((0.6, 0.7, 0.8, 0.9, 1.0, 0.65)):
                with (a if i % 2 else b).client() as c:
                    r = c.post("/v1/plans", json={"graph": DOC, "budget": budget,
                                                  "method": "chen-greedy"})
                    assert r.status_code == 202, r.text
                    submitted.append(r.json()["id"])
            for plan_id in submitted:
                for server in (a, b):
                    with server.client() as c:
                        answer = wait_finished(c, plan_id)
                    assert answer["attempts"] == 1
                    assert_valid_plan(GRAPH, answer)

            # kill -9 the instance running a slow job: the other takes it over once the lease
            # has expired, and runs it to the end (attempt 2).
            slow_id = _slow(a, sleep_s=3)
            body = _running(a, slow_id)
            owner, survivor = (a, b) if body["instance"] == _instance(a) else (b, a)
            killed_at = time.monotonic()
            owner.kill9()
            assert process_gone(body["worker_pid"])
            heir = _instance(survivor)
            with survivor.client() as c:
                deadline = time.monotonic() + 30
                while (again := c.get(f"/v1/plans/{slow_id}").json())["instance"] != heir:
                    assert again["status"] in ("running", "queued"), again
                    assert time.monotonic() < deadline, again
                    time.sleep(0.05)
                taken_after_s = time.monotonic() - killed_at
                answer = wait_finished(c, slow_id, timeout_s=60)
            print(f"{backend}: lease {LEASE_S:g} s; the survivor took the job over "
                  f"{taken_after_s:.2f} s after the kill -9")
            assert answer["attempts"] == 2
            assert_valid_plan(GRAPH, answer)
            # Not before the lease ran out (less the heartbeat that may have renewed it last).
            assert taken_after_s >= LEASE_S * 2 / 3 - 0.2, taken_after_s
            assert taken_after_s < LEASE_S + 15, taken_after_s
            instances = _instances(survivor)
            assert _instance(survivor) in instances and len(instances) == 1
        finally:
            a.stop()
            b.stop()


def _instance(server: ServerProcess) -> str:
    return str(httpx.get(server.url + "/readyz").json()["instance"])


def _instances(server: ServerProcess) -> list[str]:
    from planner.api.store import Store

    store = Store(server.database_url)
    try:
        return [i["id"] for i in store.instances()]
    finally:
        store.dispose()


@pytest.mark.slow
def test_second_instance_on_a_busy_port_exits_and_touches_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    server = ServerProcess(tmp_path, url, workers=1, instance_lease_s=LEASE_S).start()
    try:
        slow_id = _slow(server, sleep_s=4)
        before = _running(server, slow_id)
        (tmp_path / "second").mkdir()
        second = ServerProcess(tmp_path / "second", url, workers=1, instance_lease_s=LEASE_S)
        started = time.monotonic()
        proc = second.spawn(server.port)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        elapsed_s = time.monotonic() - started
        with server.client() as c:  # the running job was not touched
            now = c.get(f"/v1/plans/{slow_id}").json()
            assert now["status"] in ("running", "done"), now
            assert now["attempts"] == 1 and now.get("error") is None, now
            if now["status"] == "running":
                assert now["worker_pid"] == before["worker_pid"]
                assert now["instance"] == before["instance"]
            answer = wait_finished(c, slow_id)
        assert answer["attempts"] == 1
        assert_valid_plan(GRAPH, answer)
        assert _instances(server) == [before["instance"]]
        # ... and the second server said why, with its own exit code, at once.
        log = second.log()
        assert code == EXIT_PORT_IN_USE, log
        assert "already in use" in log and "Traceback" not in log, log
        assert elapsed_s < 30
    finally:
        server.stop()


@pytest.mark.slow
def test_sigterm_requeues_without_counting_the_attempt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    server = ServerProcess(tmp_path, url, workers=1, instance_lease_s=LEASE_S).start()
    try:
        slow_id = _slow(server, sleep_s=30)
        body = _running(server, slow_id)
        assert body["attempts"] == 1
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)
        assert process_gone(body["worker_pid"])
        assert _instances(server) == []  # the lease was given up, not left to expire
        server.start()  # a new instance: it need not wait for any lease
        with server.client() as c:
            again = wait_status(c, slow_id, "running", timeout_s=10)
            assert again["attempts"] == 1, again  # the interrupted run was not counted
            assert c.delete(f"/v1/plans/{slow_id}").json()["status"] == "cancelled"
    finally:
        server.stop()
