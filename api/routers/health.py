"""/healthz (the process answers), /readyz (the database answers and takes writes; workers and
lease): no authentication. /metrics (Prometheus): open without keys; with keys, the admin key
only (its gauges count every tenant's jobs)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from planner.api.deps import Parts, error_responses
from planner.api.errors import ApiError, error_response, storage_error_response
from planner.api.schemas import Health, Ready

router = APIRouter()
log = logging.getLogger("planner.api")


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses=error_responses(503))
def readyz(parts: Parts) -> Any:
    """Not ready (503 with the cause) while the store refuses writes: after a storage fault,
    until a write succeeds again (this probe's heartbeat, or the dispatcher's)."""
    health = parts.manager.health
    try:
        parts.store.ping()
        if health.problem() is not None:
            parts.manager.heartbeat_now()  # a write: the way back to ready
    except Exception as e:
        if health.failed(e) is None:
            # The error's text may name the database's host and port: the log has it, an
            # unauthenticated probe gets the class only.
            log.error("readiness: the database failed: %s: %s", type(e).__name__, e)
            return error_response(503, f"database unavailable ({type(e).__name__}); see the "
                                  "server log")
    problem = health.problem()
    if problem is not None:
        return storage_error_response(*problem)
    if (cannot_start := parts.manager.spawn_problem) is not None:
        return error_response(503, f"solver processes cannot start ({cannot_start}); jobs wait "
                              "until one can")
    return Ready(
        status="ready",
        database=parts.store.engine.dialect.name,
        workers=parts.settings.workers,
        running=parts.manager.running_count,
        instance=parts.manager.instance_id,
        lease_s=parts.settings.instance_lease_s,
    )


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}, **error_responses(401, 403)})
def prometheus_metrics(request: Request, parts: Parts) -> Response:
    """With authentication on, the admin key only: the store's gauges and this process's
    counters add up every tenant's jobs, which no tenant may read of another (configure the
    scraper with `authorization: {credentials: <admin key>}`)."""
    if parts.auth.enabled() and not parts.auth.caller(request).admin:
        raise ApiError(403, "/metrics counts every tenant's jobs: it needs the admin key "
                       "(PLANNER_ADMIN_API_KEY or `planner-cli keys add --admin`)")
    return Response(parts.metrics.render(), media_type=CONTENT_TYPE_LATEST)
