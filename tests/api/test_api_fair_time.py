"""Fair time, not only fair order (issue 50, item 3): while tenant B's long jobs hold every
worker, tenant A's short job starts within seconds, not after B's whole time limit. The
dispatcher asks B's longest-running job to answer now with its best plan so far (SIGUSR1; the
engine's `stop`): that job ends as done, with a note saying why."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from api_server import ServerProcess, database_url, running_server, wait_finished

from planner.core.synthetic import training_graph

KEY_A, KEY_B = "fair-time-key-of-tenant-a", "fair-time-key-of-tenant-b"
DOC = training_graph(8, skip=2, seed=3).model_dump(mode="json")
LONG_S = 600.0  # each of B's jobs: its limit, and how long it sleeps


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("fair-time")
    with database_url("sqlite", workdir) as url, running_server(
        workdir, url, workers=2, submissions_per_minute=100_000, max_time_limit_s=LONG_S,
        api_keys=json.dumps([f"a:{KEY_A}", f"b:{KEY_B}"]),
    ) as srv:
        yield srv


def _slow(sleep_s: float, limit_s: float) -> dict[str, Any]:
    return {"graph": DOC, "budget": 1.0, "method": "slow-test", "time_limit": limit_s,
            "options": {"sleep_s": sleep_s}}


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _running(client: httpx.Client) -> list[dict[str, Any]]:
    return client.get("/v1/plans", params={"status": "running"}).json()["plans"]


@pytest.mark.slow
def test_a_short_job_starts_within_seconds_while_long_jobs_hold_every_worker(
        server: ServerProcess) -> None:
    with server.client(KEY_B) as b, server.client(KEY_A) as a:
        b_ids = []
        for i in range(3):  # distinct options: three jobs, not one shared
            r = b.post("/v1/plans", json=_slow(LONG_S + i, LONG_S))
            assert r.status_code == 202, r.text
            b_ids.append(r.json()["id"])
        deadline = time.monotonic() + 60
        while len(_running(b)) < 2:
            assert time.monotonic() < deadline, "B's jobs never took both workers"
            time.sleep(0.05)
        r = a.post("/v1/plans", json=_slow(0.1, 30))
        assert r.status_code == 202, r.text
        a_job = wait_finished(a, r.json()["id"], timeout_s=120)
        b_jobs = [b.get(f"/v1/plans/{job_id}").json() for job_id in b_ids]
        for job_id in b_ids:  # the rest of B's flood is not this test's
            b.delete(f"/v1/plans/{job_id}")
    assert a_job["status"] == "done"
    a_wait_s = _epoch(a_job["started_at"]) - _epoch(a_job["created_at"])
    print(f"A waited {a_wait_s:.2f} s for a worker while B held both with {LONG_S:g} s jobs")
    # The target (≤ 5 s) is a timing figure; here only waiting for B's limit (600 s) fails.
    assert a_wait_s < 60
    stopped = [j for j in b_jobs if j["status"] == "done"]
    assert len(stopped) == 1, [j["status"] for j in b_jobs]
    notes = " ".join(stopped[0]["report"]["notes"])
    assert "stopped after" in notes and "waiting tenant" in notes
    assert stopped[0]["plan"]["actions"]  # its best plan so far (here the fast baselines')
