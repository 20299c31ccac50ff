"""A store made before a column existed gains it in place, keeping what it holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from planner.api.store import Store


def test_old_sqlite_store_gains_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = Store(f"sqlite:///{path}")
    store.create_schema()
    job = store.create_job(request_key="k", graph_hash="sha256:x", budget_bytes=10,
                           method="store-all", options={}, time_limit_s=1.0)
    store.dispose()
    with sqlite3.connect(path) as conn:  # the jobs table as it was before `resources`
        conn.execute("ALTER TABLE planner_jobs DROP COLUMN resources")
    again = Store(f"sqlite:///{path}")
    again.create_schema()
    kept = again.get_job(job.id)
    assert kept is not None and kept.budget_bytes == 10 and kept.resources is None
    with_machine = again.create_job(request_key="k2", graph_hash="sha256:x", budget_bytes=10,
                                    method="store-all", options={}, time_limit_s=1.0,
                                    resources={"device_memory_bytes": 10})
    assert again.get_job(with_machine.id).resources == {"device_memory_bytes": 10}  # type: ignore[union-attr]
    again.dispose()
