"""Helpers of the service tests: a real server (`planner-cli serve`) in a subprocess on
127.0.0.1, fresh PostgreSQL databases, plan checks, and a slow method for cancel/restart tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from planner.core.graph import Graph
from planner.core.plan import Plan
from planner.sim.simulator import simulate
from planner.solvers.request import MethodResult, SolveRequest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
SLOW_METHOD = {"slow-test": "api_server:slow_method"}
FINISHED = ("done", "infeasible", "failed", "cancelled")
POSTGRES_ENV = "PLANNER_TEST_POSTGRES_URL"
TEST_LEASE_S = 3.0


def slow_method(request: SolveRequest) -> MethodResult:
    """chen-greedy after `options["sleep_s"]` seconds of reported progress: a solve that is
    reliably still running when a test cancels it or kills the server."""
    from planner.solvers.baseline_methods import chen_greedy

    if request.options.get("freeze"):  # stops every thread: no fallback plan can answer
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
    end = time.monotonic() + float(request.options.get("sleep_s", 5.0))
    while time.monotonic() < end:
        if request.progress is not None:
            request.progress(None, request.graph.total_compute_ms)
        time.sleep(0.05)
    return chen_greedy(request)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`planner-cli serve` on a free loopback port; settings through PLANNER_* variables."""

    def __init__(self, workdir: Path, database_url: str, **settings: Any) -> None:
        self.workdir = workdir
        self.database_url = database_url
        # A short lease, so a restart after kill -9 takes the dead instance's jobs soon.
        settings.setdefault("instance_lease_s", TEST_LEASE_S)
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        self.port = free_port()
        self.proc = self.spawn(self.port)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout_s} s:\n{self.log()}")

    def spawn(self, port: int) -> subprocess.Popen[bytes]:
        """`planner-cli serve` on `port` with this server's settings, its output in the log."""
        env = dict(os.environ)
        env.update(
            PLANNER_DATABASE_URL=self.database_url,
            PLANNER_EXTRA_METHODS=json.dumps(SLOW_METHOD),
            PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT), env.get("PYTHONPATH", "")]),
            MPLBACKEND="Agg",
        )
        # Where a non-SQLite store's "keys were configured" marker goes: the test's own folder,
        # so a PostgreSQL database name reused by another test starts as new.
        env.setdefault("PLANNER_STATE_DIR", str(self.workdir / "planner-state"))
        for key, value in self.settings.items():
            env[f"PLANNER_{key.upper()}"] = str(value)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "planner.cli.main", "serve", "--host", "127.0.0.1",
                 "--port", str(port)],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)


@contextmanager
def running_server(workdir: Path, database_url: str, **settings: Any) -> Iterator[ServerProcess]:
    server = ServerProcess(workdir, database_url, **settings).start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new database on the server named by PLANNER_TEST_POSTGRES_URL, dropped afterwards."""
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        pytest.skip(
            f"{POSTGRES_ENV} is not set: scripts/test sets it from scripts/ensure_postgres.sh "
            "where PostgreSQL can be installed and started"
        )
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from planner.api.store import Store, normalise_url

    url = make_url(normalise_url(base))
    name = f"planner_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except DBAPIError:
        # No CREATEDB right: use the given database, emptied of the service's tables.
        admin.dispose()
        store = Store(base)
        store.drop_schema()
        try:
            yield base
        finally:
            store.drop_schema()
            store.dispose()
        return
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@contextmanager
def database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "postgres":
        with fresh_postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'service.db'}"


def wait_finished(client: httpx.Client, plan_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = client.get(f"/v1/plans/{plan_id}")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if body["status"] in FINISHED:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"plan {plan_id} still {body['status']} after {timeout_s} s")
        time.sleep(0.05)


def wait_status(client: httpx.Client, plan_id: str, status: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/plans/{plan_id}").json()
        if body["status"] == status:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"plan {plan_id} is {body['status']}, never {status}")
        time.sleep(0.05)


def assert_valid_plan(graph: Graph, answer: dict[str, Any]) -> Plan:
    """The served plan, replayed by the simulator: within budget, as the report says."""
    assert answer["status"] == "done", answer
    plan = Plan.model_validate(answer["plan"])
    sim = simulate(graph, plan.actions)
    assert sim.peak_bytes <= answer["budget_bytes"]
    assert plan.graph_hash == graph.content_hash()
    assert answer["report"]["peak_bytes"] == sim.peak_bytes
    return plan


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """True once `pid` no longer runs (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False
