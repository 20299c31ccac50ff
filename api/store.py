"""The service's durable state in SQLAlchemy: graphs by content hash, jobs (the queue and the
finished plans), sweeps. SQLite file by default; any SQLAlchemy URL (PostgreSQL tested).

Every state change is one short transaction, and transitions are conditional updates
(`... WHERE status = 'running'`) so a cancel and a finish racing each other cannot both win.
Several service instances may share one database: each holds a lease in `planner_instances`
(renewed by its heartbeat, timed by the database's clock), a running job names its instance,
and only the jobs of an instance whose lease has expired are taken over (`reap`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    create_engine,
    delete,
    event,
    func,
    inspect,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from planner.service.models import (
    ACTIVE,
    CACHEABLE,
    CANCELLED,
    FAILED,
    FINISHED,
    JOB_STATUSES,
    QUEUED,
    RUNNING,
    Base,
    GraphRow,
    InstanceRow,
    Job,
    JobRow,
    SweepRow,
)

log = logging.getLogger("planner.api.store")


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
        self._add_missing_indexes()

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

    def _add_missing_indexes(self) -> None:
        """Indexes added since a store was made (create_all makes them only with new tables).
        One that cannot be made (an old store holding duplicate active jobs) is logged."""
        inspector = inspect(self.engine)
        for table in Base.metadata.sorted_tables:
            present = {i["name"] for i in inspector.get_indexes(table.name)}
            for index in table.indexes:
                if index.name in present:
                    continue
                try:
                    with self.engine.begin() as conn:
                        index.create(conn)
                except DBAPIError as e:
                    log.warning("index %s not created: %s", index.name, e)

    def db_now(self) -> ColumnElement[Any]:
        """The database's clock in epoch seconds, as an SQL expression: leases are written and
        judged by one clock, whichever machines the instances run on."""
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            return func.extract("epoch", func.clock_timestamp())
        if dialect == "sqlite":  # one machine: the file's writers share its clock
            return (func.julianday("now") - 2440587.5) * 86400.0
        return literal(time.time())

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

    def create_or_join_job(self, **fields: Any) -> tuple[Job, bool]:
        """(the active job for this request key and time limit, True when made now): the
        unique index on active jobs makes identical concurrent submissions share one job."""
        for _ in range(5):
            active = self.find_active(fields["request_key"], fields["time_limit_s"])
            if active is not None:
                return active, False
            try:
                return self.create_job(**fields), True
            except IntegrityError:
                continue  # another submission made it first: join that one
        raise RuntimeError("could not create or find the active job")  # pragma: no cover

    def find_active(self, request_key: str, time_limit_s: float) -> Job | None:
        with self.session() as s:
            row = s.scalars(
                select(JobRow).where(
                    JobRow.request_key == request_key,
                    JobRow.time_limit_s == time_limit_s,
                    JobRow.status.in_(ACTIVE),
                ).limit(1)
            ).first()
            return None if row is None else Job.from_row(row)

    def find_answer(self, request_key: str, time_limit_s: float) -> Job | None:
        """The newest finished answer to this question that no more search could improve:
        proven (optimal, or infeasible by proof), or solved with at least this time limit."""
        with self.session() as s:
            row = s.scalars(
                select(JobRow)
                .where(
                    JobRow.request_key == request_key,
                    JobRow.status.in_(CACHEABLE),
                    or_(JobRow.proven.is_(True), JobRow.time_limit_s >= time_limit_s),
                )
                .order_by(JobRow.created_at.desc())
                .limit(1)
            ).first()
            return None if row is None else Job.from_row(row)

    def get_job(self, job_id: str) -> Job | None:
        with self.session() as s:
            row = s.get(JobRow, job_id)
            return None if row is None else Job.from_row(row)

    def list_jobs(self, limit: int, status: str | None = None) -> list[Job]:
        """The newest jobs (optionally of one status), without their plans and reports."""
        columns = [c for c in JobRow.__table__.columns
                   if c.name not in ("plan", "report")]
        query = select(*columns).order_by(JobRow.created_at.desc()).limit(limit)
        if status is not None:
            query = query.where(JobRow.status == status)
        with self.session() as s:
            rows = s.execute(query).mappings().all()
        return [Job.from_row(JobRow(**dict(row), plan=None, report=None)) for row in rows]

    def list_sweeps(self, limit: int) -> list[dict[str, Any]]:
        """The newest sweeps: id, graph hash, method, created_at, number of plans."""
        with self.session() as s:
            rows = s.scalars(
                select(SweepRow).order_by(SweepRow.created_at.desc()).limit(limit)
            ).all()
            return [{"id": r.id, "graph_id": r.graph_hash, "method": r.method,
                     "created_at": r.created_at, "plans": len(json.loads(r.job_ids))}
                    for r in rows]

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

    def claim(self, job_id: str, instance_id: str | None = None) -> Job | None:
        """queued -> running, owned by `instance_id` (which must hold a lease); None when
        another claimer (or a cancel) got there first."""
        conditions = [JobRow.id == job_id, JobRow.status == QUEUED]
        if instance_id is not None:  # an instance that lost its lease claims nothing
            conditions.append(
                select(InstanceRow.id).where(InstanceRow.id == instance_id).exists()
            )
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(*conditions)
                .values(
                    status=RUNNING,
                    attempts=JobRow.attempts + 1,
                    started_at=time.time(),
                    progress_objective=None,
                    progress_bound=None,
                    owner_instance=instance_id,
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
        instance_id: str | None = None,
        proven: bool = False,
    ) -> bool:
        """running -> a finished status; False when the job was cancelled meanwhile, or (with
        `instance_id`) is no longer that instance's (its lease expired and others took it)."""
        conditions = [JobRow.id == job_id, JobRow.status == RUNNING]
        if instance_id is not None:
            conditions.append(JobRow.owner_instance == instance_id)
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(*conditions)
                .values(
                    status=status,
                    plan=plan,
                    report=None if report is None else json.dumps(report),
                    error=error,
                    solve_seconds=solve_seconds,
                    finished_at=time.time(),
                    worker_pid=None,
                    proven=proven,
                )
            )
            return result.rowcount == 1  # type: ignore[attr-defined]

    def requeue(
        self, job_id: str, reason: str, instance_id: str | None = None, *,
        count_attempt: bool = True,
    ) -> bool:
        """running -> queued; the reason stays visible in `error`. A clean shutdown passes
        count_attempt=False: the interrupted run is not held against the job."""
        conditions = [JobRow.id == job_id, JobRow.status == RUNNING]
        if instance_id is not None:
            conditions.append(JobRow.owner_instance == instance_id)
        attempts: Any = JobRow.attempts
        if not count_attempt:  # claim() counted it: take it back
            attempts = case((JobRow.attempts > 0, JobRow.attempts - 1), else_=0)
        with self.write_session() as s:
            result = s.execute(
                update(JobRow)
                .where(*conditions)
                .values(status=QUEUED, error=reason, worker_pid=None, started_at=None,
                        owner_instance=None, attempts=attempts)
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

    # -- instances and their leases ------------------------------------------------------------
    def register_instance(
        self, instance_id: str, lease_s: float, *, hostname: str, pid: int, address: str
    ) -> None:
        now = self.db_now()
        with self.write_session() as s:
            s.execute(
                InstanceRow.__table__.insert().values(  # type: ignore[attr-defined]
                    id=instance_id, hostname=hostname[:255], pid=pid, address=address[:255],
                    started_at=now, heartbeat_at=now, lease_expires_at=now + lease_s,
                )
            )

    def heartbeat(self, instance_id: str, lease_s: float) -> bool:
        """Renew the lease; False when the row is gone: the lease expired and another
        instance took this one's jobs over (then stop them and register anew)."""
        now = self.db_now()
        with self.write_session() as s:
            result = s.execute(
                update(InstanceRow)
                .where(InstanceRow.id == instance_id)
                .values(heartbeat_at=now, lease_expires_at=now + lease_s)
            )
            return result.rowcount == 1  # type: ignore[attr-defined]

    def deregister_instance(self, instance_id: str) -> None:
        with self.write_session() as s:
            s.execute(delete(InstanceRow).where(InstanceRow.id == instance_id))

    def instances(self) -> list[dict[str, Any]]:
        """The registered instances with the seconds left on each lease (negative: expired)."""
        with self.session() as s:
            rows = s.execute(
                select(InstanceRow.id, InstanceRow.hostname, InstanceRow.pid,
                       InstanceRow.address, InstanceRow.lease_expires_at - self.db_now())
            ).all()
        return [{"id": i, "hostname": h, "pid": p, "address": a, "lease_left_s": float(left)}
                for i, h, p, a, left in rows]

    def reap(self, policy: str, max_attempts: int, reaper_id: str | None = None
             ) -> list[tuple[str, str]]:
        """Take over the running jobs whose instance is gone: its lease expired (its row is then
        deleted, by exactly one reaper), or it has no row (a server from before leases). Those
        are re-queued while attempts remain (or, with policy "fail", failed with the reason).
        Jobs of live instances are never touched, nor the reaper's own lease (`reaper_id`: it
        has just renewed it). Returns (job id, new status) pairs."""
        with self.write_session() as s:
            expired = list(s.scalars(
                select(InstanceRow.id).where(InstanceRow.lease_expires_at < self.db_now(),
                                             InstanceRow.id != (reaper_id or ""))
            ))
            for instance_id in expired:
                s.execute(delete(InstanceRow).where(
                    InstanceRow.id == instance_id,
                    InstanceRow.lease_expires_at < self.db_now(),
                ))
        live = select(InstanceRow.id)
        with self.session() as s:
            orphans = s.execute(
                select(JobRow.id, JobRow.owner_instance, JobRow.attempts).where(
                    JobRow.status == RUNNING,
                    or_(JobRow.owner_instance.is_(None), JobRow.owner_instance.not_in(live)),
                )
            ).all()
        changed: list[tuple[str, str]] = []
        for job_id, owner, attempts in orphans:
            same_owner = (JobRow.owner_instance.is_(None) if owner is None
                          else JobRow.owner_instance == owner)
            if policy == "requeue" and attempts < max_attempts:
                values: dict[str, Any] = {
                    "status": QUEUED,
                    "error": f"its server stopped during attempt {attempts}; re-queued",
                    "started_at": None,
                }
            else:
                values = {
                    "status": FAILED,
                    "error": f"its server stopped while this job ran (attempt {attempts} of "
                    f"{max_attempts}); not retried",
                    "finished_at": time.time(),
                }
            with self.write_session() as s:
                result = s.execute(
                    update(JobRow)
                    .where(and_(JobRow.id == job_id, JobRow.status == RUNNING, same_owner,
                                or_(JobRow.owner_instance.is_(None),
                                    JobRow.owner_instance.not_in(live))))
                    .values(worker_pid=None, owner_instance=None, **values)
                )
                if result.rowcount == 1:  # type: ignore[attr-defined]
                    changed.append((job_id, values["status"]))
        return changed

    def owners(self, job_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """job id -> (status, owning instance)."""
        if not job_ids:
            return {}
        with self.session() as s:
            rows = s.execute(select(JobRow.id, JobRow.status, JobRow.owner_instance)
                             .where(JobRow.id.in_(job_ids)))
            return {job_id: (status, owner) for job_id, status, owner in rows}

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
