"""A store that refuses writes at shutdown (a read-only filesystem, a full disk) is one line
per failed write in the log, not a traceback each (issue 50 item 8: three full tracebacks)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_server import SLOW_METHOD
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")


@pytest.mark.parametrize("message", ["disk I/O error", "attempt to write a readonly database"])
def test_shutdown_on_a_store_that_refuses_writes_logs_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, message: str
) -> None:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    @contextmanager
    def broken() -> Iterator[None]:
        raise OperationalError("UPDATE ...", {}, sqlite3.OperationalError(message))
        yield  # pragma: no cover

    settings = Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", workers=1,
                        extra_methods=SLOW_METHOD)
    caplog.set_level(logging.INFO)
    with TestClient(create_app(settings)) as client:
        job = client.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "slow-test",
                                             "options": {"sleep_s": 30}}).json()
        deadline = time.monotonic() + 30
        while client.get(f"/v1/plans/{job['id']}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        store = client.app.state.parts.store  # type: ignore[attr-defined]
        store.write_session = broken
        caplog.clear()
    traced = [r for r in caplog.records
              if r.exc_info or r.exc_text or "Traceback" in r.getMessage()]
    assert not traced, [r.getMessage() for r in traced]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("re-queue" in line and job["id"] in line for line in lines), lines
    assert any("lease" in line for line in lines), lines
    assert all("\n" not in line for line in lines), lines
