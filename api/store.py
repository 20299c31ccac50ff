"""The service's durable state in SQLAlchemy: graphs by content hash, jobs (the queue and the
finished plans), sweeps. SQLite file by default; any SQLAlchemy URL (PostgreSQL tested).

Every state change is one short transaction, and transitions are conditional updates
(`... WHERE status = 'running'`) so a cancel and a finish racing each other cannot both win.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event, func, inspect, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.models import (
    CANCELLED,
    FAILED,
    FINISHED,
    JOB_STATUSES,
    QUEUED,
    RUNNING,
    Base,
    GraphRow,
    Job,
    JobRow,
    SweepRow,
)


def new_id() -> str:
    return uuid.uuid4().hex


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 here (psycopg2 is not installed)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets readers run beside the writer; FULL sync keeps finished plans on a crash.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Store:
    """Repository over the three tables; methods return snapshots, never live ORM rows."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time and, when busy, sleeps in growing steps (and a read
        # that turns into a write can fail outright): this process's writers take turns here.
        self._write_lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if self.engine.dialect.name == "sqlite" else contextlib.nullcontext()
        )

    def create_schema(self) -> None:
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Columns added since a store was made (all nullable) are added in place, so an
        existing database keeps its graphs and plans."""
        inspector = inspect(self.engine)
        with self.engine.begin() as conn:
            for table in Base.metadata.sorted_tables:
                present = {c["name"] for c in inspector.get_columns(table.name)}
                for column in table.columns:
                    if column.name not in present and column.nullable:
                        kind = column.type.compile(dialect=self.engine.dialect)
                        conn.execute(text(
                            f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'
                        ))

    def drop_schema(self) -> None:
        Base.metadata.drop_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        with self._write_lock, self.session() as s:
            yield s

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # -- graphs -------------------------------------------------------------------------------
    def put_graph(self, graph_hash: str, document: str, nodes: int, edges: int) -> bool:
        """Store a graph once; False when it was there already."""
        try:
            with self.write_session() as s:
                if s.get(GraphRow, graph_hash) is not None:
                    return False
                s.add(
                    GraphRow(
                        hash=graph_hash,
                        document=document,
                        nodes=nodes,
                        edges=edges,
                        created_at=time.time(),
                    )
                )
            return True
        except IntegrityError:  # a concurrent upload of the same graph won
            return False

    def graph_exists(self, graph_hash: str) -> bool:
        with self.session() as s:
            found = s.scalar(select(GraphRow.hash).where(GraphRow.hash == graph_hash))
            return found is not None

    def get_graph_document(self, graph_hash: str) -> str | None:
        with self.session() as s:
            row = s.get(GraphRow, graph_hash)
            return None if row is None else row.document

    # -- jobs ---------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        request_key: str,
        graph_hash: str,
        budget_bytes: int,
        method: str,
        options: dict[str, Any],
        time_limit_s: float,
        resources: dict[str, Any] | None = None,
    ) -> Job:
        row = JobRow(
            id=new_id(),
            request_key=request_key,
            graph_hash=graph_hash,
            budget_bytes=budget_bytes,
            method=method,
            options=json.dumps(options, sort_keys=True),
            resources=None if resources is None else json.dumps(resources, sort_keys=True),
            time_limit_s=time_limit_s,
            status=QUEUED,
            attempts=0,
            created_at=time.time(),
        )
        with self.write_session() as s:
            s.add(row)
        return Job.from_row(row)

    def get_job(self, job_id: str) -> Job | None:
        with self.session() as s:
            row = s.get(JobRow, job_id)
            return None if row is None else Job.from_row(row)

    def find_by_key(self, request_key: str, statuses: tuple[str, ...]) -> Job | None:
        """The newest job asking the same question with one of `statuses`."""
        with self.session() as s:
            row = s.scalars(
                select(JobRow)
                .where(JobRow.request_key == request_key, JobRow.status.in_(statuses))
                .order_by(JobRow.created_at.desc())
                .limit(1)
            ).first()
            return None if row is None else Job.from_row(row)

    def statuses(self, job_ids: list[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        with self.session() as s:
            rows = s.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(job_ids)))
            return {job_id: status for job_id, status in rows}

    def queued_ids(self, limit: int) -> list[str]:
        with self.session() as s:
            return list(
                s.scalars(
                    select(JobRow.id)
                    .where(JobRow.status == QUEUED)
                    .order_by(JobRow.created_at)
                    .limit(limit)
                )
            )

    def claim(self, job_id: str) -> Job | None:
        """queued -> running; None when another claimer (or a cancel) got there first."""
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == QUEUED)
                .values(
                    status=RUNNING,
                    attempts=JobRow.attempts + 1,
                    started_at=time.time(),
                    progress_objective=None,
                    progress_bound=None,
                )
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                return None
            row = s.get(JobRow, job_id)
            return None if row is None else Job.from_row(row)

    def set_worker(self, job_id: str, pid: int | None) -> None:
        with self.write_session() as s:
            s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RUNNING)
                .values(worker_pid=pid)
            )

    def set_progress(self, job_id: str, objective: float | None, bound: float | None) -> None:
        with self.write_session() as s:
            s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RUNNING)
                .values(progress_objective=objective, progress_bound=bound)
            )

    def finish(
        self,
        job_id: str,
        status: str,
        *,
        plan: str | None = None,
        report: dict[str, Any] | None = None,
        error: str | None = None,
        solve_seconds: float | None = None,
    ) -> bool:
        """running -> a finished status; False when the job was cancelled meanwhile."""
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RUNNING)
                .values(
                    status=status,
                    plan=plan,
                    report=None if report is None else json.dumps(report),
                    error=error,
                    solve_seconds=solve_seconds,
                    finished_at=time.time(),
                    worker_pid=None,
                )
            )
            return result.rowcount == 1  # type: ignore[attr-defined]

    def requeue(self, job_id: str, reason: str) -> bool:
        """running -> queued (shutdown, restart); the reason stays visible in `error`."""
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RUNNING)
                .values(status=QUEUED, error=reason, worker_pid=None, started_at=None)
            )
            return result.rowcount == 1  # type: ignore[attr-defined]

    def cancel(self, job_id: str) -> str | None:
        """queued/running -> cancelled; returns the status it had, None if it was finished."""
        with self.write_session() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.status in FINISHED:
                return None
            before = row.status
            result = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == before)
                .values(
                    status=CANCELLED,
                    error="cancelled by request",
                    finished_at=time.time(),
                    worker_pid=None,
                )
            )
            return before if result.rowcount == 1 else None  # type: ignore[attr-defined]

    def recover(self, policy: str, max_attempts: int) -> list[tuple[str, str]]:
        """At start-up: jobs left running by a server that died are re-queued (while attempts
        remain) or failed with the reason. Returns (job id, new status) pairs."""
        changed: list[tuple[str, str]] = []
        with self.write_session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.status == RUNNING)).all()
            for row in rows:
                if policy == "requeue" and row.attempts < max_attempts:
                    row.status = QUEUED
                    row.error = (
                        f"the server stopped during attempt {row.attempts}; re-queued at restart"
                    )
                else:
                    row.status = FAILED
                    row.error = (
                        f"the server stopped while this job ran (attempt {row.attempts} of "
                        f"{max_attempts}); not retried"
                    )
                    row.finished_at = time.time()
                row.worker_pid = None
                changed.append((row.id, row.status))
        return changed

    def counts_by_status(self) -> dict[str, int]:
        with self.session() as s:
            rows = s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all()
        counts = dict.fromkeys(JOB_STATUSES, 0)
        counts.update({status: int(n) for status, n in rows})
        return counts

    # -- sweeps -------------------------------------------------------------------------------
    def create_sweep(self, graph_hash: str, method: str, job_ids: list[str]) -> str:
        sweep_id = new_id()
        with self.write_session() as s:
            s.add(
                SweepRow(
                    id=sweep_id,
                    graph_hash=graph_hash,
                    method=method,
                    job_ids=json.dumps(job_ids),
                    created_at=time.time(),
                )
            )
        return sweep_id

    def sweep_jobs(self, sweep_id: str) -> list[Job] | None:
        """The sweep's jobs in its budget order; None for an unknown sweep."""
        with self.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is None:
                return None
            ids: list[str] = json.loads(sweep.job_ids)
            rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids))).all()}
            return [Job.from_row(rows[i]) for i in ids if i in rows]
