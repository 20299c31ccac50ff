"""/v1/sweeps: one plan per budget on the same graph, reported as the engine's monotone curve."""

from __future__ import annotations

from fastapi import APIRouter, Query

from planner.api.deps import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    Identity,
    Parts,
    StoreDep,
    error_responses,
)
from planner.api.errors import ApiError
from planner.api.schemas import SweepEntry, SweepList, SweepRequest, SweepSummary, SweepView
from planner.api.store import Store

router = APIRouter(prefix="/v1")


@router.post(
    "/sweeps",
    status_code=202,
    response_model=SweepView,
    responses=error_responses(*COMMON_ERRORS, 404, 429),
    summary="One plan per budget on the same graph",
)
def submit_sweep(body: SweepRequest, parts: Parts, who: Identity) -> SweepView:
    most = parts.settings.max_sweep_budgets
    if len(body.budgets) > most:
        raise ApiError(
            422,
            f"budgets: {len(body.budgets)} budgets, over this server's limit of "
            f"max_sweep_budgets={most}",
            details={"limit": "max_sweep_budgets", "max": most},
        )
    parts.limiter.check(who, cost=len(body.budgets))
    requests = parts.service.resolve_sweep(body, who.tenant)
    parts.service.check_active_cap(who.tenant, adding=len(requests))
    jobs = [parts.service.submit(request, force=body.force, tenant=who.tenant)[0]
            for request in requests]
    sweep_id = parts.store.create_sweep(requests[0].graph_hash, body.method,
                                        [j.id for j in jobs], who.tenant)
    return sweep_view(parts.store, sweep_id, who.scope)


@router.get(
    "/sweeps",
    response_model=SweepList,
    responses=error_responses(*AUTH_ERRORS, 422),
    summary="The newest sweeps",
)
def list_sweeps(store: StoreDep, who: Identity,
                limit: int = Query(default=50, ge=1, le=200)) -> SweepList:
    from planner.api.job_views import iso

    return SweepList(sweeps=[
        SweepSummary(url=f"/v1/sweeps/{row['id']}", **{**row,
                     "created_at": iso(row["created_at"]) or ""})
        for row in store.list_sweeps(limit, who.scope)
    ])


@router.get(
    "/sweeps/{sweep_id}",
    response_model=SweepView,
    responses=error_responses(*AUTH_ERRORS, 404, 422),
)
def get_sweep(store: StoreDep, who: Identity, sweep_id: str) -> SweepView:
    return sweep_view(store, sweep_id, who.scope)


def sweep_view(store: Store, sweep_id: str, tenant: str | None) -> SweepView:
    """The sweep, if `tenant` (None: any) may see it (else 404, as for no sweep)."""
    jobs = store.sweep_jobs(sweep_id, tenant)
    if jobs is None:
        raise ApiError(404, f"sweep {sweep_id!r}: no such sweep")
    from planner.engine.sweep import monotone, record_from_summary

    # The engine's rule, as in `planner-cli sweep`: a plan that fits a budget fits every
    # larger one, so each budget reports the cheapest finished plan at or below it.
    budgets: list[tuple[float | None, int]] = [(None, job.budget_bytes) for job in jobs]
    points = monotone(budgets, {j.budget_bytes: record_from_summary(j.report, j.budget_bytes)
                                for j in jobs})
    by_budget = {p.budget_bytes: p for p in points}
    job_of_budget = {j.budget_bytes: j.id for j in jobs}
    entries = []
    for job in jobs:
        point = by_budget[job.budget_bytes]
        source = point.source_budget_bytes
        entries.append(
            SweepEntry(
                id=job.id,
                url=f"/v1/plans/{job.id}",
                status=job.status,
                budget_bytes=job.budget_bytes,
                peak_bytes=point.peak_bytes,
                overhead_percent=None if point.overhead is None else 100 * point.overhead,
                answered_by=None if source is None else job_of_budget.get(source),
            )
        )
    return SweepView(
        id=sweep_id,
        url=f"/v1/sweeps/{sweep_id}",
        graph_id=jobs[0].graph_hash if jobs else "",
        method=jobs[0].method if jobs else "",
        plans=entries,
    )
