"""The store's service instances and their leases: several instances may share one database.

Each holds a lease in `planner_instances`, renewed by its heartbeat and timed by the database's
clock; only the running jobs of an instance whose lease has expired are taken over (`reap`).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import and_, delete, or_, select, update

from planner.api.models import FAILED, QUEUED, RUNNING, InstanceRow, JobRow
from planner.api.store_db import StoreBase


class InstanceLeases(StoreBase):
    """Instances register, renew and drop their leases; `reap` takes over orphaned jobs."""

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
