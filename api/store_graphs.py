"""The store's graphs (stored once, by content hash) and sweeps (a graph's jobs over budgets)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from planner.api.models import DEFAULT_TENANT, FINISHED, GraphRow, Job, JobRow, SweepRow
from planner.api.store_db import new_id
from planner.api.store_tenants import GraphOwnerRow, TenantStore


class GraphsAndSweeps(TenantStore):
    """Graphs by content hash (each held by the tenants that sent it), and sweeps: one graph's
    jobs in budget order."""

    def put_graph(self, graph_hash: str, document: str, nodes: int, edges: int,
                  tenant: str = DEFAULT_TENANT) -> bool:
        """Store a graph once, held by `tenant`; False when that tenant held it already (another
        tenant's copy does not count: whether it exists must not leak)."""
        self._put_graph_row(graph_hash, document, nodes, edges)
        return self.hold_graph(graph_hash, tenant)

    def _put_graph_row(self, graph_hash: str, document: str, nodes: int, edges: int) -> bool:
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

    def graph_exists(self, graph_hash: str, tenant: str | None = None) -> bool:
        with self.session() as s:
            if tenant is not None:
                return s.get(GraphOwnerRow, (graph_hash, tenant)) is not None
            found = s.scalar(select(GraphRow.hash).where(GraphRow.hash == graph_hash))
            return found is not None

    def get_graph_document(self, graph_hash: str, tenant: str | None = None) -> str | None:
        with self.session() as s:
            if tenant is not None and s.get(GraphOwnerRow, (graph_hash, tenant)) is None:
                return None
            row = s.get(GraphRow, graph_hash)
            return None if row is None else row.document

    def list_sweeps(self, limit: int, tenant: str | None = None) -> list[dict[str, Any]]:
        """The newest sweeps (of one tenant, or all): id, graph hash, method, created_at,
        number of plans and how many of them are finished."""
        query = select(SweepRow).order_by(SweepRow.created_at.desc()).limit(limit)
        if tenant is not None:
            query = query.where(SweepRow.tenant == tenant)
        with self.session() as s:
            rows = s.scalars(query).all()
            ids = {r.id: json.loads(r.job_ids) for r in rows}
            wanted = {job_id for job_ids in ids.values() for job_id in job_ids}
            finished = set(s.scalars(select(JobRow.id).where(
                JobRow.id.in_(wanted), JobRow.status.in_(FINISHED))).all()) if wanted else set()
            return [{"id": r.id, "graph_id": r.graph_hash, "method": r.method,
                     "created_at": r.created_at, "plans": len(ids[r.id]),
                     "finished": sum(job_id in finished for job_id in ids[r.id])}
                    for r in rows]

    def create_sweep(self, graph_hash: str, method: str, job_ids: list[str],
                     tenant: str = DEFAULT_TENANT) -> str:
        sweep_id = new_id()
        with self.write_session() as s:
            s.add(
                SweepRow(
                    id=sweep_id,
                    graph_hash=graph_hash,
                    method=method,
                    job_ids=json.dumps(job_ids),
                    created_at=time.time(),
                    tenant=tenant,
                )
            )
        return sweep_id

    def sweep_jobs(self, sweep_id: str, tenant: str | None = None) -> list[Job] | None:
        """The sweep's jobs in its budget order; None for an unknown sweep (or another
        tenant's)."""
        with self.session() as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is None or (tenant is not None and sweep.tenant != tenant):
                return None
            ids: list[str] = json.loads(sweep.job_ids)
            rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids))).all()}
            return [Job.from_row(rows[i]) for i in ids if i in rows]
