"""The store's jobs: the queue and the finished plans.

Transitions are conditional updates (`... WHERE status = 'running'`), so a cancel and a finish
racing each other cannot both win; a running job names the instance that owns it, and an
instance whose lease is gone claims and finishes nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from planner.api.models import (
    ACTIVE,
    CACHEABLE,
    CANCELLED,
    DEFAULT_TENANT,
    FINISHED,
    JOB_STATUSES,
    QUEUED,
    RUNNING,
    InstanceRow,
    Job,
    JobRow,
)
from planner.api.store_db import StoreBase, new_id


class JobQueue(StoreBase):
    """Jobs from submission to a finished status; methods return snapshots (`Job`)."""

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
        tenant: str = DEFAULT_TENANT,
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
            tenant=tenant,
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
        proven (optimal, or infeasible by proof), or solved with at least this time limit.
        Its plan is left unparsed (`Job.plan_text`): the answer is rendered from it once."""
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
            return None if row is None else Job.from_row(row, parse_plan=False)

    def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        """The job; None when there is none (or, with `tenant`, it is another tenant's)."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            job = None if row is None else Job.from_row(row)
            return None if job is None or tenant not in (None, job.tenant) else job

    def get_job_text(self, job_id: str,
                     tenant: str | None = None) -> tuple[Job, str | None] | None:
        """The job without its plan parsed, and the plan's stored JSON text (a large plan is
        spliced into its view, never parsed: planner.api.plan_files)."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if row is None or tenant not in (None, row.tenant or DEFAULT_TENANT):
                return None
            return Job.from_row(row, parse_plan=False), row.plan

    def job_visible(self, job_id: str, tenant: str | None = None) -> bool:
        """Whether the job exists and `tenant` may see it (None: any tenant's), without reading
        its plan: the access check before a cached answer."""
        with self.session() as s:
            owner = s.execute(select(JobRow.tenant).where(JobRow.id == job_id)).first()
        return owner is not None and tenant in (None, owner[0])

    def list_jobs(self, limit: int, status: str | None = None,
                  tenant: str | None = None) -> list[Job]:
        """The newest jobs (optionally of one status, of one tenant), without their plans: the
        report (a short summary) stays, so a list can show each finished plan's peak and
        overhead."""
        columns = [c for c in JobRow.__table__.columns if c.name != "plan"]
        query = select(*columns).order_by(JobRow.created_at.desc()).limit(limit)
        if status is not None:
            query = query.where(JobRow.status == status)
        if tenant is not None:
            query = query.where(JobRow.tenant == tenant)
        with self.session() as s:
            rows = s.execute(query).mappings().all()
        return [Job.from_row(JobRow(**dict(row), plan=None)) for row in rows]

    def statuses(self, job_ids: list[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        with self.session() as s:
            rows = s.execute(select(JobRow.id, JobRow.status).where(JobRow.id.in_(job_ids)))
            return {job_id: status for job_id, status in rows}

    def claim_next(self, instance_id: str | None = None) -> Job | None:
        """Claim the next queued job fairly: the oldest queued job of the tenant with the fewest
        running jobs (a tenant with work waiting gets a worker before another tenant's second;
        between equals, the oldest job). Pick and claim are one UPDATE statement, atomic on
        SQLite; on PostgreSQL the pick skips rows another instance is claiming (FOR UPDATE SKIP
        LOCKED) and the claim stays conditional, so two instances never claim one job. None:
        nothing queued (or this instance lost its lease)."""
        tenant = func.coalesce(JobRow.tenant, DEFAULT_TENANT)
        running = (select(tenant.label("tenant"), func.count().label("n"))
                   .where(JobRow.status == RUNNING).group_by(tenant).subquery())
        pick = (select(JobRow.id)
                .outerjoin(running, running.c.tenant == tenant)
                .where(JobRow.status == QUEUED)
                .order_by(func.coalesce(running.c.n, 0), JobRow.created_at, JobRow.id)
                .limit(1)
                .with_for_update(skip_locked=True, of=JobRow))
        with self.session() as s:  # an empty queue (the usual case) takes no write lock
            if s.scalar(select(JobRow.id).where(JobRow.status == QUEUED).limit(1)) is None:
                return None
        with self.write_session() as s:
            return self._claim_in(s, JobRow.id == pick.scalar_subquery(), instance_id)

    def tenant_waiting_without_worker(self) -> bool:
        """Whether some tenant has queued jobs and none running (on any instance): the
        dispatcher's fair time then stops a job of a tenant holding several workers."""
        tenant = func.coalesce(JobRow.tenant, DEFAULT_TENANT)
        running = select(tenant).where(JobRow.status == RUNNING)
        with self.session() as s:
            return s.scalar(select(JobRow.id).where(
                JobRow.status == QUEUED, tenant.not_in(running)).limit(1)) is not None

    def claim(self, job_id: str, instance_id: str | None = None) -> Job | None:
        """queued -> running, owned by `instance_id` (which must hold a lease); None when
        another claimer (or a cancel) got there first."""
        with self.write_session() as s:
            return self._claim_in(s, JobRow.id == job_id, instance_id)

    @staticmethod
    def _claim_in(s: Session, which: ColumnElement[bool], instance_id: str | None) -> Job | None:
        conditions = [which, JobRow.status == QUEUED]
        if instance_id is not None:  # an instance that lost its lease claims nothing
            conditions.append(
                select(InstanceRow.id).where(InstanceRow.id == instance_id).exists()
            )
        claimed = s.scalar(
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
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
        if claimed is None:
            return None
        row = s.get(JobRow, claimed, populate_existing=True)
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

    def owners(self, job_ids: list[str]) -> dict[str, tuple[str, str | None]]:
        """job id -> (status, owning instance)."""
        if not job_ids:
            return {}
        with self.session() as s:
            rows = s.execute(select(JobRow.id, JobRow.status, JobRow.owner_instance)
                             .where(JobRow.id.in_(job_ids)))
            return {job_id: (status, owner) for job_id, status, owner in rows}

    def active_count(self, tenant: str) -> int:
        """The tenant's queued and running jobs (its cap: max_active_jobs_per_tenant)."""
        with self.session() as s:
            found = s.scalar(select(func.count()).select_from(JobRow).where(
                JobRow.tenant == tenant, JobRow.status.in_(ACTIVE)))
            return int(found or 0)

    def counts_by_status(self) -> dict[str, int]:
        with self.session() as s:
            rows = s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all()
        counts = dict.fromkeys(JOB_STATUSES, 0)
        counts.update({status: int(n) for status, n in rows})
        return counts
