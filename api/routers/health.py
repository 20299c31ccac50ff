"""/healthz (the process answers), /readyz (the database answers; workers and lease) and
/metrics (Prometheus): no authentication."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from planner.service.deps import Parts, error_responses
from planner.service.errors import error_response
from planner.service.schemas import Health, Ready

router = APIRouter()


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses=error_responses(503))
def readyz(parts: Parts) -> Any:
    try:
        parts.store.ping()
    except Exception as e:
        return error_response(503, f"database unavailable: {type(e).__name__}: {e}")
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
