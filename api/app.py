"""The FastAPI application: `create_app(settings)`; run with `planner-cli serve` or
`uvicorn planner.service.app:create_app --factory`.

Handlers that touch the database or the CPU are plain `def` (run in the thread pool), so the
event loop only ever routes requests; solving happens in worker processes (planner.service.jobs).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST

from planner.service.errors import (
    ApiError,
    BodyLimitMiddleware,
    error_response,
    install_error_handlers,
)
from planner.service.jobs import JobManager
from planner.service.metrics import Metrics
from planner.service.models import FINISHED, JOB_STATUSES, Job
from planner.service.schemas import (
    EXAMPLE_GRAPH,
    ErrorBody,
    GraphCreated,
    GraphDocument,
    Health,
    JobAccepted,
    JobList,
    JobSummary,
    JobView,
    PlanRequest,
    Ready,
    SweepEntry,
    SweepList,
    SweepRequest,
    SweepSummary,
    SweepView,
)
from planner.service.security import Authenticator, RateLimiter
from planner.service.service import PlanService
from planner.service.settings import Settings, load_settings
from planner.service.store import Store
from planner.service.web import install_web

log = logging.getLogger("planner.api")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


AUTH_ERRORS = (401, 403)
MAX_WAIT_S = 60.0
COMMON = (*AUTH_ERRORS, 413, 422)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()
    from planner.engine.registry import register_method

    for name, target in settings.extra_methods.items():
        register_method(name, target)
    store = Store(settings.database_url)
    metrics = Metrics(store.counts_by_status)
    manager = JobManager(store, settings, metrics)
    service = PlanService(store, settings, metrics, manager)
    manager.on_finished = service.remember_finished
    auth = Authenticator(settings)
    limiter = RateLimiter(settings.submissions_per_minute)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.request_threads
        # Hand the GIL over sooner, so /healthz is not stuck behind busy handler threads.
        sys.setswitchinterval(0.001)
        store.create_schema()
        manager.start()
        try:
            yield
        finally:
            manager.stop()
            store.dispose()

    app = FastAPI(
        title="Planner service",
        version="1",
        description="Memory plans for training graphs: POST a graph and a budget, get a "
        "schedule that fits (checked by the simulator). Errors are always "
        '`{"error": {"code", "message", "details"}}`.',
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.state.settings, app.state.store, app.state.manager = settings, store, manager

    # With keys configured, the OpenAPI document declares the bearer scheme (the docs page's
    # "Authorize" button sends it); without, the API asks for none and declares none.
    bearer = HTTPBearer(
        auto_error=False,  # Authenticator answers 401/403 in the API's own error shape
        description="An API key from the server's PLANNER_API_KEYS: "
        "`Authorization: Bearer <key>`.",
    )

    async def identity_with_key(
        request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> str:
        return auth.identity(request)  # cheap: stays on the event loop, no thread hop

    async def identity_open(request: Request) -> str:
        return auth.identity(request)

    identity = identity_with_key if auth.enabled else identity_open

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(identity)])

    @v1.post(
        "/graphs",
        status_code=201,
        response_model=GraphCreated,
        responses={200: {"model": GraphCreated}, **_errors(*COMMON, 429)},
        summary="Upload a graph once; refer to it by its id afterwards",
    )
    def upload_graph(
        who: str = Depends(identity),
        graph: dict[str, Any] = Body(openapi_examples={"small": {"value": EXAMPLE_GRAPH}}),
    ) -> JSONResponse:
        limiter.check(who)
        parsed = service.parse_graph(graph)
        graph_hash, created = service.put_graph(parsed)
        body = GraphCreated(
            id=graph_hash,
            nodes=len(parsed.nodes),
            edges=len(parsed.edges),
            created=created,
            url=f"/v1/graphs/{graph_hash}",
        )
        return JSONResponse(body.model_dump(), status_code=201 if created else 200)

    @v1.get(
        "/graphs/{graph_id}",
        response_model=GraphDocument,
        responses=_errors(*AUTH_ERRORS, 404, 422),
    )
    def get_graph(graph_id: str) -> GraphDocument:
        graph = service.stored_graph(graph_id)
        return GraphDocument(id=graph_id, graph=graph.model_dump(mode="json"))

    @v1.post(
        "/plans",
        status_code=202,
        response_model=JobAccepted,
        responses={
            200: {"model": JobView, "description": "Solved before (or within ?wait=)."},
            202: {"model": JobAccepted, "description": "Queued; poll the url."},
            **_errors(*COMMON, 404, 429),
        },
        summary="Ask for a plan within a memory budget",
    )
    async def submit_plan(
        body: PlanRequest,
        who: str = Depends(identity),
        wait: float = Query(
            default=0,
            ge=0,
            le=MAX_WAIT_S,
            description="Seconds to hold the request for the plan to finish (then 200 with "
            "the plan, else 202 as usual): one curl gets an answer. The server may cap it "
            "lower (max_wait_s).",
        ),
    ) -> Response:
        limiter.check(who)
        answer = service.cached_answer(body.graph_id, body.budget, body.method, body.options,
                                       body.resources, body.time_limit, body.force)
        if answer is not None:  # solved before and in memory: no thread, no database
            return Response(answer, status_code=200, media_type="application/json")
        job, cached = await run_in_threadpool(submit_slow_path, body)
        deadline = time.monotonic() + min(wait, settings.max_wait_s)
        delay = 0.05
        while not cached and job.status not in FINISHED and time.monotonic() < deadline:
            await asyncio.sleep(delay)  # the event loop stays free while this request waits
            delay = min(2 * delay, 0.5)
            job = await run_in_threadpool(service.get, job.id)
        if cached or job.status in FINISHED:
            answer = await run_in_threadpool(service.render, job, cached=cached)
            return Response(answer, status_code=200, media_type="application/json")
        accepted = JobAccepted(id=job.id, status=job.status, url=f"/v1/plans/{job.id}")
        return JSONResponse(
            accepted.model_dump(), status_code=202, headers={"Location": accepted.url}
        )

    def submit_slow_path(body: PlanRequest) -> tuple[Job, bool]:
        service.check_method(body.method, body.options)
        graph_hash, graph = service.resolve_graph(body.graph, body.graph_id)
        resources = service.resources(body.resources)
        budget_bytes = service.budget_bytes(body.budget, graph_hash, graph, resources)
        service.check_offload(graph_hash, graph, body.method, resources)
        time_limit_s = service.time_limit(body.time_limit)
        return service.submit(graph_hash, budget_bytes, body.method, body.options, time_limit_s,
                              resources, force=body.force)

    @v1.get(
        "/plans",
        response_model=JobList,
        responses=_errors(*AUTH_ERRORS, 422),
        summary="The newest plan jobs (without plans), optionally of one status",
    )
    def list_plans(
        limit: int = Query(default=50, ge=1, le=200),
        status: Literal["queued", "running", "done", "infeasible", "failed", "cancelled"]
        | None = Query(default=None, description="Only jobs with this status."),
    ) -> JobList:
        assert status is None or status in JOB_STATUSES
        items = []
        for job in store.list_jobs(limit, status):
            view = service.view(job)
            items.append(JobSummary(**view.model_dump(include=set(JobSummary.model_fields))))
        return JobList(plans=items)

    @v1.get(
        "/plans/{plan_id}",
        response_model=JobView,
        responses=_errors(*AUTH_ERRORS, 404, 422),
        summary="Status, progress, and the plan with its report when done",
    )
    async def get_plan(plan_id: str) -> Response:
        answer = service.rendered_finished(plan_id)
        if answer is None:
            answer = await run_in_threadpool(lambda: service.render(service.get(plan_id)))
        return Response(answer, media_type="application/json")

    @v1.delete(
        "/plans/{plan_id}",
        response_model=JobView,
        responses=_errors(*AUTH_ERRORS, 404, 409, 422),
        summary="Cancel a queued or running solve (its process is killed)",
    )
    def cancel_plan(plan_id: str) -> JobView:
        return service.view(service.cancel(plan_id))

    @v1.get(
        "/plans/{plan_id}/timeline.png",
        response_class=Response,
        responses={
            200: {"content": {"image/png": {}}, "description": "Memory over the schedule."},
            **_errors(*AUTH_ERRORS, 404, 409, 422),
        },
    )
    def plan_timeline(plan_id: str) -> Response:
        return Response(service.timeline_png(service.get(plan_id)), media_type="image/png")

    @v1.post(
        "/sweeps",
        status_code=202,
        response_model=SweepView,
        responses=_errors(*COMMON, 404, 429),
        summary="One plan per budget on the same graph",
    )
    def submit_sweep(body: SweepRequest, who: str = Depends(identity)) -> SweepView:
        if len(body.budgets) > settings.max_sweep_budgets:
            raise ApiError(
                422,
                f"budgets: {len(body.budgets)} budgets, over this server's limit of "
                f"max_sweep_budgets={settings.max_sweep_budgets}",
                details={"limit": "max_sweep_budgets", "max": settings.max_sweep_budgets},
            )
        limiter.check(who, cost=len(body.budgets))
        service.check_method(body.method, body.options)
        graph_hash, graph = service.resolve_graph(body.graph, body.graph_id)
        time_limit_s = service.time_limit(body.time_limit)
        resources = service.resources(body.resources)
        service.check_offload(graph_hash, graph, body.method, resources)
        budgets = sorted({service.budget_bytes(b, graph_hash, graph, name=f"budgets[{i}]")
                          for i, b in enumerate(body.budgets)})
        jobs = [
            service.submit(graph_hash, b, body.method, body.options, time_limit_s, resources,
                           force=body.force)[0]
            for b in budgets
        ]
        sweep_id = store.create_sweep(graph_hash, body.method, [j.id for j in jobs])
        return sweep_view(sweep_id)

    def sweep_view(sweep_id: str) -> SweepView:
        jobs = store.sweep_jobs(sweep_id)
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

    @v1.get(
        "/sweeps",
        response_model=SweepList,
        responses=_errors(*AUTH_ERRORS, 422),
        summary="The newest sweeps",
    )
    def list_sweeps(limit: int = Query(default=50, ge=1, le=200)) -> SweepList:
        from planner.service.service import iso

        return SweepList(sweeps=[
            SweepSummary(url=f"/v1/sweeps/{row['id']}", **{**row,
                         "created_at": iso(row["created_at"]) or ""})
            for row in store.list_sweeps(limit)
        ])

    @v1.get(
        "/sweeps/{sweep_id}", response_model=SweepView, responses=_errors(*AUTH_ERRORS, 404, 422)
    )
    def get_sweep(sweep_id: str) -> SweepView:
        return sweep_view(sweep_id)

    @v1.get("/methods", response_model=list[str], responses=_errors(*AUTH_ERRORS))
    def list_methods() -> list[str]:
        from planner.engine.registry import method_names

        return method_names()

    app.include_router(v1)
    from planner.service.pipeline_routes import pipeline_router

    app.include_router(pipeline_router([Depends(identity)]))
    install_web(app, settings)  # the page at / and the API docs served offline (api/web.py)

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Ready, responses=_errors(503))
    def readyz() -> Any:
        try:
            store.ping()
        except Exception as e:
            return error_response(503, f"database unavailable: {type(e).__name__}: {e}")
        return Ready(
            status="ready",
            database=store.engine.dialect.name,
            workers=settings.workers,
            running=manager.running_count,
            instance=manager.instance_id,
            lease_s=settings.instance_lease_s,
        )

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
