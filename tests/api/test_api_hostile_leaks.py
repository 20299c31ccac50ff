"""Issue 50, item 9: what a caller without a key learns. While PostgreSQL is down, /readyz and
every 503 named the database's host and port (the driver's text); /metrics gave every tenant's
job counts to anyone. Now clients read the cause and SQLSTATE (the log keeps the text), and with
keys configured /metrics needs the admin key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_server import free_port
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker
from test_api_tenants import PLAN, add_key, bearer, make_client

from planner.api.store import Store, make_engine


@contextmanager
def postgres_gone(client: TestClient, port: int) -> Iterator[None]:
    """The app's store pointed at a PostgreSQL that does not answer (a closed loopback port),
    as when the database server stops; restored afterwards so the app shuts down cleanly."""
    store: Store = client.app.state.parts.store  # type: ignore[attr-defined]
    engine, sessions = store.engine, store._sessions
    down = make_engine(f"postgresql+psycopg://planner:secret@127.0.0.1:{port}/planner")
    store.engine, store._sessions = down, sessionmaker(down, expire_on_commit=False)
    try:
        yield
    finally:
        store.engine, store._sessions = engine, sessions
        down.dispose()


def test_a_stopped_postgres_never_names_its_host_or_port(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    port = free_port()
    with make_client(f"sqlite:///{tmp_path / 's.db'}") as client, postgres_gone(client, port):
        answers = [client.get("/readyz"), client.post("/v1/plans", json=PLAN),
                   client.get("/v1/plans")]
        for answer in answers:
            assert answer.status_code == 503, answer.text
            text = answer.text + str(answer.headers)
            assert str(port) not in text and "127.0.0.1" not in text, text
            assert "secret" not in text and "planner:" not in text
        assert "cannot be opened or reached" in answers[0].json()["error"]["message"]


def test_metrics_need_the_admin_key_when_keys_are_configured(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    tenant = add_key(url, "team-a")["key"]
    admin = add_key(url, "ops", "--admin")["key"]
    with make_client(url) as client:
        assert client.get("/metrics").status_code == 401
        refused = client.get("/metrics", headers=bearer(tenant))
        assert refused.status_code == 403 and "admin key" in refused.json()["error"]["message"]
        assert "planner_jobs" not in refused.text
        scraped = client.get("/metrics", headers=bearer(admin))
        assert scraped.status_code == 200 and 'planner_jobs{status="done"}' in scraped.text
        assert client.get("/readyz").status_code == 200  # probes stay open
