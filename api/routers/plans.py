"""/v1/plans: ask for a plan within a memory budget, follow it, cancel it, draw its timeline.

A request is resolved once at submission (planner.engine.request, through PlanService.resolve):
the job keeps the resolved values and its worker solves them as they are.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from planner.api.deps import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    Identity,
    Parts,
    Service,
    ServiceParts,
    error_responses,
)
from planner.api.job_views import job_view
from planner.api.models import FINISHED, JOB_STATUSES, Job
from planner.api.plan_files import json_response
from planner.api.schemas import JobAccepted, JobList, JobSummary, JobView, PlanRequest
from planner.api.security import Caller

router = APIRouter(prefix="/v1")
MAX_WAIT_S = 60.0
# What a submission answers (plans, and partitions: their alias).
SUBMIT_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"model": JobView, "description": "Solved before (or within ?wait=)."},
    202: {"model": JobAccepted, "description": "Queued; poll the url."},
    **error_responses(*COMMON_ERRORS, 404, 429),
}


@router.post(
    "/plans",
    status_code=202,
    response_model=JobAccepted,
    responses=SUBMIT_RESPONSES,
    summary="Ask for a plan within a memory budget",
)
async def submit_plan(
    body: PlanRequest,
    parts: Parts,
    who: Identity,
    wait: float = Query(
        default=0,
        ge=0,
        le=MAX_WAIT_S,
        description="Seconds to hold the request for the plan to finish (then 200 with "
        "the plan, else 202 as usual): one curl gets an answer. The server may cap it "
        "lower (max_wait_s).",
    ),
) -> Response:
    parts.limiter.check(who)
    service = parts.service
    answer = service.cached_answer(body.graph_id, body.budget, body.method, body.options,
                                   body.resources, body.time_limit, body.force, who.tenant)
    if answer is not None:  # solved before and in memory: no thread, no database
        return Response(answer, status_code=200, media_type="application/json")
    job, cached = await run_in_threadpool(_submit_slow_path, parts, body, who)
    deadline = time.monotonic() + min(wait, parts.settings.max_wait_s)
    delay = 0.05
    while not cached and job.status not in FINISHED and time.monotonic() < deadline:
        await asyncio.sleep(delay)  # the event loop stays free while this request waits
        delay = min(2 * delay, 0.5)
        job = await run_in_threadpool(service.get, job.id, who.scope)
    if cached or job.status in FINISHED:
        rendered = await run_in_threadpool(service.render, job, cached=cached)
        return json_response(rendered)  # a large plan: streamed from its file
    accepted = JobAccepted(id=job.id, status=job.status, url=f"/v1/plans/{job.id}")
    return JSONResponse(accepted.model_dump(), status_code=202, headers={"Location": accepted.url})


def _submit_slow_path(parts: ServiceParts, body: PlanRequest, who: Caller) -> tuple[Job, bool]:
    request = parts.service.resolve_plan(body, who.tenant)
    return parts.service.submit(request, force=body.force, tenant=who.tenant)


@router.get(
    "/plans",
    response_model=JobList,
    responses=error_responses(*AUTH_ERRORS, 422),
    summary="The newest plan jobs (without plans), optionally of one status",
)
def list_plans(
    service: Service,
    who: Identity,
    limit: int = Query(default=50, ge=1, le=200),
    status: Literal["queued", "running", "done", "infeasible", "failed", "cancelled"]
    | None = Query(default=None, description="Only jobs with this status."),
) -> JobList:
    assert status is None or status in JOB_STATUSES
    items = []
    for job in service.store.list_jobs(limit, status, who.scope):
        view = job_view(job)
        items.append(JobSummary(**view.model_dump(include=set(JobSummary.model_fields))))
    return JobList(plans=items)


@router.get(
    "/plans/{plan_id}",
    response_model=JobView,
    responses=error_responses(*AUTH_ERRORS, 404, 422),
    summary="Status, progress, and the plan with its report when done",
)
async def get_plan(service: Service, who: Identity, plan_id: str) -> Response:
    answer = service.rendered_finished(plan_id, who.scope)
    if answer is not None:
        return Response(answer, media_type="application/json")
    # A large finished plan is rendered once and streamed from its file (plan_files).
    return json_response(await run_in_threadpool(service.view, plan_id, who.scope))


@router.delete(
    "/plans/{plan_id}",
    response_model=JobView,
    responses={
        200: {"description": "Cancelled and deleted: the job's last view (status cancelled). "
              "From now on the plan answers 404 (GET, timeline, DELETE)."},
        **error_responses(*AUTH_ERRORS, 404, 409, 422),
    },
    summary="Cancel and delete a queued or running plan job (its process is killed)",
    description="DELETE removes the job: its solver is stopped and later reads answer 404. "
    "The cancellation is recorded in the store (metrics, sweeps list it as cancelled). A "
    "finished plan cannot be deleted (409): it answers identical requests.",
)
def cancel_plan(service: Service, who: Identity, plan_id: str) -> JobView:
    return job_view(service.cancel(plan_id, who.scope))


@router.get(
    "/plans/{plan_id}/timeline.png",
    response_class=Response,
    responses={
        200: {"content": {"image/png": {}}, "description": "Memory over the schedule."},
        **error_responses(*AUTH_ERRORS, 404, 409, 422),
    },
)
def plan_timeline(service: Service, who: Identity, plan_id: str) -> Response:
    return Response(service.timeline_png(service.get(plan_id, who.scope)), media_type="image/png")
