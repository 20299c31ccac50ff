"""The browser side of the service: the page at `/` (static HTML + JS from api/web_assets, no
build step) and the API docs at `/docs` and `/redoc` with their assets served from the package
(fastapi-offline ships Swagger UI and ReDoc), so both work without reaching a CDN.

`install_web(app, settings)` is the one call create_app makes. The page reads the /v1 API with
the key the user typed (localStorage, sent as Bearer); its only route of its own is the memory
timeline of a finished plan as JSON, which it draws client-side.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from importlib import resources as package_files
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.routing import BaseRoute, Route

from planner.service.errors import ApiError
from planner.service.security import Authenticator
from planner.service.settings import Settings

ASSETS_DIR = Path(__file__).resolve().parent / "web_assets"
PAGE_PREFIX = "/web"
DOCS_ASSETS_PREFIX = "/docs-assets"
TIMELINE_CACHE_ENTRIES = 32
# Nothing but this server: the docs bundles still name a CDN here and there (ReDoc's logo), and
# the browser must not try it. Swagger UI's start-up script is inline, hence 'unsafe-inline'
# there; the page itself runs no inline script.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'"
)


def docs_assets_dir() -> Path:
    """Swagger UI and ReDoc files as shipped by the fastapi-offline package."""
    return Path(str(package_files.files("fastapi_offline") / "static"))


def examples_dir() -> Path:
    return Path(str(package_files.files("planner") / "examples"))


def _drop_routes(app: FastAPI, paths: set[str]) -> None:
    # FastAPI adds its CDN-based docs routes in its constructor; ours replace them.
    kept: list[BaseRoute] = [
        r for r in app.router.routes if not (isinstance(r, Route) and r.path in paths)
    ]
    app.router.routes[:] = kept


def install_web(app: FastAPI, settings: Settings) -> None:
    """Serve `/` (the page), `/web/*` (its files), `/docs` and `/redoc` (offline assets)."""
    docs_url = app.docs_url or "/docs"
    redoc_url = app.redoc_url or "/redoc"
    openapi_url = app.openapi_url or "/openapi.json"
    _drop_routes(app, {docs_url, redoc_url})
    app.mount(DOCS_ASSETS_PREFIX, StaticFiles(directory=docs_assets_dir()), name="docs-assets")
    app.mount(PAGE_PREFIX + "/static", StaticFiles(directory=ASSETS_DIR), name="web-static")
    # The bundled example graph: the page's "try it" needs no file of the user's.
    app.mount(PAGE_PREFIX + "/examples", StaticFiles(directory=examples_dir()), name="web-examples")
    auth = Authenticator(settings)
    timelines = _TimelineCache(TIMELINE_CACHE_ENTRIES)

    async def identity(request: Request) -> str:
        return auth.identity(request)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(ASSETS_DIR / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": PAGE_CSP})

    @app.get(PAGE_PREFIX + "/config.json", include_in_schema=False)
    async def page_config() -> JSONResponse:
        # Tells the page whether to ask for a key before its first call; no secret in it.
        return JSONResponse(
            {"auth_required": settings.auth_enabled, "title": app.title, "docs_url": docs_url}
        )

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=app.title + " - API docs",
            swagger_js_url=f"{root}{DOCS_ASSETS_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_PREFIX}/favicon.png",
            oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
            # The key typed into "Authorize" survives a reload, as the page's own key does.
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}),
                                   "persistAuthorization": True},
        )
        html.headers["Content-Security-Policy"] = DOCS_CSP
        return html

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_redoc_html(
            openapi_url=root + openapi_url,
            title=app.title + " - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS_PREFIX}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS_PREFIX}/favicon.png",
            with_google_fonts=False,
        )
        html.headers["Content-Security-Policy"] = DOCS_CSP
        return html

    @app.get(PAGE_PREFIX + "/plans/{plan_id}/timeline.json", include_in_schema=False)
    def plan_timeline_json(plan_id: str, _: str = Depends(identity)) -> Response:
        cached = timelines.get(plan_id)
        if cached is None:
            cached = json.dumps(timeline_data(app, plan_id)).encode()
            timelines.put(plan_id, cached)
        return Response(cached, media_type="application/json")


def timeline_data(app: FastAPI, plan_id: str) -> dict[str, Any]:
    """The simulator's replay of a finished plan: memory per action (and, for event-simulated
    plans, the device/host memory over time and the ranks), the same figures timeline.png draws."""
    from planner.core.graph import Graph
    from planner.core.plan import Plan
    from planner.sim.simulator import simulate

    store = app.state.store
    job = store.get_job(plan_id)
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
