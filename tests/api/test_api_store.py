"""The store's leases and uniqueness, without a server: an instance's running jobs are taken
over only once its lease has expired, by exactly one reaper; a clean re-queue does not count the
attempt; one active job per question and time limit; an old database gains the new columns,
index and table in place. SQLite file and (when configured) PostgreSQL."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_server import database_url
from sqlalchemy.exc import IntegrityError

from planner.api.store import Store

LEASE_S = 0.6
JOB: dict[str, Any] = dict(graph_hash="sha256:g", budget_bytes=1000, method="chen-greedy",
                           options={}, time_limit_s=5.0)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with database_url(request.param, tmp_path) as url:
        s = Store(url)
        s.create_schema()
        try:
            yield s
        finally:
            s.dispose()


def _register(store: Store, instance_id: str) -> None:
    store.register_instance(instance_id, LEASE_S, hostname="test", pid=1, address="a:1")


def test_only_expired_instances_lose_their_jobs(store: Store) -> None:
    _register(store, "a" * 32)
    _register(store, "b" * 32)
    job = store.create_job(request_key="k1", **JOB)
    claimed = store.claim(job.id, "a" * 32)
    assert claimed is not None and claimed.owner_instance == "a" * 32 and claimed.attempts == 1
    assert store.reap("requeue", 2, "b" * 32) == []  # a's lease is fresh: nothing is taken
    time.sleep(LEASE_S + 0.3)
    assert store.heartbeat("b" * 32, LEASE_S)
    assert store.reap("requeue", 2, "b" * 32) == [(job.id, "queued")]
    assert store.reap("requeue", 2, "b" * 32) == []  # taken once
    assert not store.heartbeat("a" * 32, LEASE_S)  # a learns it lost its lease
    # a's late result is not recorded: the job is no longer its own.
    assert not store.finish(job.id, "done", instance_id="a" * 32)
    assert store.claim(job.id, "a" * 32) is None  # nor can it claim without a lease
    again = store.claim(job.id, "b" * 32)
    assert again is not None and again.attempts == 2
    assert [i["id"] for i in store.instances()] == ["b" * 32]


def test_policy_fail_and_attempts_run_out(store: Store) -> None:
    _register(store, "a" * 32)
    job = store.create_job(request_key="k2", **JOB)
    store.claim(job.id, "a" * 32)
    store.deregister_instance("a" * 32)  # as if it vanished without re-queueing
    assert store.reap("fail", 2) == [(job.id, "failed")]
    failed = store.get_job(job.id)
    assert failed is not None and "not retried" in (failed.error or "")


def test_clean_requeue_does_not_count_the_attempt(store: Store) -> None:
    _register(store, "a" * 32)
    job = store.create_job(request_key="k3", **JOB)
    store.claim(job.id, "a" * 32)
    assert store.requeue(job.id, "shut down", "a" * 32, count_attempt=False)
    back = store.get_job(job.id)
    assert back is not None and back.status == "queued" and back.attempts == 0
    assert back.owner_instance is None


def test_one_active_job_per_question_and_time_limit(store: Store) -> None:
    first, made = store.create_or_join_job(request_key="k4", **JOB)
    assert made
    with pytest.raises(IntegrityError):
        store.create_job(request_key="k4", **JOB)
    joined, made = store.create_or_join_job(request_key="k4", **JOB)
    assert joined.id == first.id and not made
    longer, made = store.create_or_join_job(request_key="k4", **{**JOB, "time_limit_s": 60.0})
    assert made and longer.id != first.id  # more time is another solve
    _register(store, "a" * 32)
    store.claim(first.id, "a" * 32)
    assert store.finish(first.id, "done", instance_id="a" * 32, proven=False)
    fresh, made = store.create_or_join_job(request_key="k4", **JOB)  # finished: free again
    assert made and fresh.id != first.id
    # The stored answer serves no longer time limit than it had, unless proven.
    assert store.find_answer("k4", 5.0) is not None
    assert store.find_answer("k4", 6.0) is None


def test_an_old_sqlite_store_gains_leases_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = Store(f"sqlite:///{path}")
    store.create_schema()
    job = store.create_job(request_key="k", **JOB)
    store.claim(job.id)  # a server from before leases: no owner
    store.dispose()
    with sqlite3.connect(path) as conn:  # the tables as they were before leases
        conn.execute("DROP INDEX uq_planner_jobs_active_request")
        conn.execute("DROP INDEX ix_planner_jobs_owner_instance")
        conn.execute("ALTER TABLE planner_jobs DROP COLUMN owner_instance")
        conn.execute("ALTER TABLE planner_jobs DROP COLUMN proven")
        conn.execute("DROP TABLE planner_instances")
    again = Store(f"sqlite:///{path}")
    again.create_schema()
    kept = again.get_job(job.id)
    assert kept is not None and kept.status == "running" and kept.owner_instance is None
    assert again.reap("requeue", 2) == [(job.id, "queued")]  # its server is gone
    with pytest.raises(IntegrityError):  # the uniqueness index was added too
        again.create_job(request_key="k", **JOB)
    again.dispose()
