"""A database dropped and created again under a running service (its tables gone), or dropped
for good, answers 503 with a one-line cause, not 500 (issue 50): on PostgreSQL (when
PLANNER_TEST_POSTGRES_URL is set) and on SQLite (its tables dropped)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_server import ServerProcess, database_url, running_server

from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with database_url(request.param, tmp_path) as url, \
            running_server(tmp_path, url, workers=1) as srv:
        yield srv


def _drop_tables(url: str) -> None:
    from planner.api.store import Store

    store = Store(url)
    try:
        store.drop_schema()
    finally:
        store.dispose()


def _recreate_database(url: str) -> bool:
    """DROP DATABASE ... WITH (FORCE) and CREATE it again, empty (PostgreSQL; False where the
    role may not)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from planner.api.store import normalise_url

    target = make_url(normalise_url(url))
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{target.database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{target.database}"'))
        return True
    except DBAPIError:
        return False
    finally:
        admin.dispose()


def _assert_503(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"].startswith("storage_")
    assert "\n" not in error["message"]
    assert answer.headers.get("Retry-After")


def test_a_database_that_lost_its_tables_answers_503(server: ServerProcess) -> None:
    with server.client() as client:
        job = client.post("/v1/plans?wait=30", json={"graph": DOC, "budget": 0.9,
                                                     "method": "chen-greedy"}).json()
        if server.database_url.startswith("postgresql") and _recreate_database(
                server.database_url):
            pass
        else:
            _drop_tables(server.database_url)
        _assert_503(client.post("/v1/plans", json={"graph": DOC, "budget": 0.8,
                                                   "method": "chen-greedy", "force": True}))
        _assert_503(client.get("/v1/plans"))
        _assert_503(client.post("/v1/graphs", json=DOC))
        deadline = time.monotonic() + 10
        while (ready := client.get("/readyz")).status_code != 503:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.2)
        assert ready.json()["error"]["code"].startswith("storage_")
        assert client.get(f"/v1/plans/{job['id']}").status_code in (200, 503)
    log = server.log()
    assert "Traceback" not in log, log
