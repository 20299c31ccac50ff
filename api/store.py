"""The service's durable state in SQLAlchemy: graphs by content hash, jobs (the queue and the
finished plans), sweeps. SQLite file by default; any SQLAlchemy URL (PostgreSQL tested).

Every state change is one short transaction, and transitions are conditional updates
(`... WHERE status = 'running'`) so a cancel and a finish racing each other cannot both win.
Several service instances may share one database: each holds a lease in `planner_instances`
(renewed by its heartbeat, timed by the database's clock), a running job names its instance,
and only the jobs of an instance whose lease has expired are taken over (`reap`).
"""

from __future__ import annotations

from planner.service.store_db import StoreBase, log, make_engine, new_id, normalise_url
from planner.service.store_graphs import GraphsAndSweeps
from planner.service.store_jobs import JobQueue
from planner.service.store_leases import InstanceLeases

__all__ = ["GraphsAndSweeps", "InstanceLeases", "JobQueue", "Store", "StoreBase", "log",
           "make_engine", "new_id", "normalise_url"]


class Store(JobQueue, InstanceLeases, GraphsAndSweeps):
    """Repository over the tables (graphs, jobs, sweeps, instances); methods return snapshots,
    never live ORM rows. Each part is its own module: `store_db` (engine, sessions, schema),
    `store_graphs`, `store_jobs`, `store_leases`."""
