"""/healthz (the process answers), /readyz (the database answers and takes writes; workers and
lease) and /metrics (Prometheus): no authentication."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from planner.service.deps import Parts, error_responses
from planner.service.errors import error_response, storage_error_response
from planner.service.schemas import Health, Ready

router = APIRouter()


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
            return error_response(503, f"database unavailable: {type(e).__name__}: {e}")
    problem = health.problem()
    if problem is not None:
        return storage_error_response(*problem)
    return Ready(
        status="ready",
        database=parts.store.engine.dialect.name,
        workers=parts.settings.workers,
        running=parts.manager.running_count,
        instance=parts.manager.instance_id,
        lease_s=parts.settings.instance_lease_s,
    )


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def prometheus_metrics(parts: Parts) -> Response:
    return Response(parts.metrics.render(), media_type=CONTENT_TYPE_LATEST)
