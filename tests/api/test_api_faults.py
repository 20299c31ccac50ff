"""Faults that say what they are: a full or read-only store answers 503 with its cause (logged
once per cause), /readyz is not ready until a write succeeds, no job is lost; a solver process
that cannot start fails its job at once; `serve` on an unusable database or a busy port is one
line and its exit code; security headers on the page and the API."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from api_server import REPO_ROOT, SLOW_METHOD, TESTS_DIR, free_port
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from planner.api.jobs import SPAWN_BACKOFF_S
from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[TestClient]:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", workers=2,
                        max_time_limit_s=30, extra_methods=SLOW_METHOD,
                        submissions_per_minute=1000)
    with TestClient(create_app(settings)) as client:
        yield client


def _parts(api: TestClient) -> Any:
    return api.app.state.parts  # type: ignore[attr-defined]


@contextmanager
def failing_writes(api: TestClient, message: str) -> Iterator[None]:
    """Every store write raises what sqlite3 raises for `message`; reads still work."""
    store = _parts(api).store

    @contextmanager
    def broken() -> Iterator[None]:
        raise OperationalError("UPDATE ...", {}, sqlite3.OperationalError(message))
        yield  # pragma: no cover

    store.write_session = broken
    try:
        yield
    finally:
        del store.write_session  # the class's method again


def _wait(api: TestClient, job_id: str, statuses: tuple[str, ...], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        body = api.get(f"/v1/plans/{job_id}").json()
        if body["status"] in statuses or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _fault_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("storage fault")]


@pytest.mark.slow
@pytest.mark.parametrize(("message", "cause"), [
    ("database or disk is full", "disk_full"),
    ("attempt to write a readonly database", "read_only"),
])
def test_a_store_refusing_writes_answers_503_with_its_cause_and_loses_no_job(
    api: TestClient, caplog: pytest.LogCaptureFixture, message: str, cause: str
) -> None:
    caplog.set_level(logging.INFO, logger="planner.api")
    assert api.get("/readyz").status_code == 200
    r = api.post("/v1/plans", json={"graph": DOC, "budget": 1.0, "method": "slow-test",
                                    "options": {"sleep_s": 1.0}})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert _wait(api, job_id, ("running",), 10)["status"] == "running"
    with failing_writes(api, message):
        for budget in (0.9, 0.8, 0.7, 0.6):
            r = api.post("/v1/plans", json={"graph": DOC, "budget": budget,
                                            "method": "store-all"})
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == f"storage_{cause}" and error["details"]["cause"] == cause
            assert message in error["message"] and r.headers["retry-after"]
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"]["details"]["cause"] == cause
        time.sleep(1.5)  # the solve ends meanwhile: its result cannot be written yet
        assert api.get(f"/v1/plans/{job_id}").json()["status"] == "running"
        assert api.get("/readyz").status_code == 503
    # One line for the cause, however many requests, heartbeats and results failed.
    assert len(_fault_lines(caplog)) == 1, _fault_lines(caplog)
    assert "Traceback" not in caplog.text
    assert api.get("/readyz").status_code == 200  # its probe write succeeds
    assert _wait(api, job_id, ("done",), 10)["status"] == "done"  # the held result is written
    r = api.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "store-all"})
    assert r.status_code in (200, 202), r.text


def test_storage_errors_are_classified_from_the_driver() -> None:
    from planner.api.errors import classify_storage_error

    def wrapped(orig: Exception) -> OperationalError:
        return OperationalError("SELECT 1", {}, orig)

    assert classify_storage_error(wrapped(sqlite3.OperationalError(
        "database or disk is full"))) == "disk_full"
    assert classify_storage_error(wrapped(sqlite3.OperationalError(
        "attempt to write a readonly database"))) == "read_only"
    assert classify_storage_error(wrapped(sqlite3.OperationalError(
        "unable to open database file"))) == "unreachable"
    refused = Exception('connection failed: connection to server at "127.0.0.1", port 1 failed')
    assert classify_storage_error(wrapped(refused)) == "unreachable"
    assert classify_storage_error(ValueError("not a database error")) is None


def test_one_log_line_per_cause_per_minute(caplog: pytest.LogCaptureFixture) -> None:
    from planner.api.errors import StorageHealth

    now = [0.0]
    health = StorageHealth(clock=lambda: now[0])
    full = OperationalError("x", {}, sqlite3.OperationalError("database or disk is full"))
    read_only = OperationalError("x", {}, sqlite3.OperationalError("readonly database"))
    caplog.set_level(logging.INFO, logger="planner.api")
    for _ in range(100):
        health.failed(full)
    health.failed(read_only)
    assert len(_fault_lines(caplog)) == 2
    now[0] = 61.0
    health.failed(full)
    lines = _fault_lines(caplog)
    assert len(lines) == 3 and "99 more" in lines[-1], lines
    assert health.problem() is not None
    health.recovered()
    assert health.problem() is None


def test_a_solver_that_cannot_start_pauses_claims_and_says_so(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _parts(api).manager

    class NoProcess:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def start(self) -> None:
            raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(manager._ctx, "Process", NoProcess)
    started = time.monotonic()
    r = api.post("/v1/plans", json={"graph": DOC, "budget": 1.0, "method": "store-all"})
    job = _wait(api, r.json()["id"], ("failed",), 60)
    elapsed_s = time.monotonic() - started
    assert job["status"] == "failed", job
    assert "could not start" in job["error"] and "Resource temporarily" in job["error"]
    assert job["attempts"] == 2  # re-queued once, then failed
    assert elapsed_s >= SPAWN_BACKOFF_S  # claims paused after the first failure
    # while claims pause (2 x SPAWN_BACKOFF_S after the second failure) the service says why
    ready = api.get("/readyz")
    assert ready.status_code == 503 and "cannot start" in ready.text, ready.text
    monkeypatch.undo()  # the machine can fork again: ready once the pause ends
    deadline = time.monotonic() + 60
    while api.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "never ready again"
        time.sleep(0.1)
    assert api.get("/readyz").json()["running"] == 0


def _serve(port: int, database_url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT)]))
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--database-url", database_url],
        capture_output=True, text=True, timeout=60, env=env,
    )


@pytest.mark.slow
def test_serve_on_a_read_only_database_is_one_line_exit_5(tmp_path: Path) -> None:
    from planner.api.store import Store

    path = tmp_path / "s.db"
    store = Store(f"sqlite:///{path}")
    store.create_schema()
    store.dispose()
    run = _serve(free_port(), f"sqlite:///file:{path}?mode=ro&uri=true")
    assert run.returncode == 5, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1 and "read-only" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "planner service on" not in run.stdout
    missing = _serve(free_port(), f"sqlite:///{tmp_path / 'no' / 'such' / 's.db'}")
    assert missing.returncode == 5 and missing.stderr.count("\n") == 1, missing.stderr


@pytest.mark.slow
def test_serve_on_a_busy_port_exits_4_before_its_banner(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        run = _serve(busy.getsockname()[1], f"sqlite:///{tmp_path / 's.db'}")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "already in use" in run.stderr and "planner service on" not in run.stdout


@pytest.mark.parametrize("path", ["/", "/v1/methods", "/openapi.json", "/v1/plans/nope",
                                  "/docs"])
def test_security_headers_on_the_page_and_the_api(api: TestClient, path: str) -> None:
    r = api.get(path)
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


@pytest.mark.slow
def test_delete_cancels_and_removes_the_job_from_reads(api: TestClient) -> None:
    r = api.post("/v1/plans", json={"graph": DOC, "budget": 1.0, "method": "slow-test",
                                    "options": {"sleep_s": 30}})
    job_id = r.json()["id"]
    assert _wait(api, job_id, ("running",), 10)["status"] == "running"
    deleted = api.delete(f"/v1/plans/{job_id}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "cancelled"
    for method, path in (("GET", ""), ("GET", "/timeline.png"), ("DELETE", "")):
        again = api.request(method, f"/v1/plans/{job_id}{path}")
        assert again.status_code == 404 and "deleted" in again.json()["error"]["message"]
    assert _parts(api).store.get_job(job_id).status == "cancelled"  # recorded
    deadline = time.monotonic() + 5  # the killed process leaves the pool's count within moments
    while api.get("/readyz").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.get("/readyz").json()["running"] == 0
    done = api.post("/v1/plans?wait=10", json={"graph": DOC, "budget": 1.0,
                                               "method": "store-all"})
    assert api.delete(f"/v1/plans/{done.json()['id']}").status_code == 409  # an answer stays
