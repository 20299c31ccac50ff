"""The service's durable state in SQLAlchemy: graphs by content hash, jobs (the queue and the
finished plans), sweeps. SQLite file by default; any SQLAlchemy URL (PostgreSQL tested).

Every state change is one short transaction, and transitions are conditional updates
(`... WHERE status = 'running'`) so a cancel and a finish racing each other cannot both win.
Several service instances may share one database: each holds a lease in `planner_instances`
(renewed by its heartbeat, timed by the database's clock), a running job names its instance,
and only the jobs of an instance whose lease has expired are taken over (`reap`).
"""

from __future__ import annotations

from planner.api.store_db import StoreBase, log, make_engine, new_id, normalise_url
from planner.api.store_graphs import GraphsAndSweeps
from planner.api.store_jobs import JobQueue
from planner.api.store_leases import InstanceLeases
from planner.api.store_tenants import TenantStore

__all__ = ["GraphsAndSweeps", "InstanceLeases", "JobQueue", "Store", "StoreBase",
           "TenantStore", "log", "make_engine", "new_id", "normalise_url"]


class Store(JobQueue, InstanceLeases, GraphsAndSweeps, TenantStore):
    """Repository over the tables (graphs, jobs, sweeps, instances, API keys); methods return
    snapshots, never live ORM rows. Each part is its own module: `store_db` (engine, sessions,
    schema), `store_graphs`, `store_jobs`, `store_leases`, `store_tenants`.

    Reads that serve a request take `tenant`: that tenant's rows only (None: every tenant's,
    for an admin key and the service itself)."""

    def create_schema(self) -> None:
        super().create_schema()
        self.adopt_untenanted_rows()
