"""The page at `/` (static HTML + JS from api/web_assets, no build step), what it needs to know
before its first call (/web/config.json), and the memory timeline of a finished plan as JSON
(it draws it client-side); none of them in the API document. Its files and the offline API docs
are mounted by planner.api.web.install_web."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response

from planner.api.deps import Identity, Parts, StoreDep
from planner.api.errors import ApiError
from planner.api.store import Store
from planner.api.web import ASSETS_DIR, PAGE_CSP, PAGE_PREFIX

TIMELINE_CACHE_ENTRIES = 32

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(ASSETS_DIR / "index.html", media_type="text/html",
                        headers={"Content-Security-Policy": PAGE_CSP})


@router.get(PAGE_PREFIX + "/config.json")
async def page_config(request: Request, parts: Parts) -> JSONResponse:
    # Tells the page whether to ask for a key before its first call; no secret in it.
    app = request.app
    auth_required = await run_in_threadpool(parts.auth.enabled)
    return JSONResponse({"auth_required": auth_required, "title": app.title,
                         "docs_url": app.docs_url or "/docs"})


@router.get(PAGE_PREFIX + "/plans/{plan_id}/timeline.json")
def plan_timeline_json(request: Request, store: StoreDep, who: Identity,
                       plan_id: str) -> Response:
    # Access first, on every request: the cache holds what any reader may see once allowed, so
    # it never decides who may read. A plan's timeline is the same whoever reads it, hence the
    # key is the plan id alone (no tenant text to collide: an admin's scope, None, once keyed
    # as "None", which a tenant could be named).
    if not store.job_visible(plan_id, who.scope):
        raise ApiError(404, f"plan {plan_id!r}: no such plan")
    timelines = _timelines(request)
    cached = timelines.get(plan_id)
    if cached is None:
        cached = json.dumps(timeline_data(store, plan_id, who.scope)).encode()
        timelines.put(plan_id, cached)
    return Response(cached, media_type="application/json")


def timeline_data(store: Store, plan_id: str, tenant: str | None = None) -> dict[str, Any]:
    """The simulator's replay of a finished plan: memory per action (and, for event-simulated
    plans, the device/host memory over time and the ranks), the same figures timeline.png draws."""
    from planner.core.graph import Graph
    from planner.core.plan import Plan
    from planner.sim.simulator import simulate

    job = store.get_job(plan_id, tenant)
    if job is None:
        raise ApiError(404, f"plan {plan_id!r}: no such plan")
    if job.plan is None or not (job.plan.get("actions") or job.plan.get("rank_actions")):
        raise ApiError(
            409, f"plan {plan_id} is {job.status}: no schedule to draw",
            details={"status": job.status},
        )
    document = store.get_graph_document(job.graph_hash)
    if document is None:
        raise ApiError(404, f"plan {plan_id}: its graph {job.graph_hash} is not stored")
    graph = Graph.model_validate_json(document)
    plan = Plan.model_validate(job.plan)
    sim = simulate(graph, plan)
    names = {n.id: n.name for n in graph.nodes}
    return {
        "id": plan_id,
        "budget_bytes": job.budget_bytes,
        "peak_bytes": sim.peak_bytes,
        "peak_action_index": sim.peak_action_index,
        "fixed_bytes": sim.fixed_bytes,
        "compute_cost": sim.compute_cost,
        "baseline_cost": sim.baseline_cost,
        "event_simulated": sim.event_simulated,
        "host_peak_bytes": sim.host_peak_bytes,
        "makespan_ms": sim.makespan_ms,
        # Compact rows: a plan of 100k actions stays a few MB.
        "points": [[p.action_index, p.action, p.live_bytes] for p in sim.timeline],
        "memory_trace": [
            [m.time_ms, m.action_index, m.device_bytes, m.host_bytes] for m in sim.memory_trace
        ],
        "ranks": [
            {"rank": r.rank, "peak_bytes": r.peak_bytes, "busy_ms": r.busy_ms, "end_ms": r.end_ms}
            for r in sim.ranks
        ],
        "node_names": {str(k): v for k, v in names.items()},
    }


def _timelines(request: Request) -> _TimelineCache:
    """This app's cache (one per app: tests run several in one process)."""
    state = request.app.state
    cache: _TimelineCache | None = getattr(state, "page_timelines", None)
    if cache is None:
        cache = state.page_timelines = _TimelineCache(TIMELINE_CACHE_ENTRIES)
    return cache


class _TimelineCache:
    """A few rendered timelines: finished plans never change, and the page asks again on every
    visit to the plan."""

    def __init__(self, max_entries: int) -> None:
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
