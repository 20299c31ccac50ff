"""The stored records: graphs by content hash, jobs (the queue and the finished plans), sweeps;
and `Job`, the immutable snapshot of a job row that the rest of the service passes around."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

QUEUED, RUNNING, DONE, INFEASIBLE, FAILED, CANCELLED = (
    "queued",
    "running",
    "done",
    "infeasible",
    "failed",
    "cancelled",
)
JOB_STATUSES = (QUEUED, RUNNING, DONE, INFEASIBLE, FAILED, CANCELLED)
ACTIVE = (QUEUED, RUNNING)
ACTIVE_CONDITION = "status IN ('queued', 'running')"
FINISHED = (DONE, INFEASIBLE, FAILED, CANCELLED)
# A request with one of these results is answered from the store instead of solved again.
CACHEABLE = (DONE, INFEASIBLE)
# Whose rows are whose (planner.api.store_tenants): rows from before tenants, and every row
# of a service without API keys, belong to this one.
DEFAULT_TENANT = "default"


class Base(DeclarativeBase):
    pass


class GraphRow(Base):
    __tablename__ = "planner_graphs"

    hash: Mapped[str] = mapped_column(String(80), primary_key=True)
    document: Mapped[str] = mapped_column(Text)  # graph.json as uploaded (validated)
    nodes: Mapped[int] = mapped_column(Integer)
    edges: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)  # epoch seconds


class InstanceRow(Base):
    """A running service instance and its lease: it renews `lease_expires_at` while alive; once
    that passes, any instance may take over its running jobs (Store.reap)."""

    __tablename__ = "planner_instances"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    address: Mapped[str] = mapped_column(String(255), default="")  # host:port it serves on
    started_at: Mapped[float] = mapped_column(Float)
    # Both in the database's clock (Store.db_now), so instances need no clock agreement.
    heartbeat_at: Mapped[float] = mapped_column(Float)
    lease_expires_at: Mapped[float] = mapped_column(Float, index=True)


class JobRow(Base):
    __tablename__ = "planner_jobs"
    __table_args__ = (
        # One active job per question and time limit: identical concurrent POSTs share it.
        Index(
            "uq_planner_jobs_active_request",
            "request_key",
            "time_limit_s",
            unique=True,
            sqlite_where=text(ACTIVE_CONDITION),
            postgresql_where=text(ACTIVE_CONDITION),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # sha256 of (graph hash, budget, method, options): equal keys are the same question.
    request_key: Mapped[str] = mapped_column(String(64), index=True)
    graph_hash: Mapped[str] = mapped_column(String(80), index=True)
    budget_bytes: Mapped[int] = mapped_column(BigInteger)
    method: Mapped[str] = mapped_column(String(64))
    options: Mapped[str] = mapped_column(Text, default="{}")
    # resources.json of the machine planned for; NULL: a bare budget (one device, no host tier).
    resources: Mapped[str | None] = mapped_column(Text, nullable=True)
    time_limit_s: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    plan: Mapped[str | None] = mapped_column(Text, nullable=True)  # plan.json
    report: Mapped[str | None] = mapped_column(Text, nullable=True)  # summary JSON
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    progress_objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress_bound: Mapped[float | None] = mapped_column(Float, nullable=True)
    worker_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    solve_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The instance whose dispatcher runs (or last ran) the job; see InstanceRow.
    owner_instance: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # True when more search cannot change the answer (optimal, or infeasible by proof): it then
    # answers requests with any time limit; otherwise only those allowing no more time than it had.
    proven: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # The tenant that submitted it (NULL only before create_schema adopts an old store's rows).
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)


class SweepRow(Base):
    __tablename__ = "planner_sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    graph_hash: Mapped[str] = mapped_column(String(80))
    method: Mapped[str] = mapped_column(String(64))
    job_ids: Mapped[str] = mapped_column(Text)  # JSON list, in budget order (cache hits too)
    created_at: Mapped[float] = mapped_column(Float)
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)


@dataclass(frozen=True)
class Job:
    """A snapshot of one job row."""

    id: str
    request_key: str
    graph_hash: str
    budget_bytes: int
    method: str
    options: dict[str, Any]
    time_limit_s: float
    status: str
    attempts: int
    plan: dict[str, Any] | None
    report: dict[str, Any] | None
    error: str | None
    progress_objective: float | None
    progress_bound: float | None
    worker_pid: int | None
    solve_seconds: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    resources: dict[str, Any] | None = None
    owner_instance: str | None = None
    proven: bool = False
    tenant: str = DEFAULT_TENANT
    # The plan's stored JSON text where `plan` was left unparsed (a large plan is spliced into
    # its view, never parsed: planner.api.plan_files).
    plan_text: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: JobRow, *, parse_plan: bool = True) -> Job:
        """The row as a job (`parse_plan=False`: without its plan, which may be large)."""
        return cls(
            id=row.id,
            request_key=row.request_key,
            graph_hash=row.graph_hash,
            budget_bytes=row.budget_bytes,
            method=row.method,
            options=json.loads(row.options or "{}"),
            time_limit_s=row.time_limit_s,
            status=row.status,
            attempts=row.attempts,
            plan=json.loads(row.plan) if row.plan and parse_plan else None,
            report=json.loads(row.report) if row.report else None,
            error=row.error,
            progress_objective=row.progress_objective,
            progress_bound=row.progress_bound,
            worker_pid=row.worker_pid,
            solve_seconds=row.solve_seconds,
            created_at=row.created_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            resources=json.loads(row.resources) if row.resources else None,
            owner_instance=row.owner_instance,
            proven=bool(row.proven),
            tenant=row.tenant or DEFAULT_TENANT,
            plan_text=None if parse_plan else row.plan,
        )
