"""The FastAPI application: `create_app(settings)`; run with `planner-cli serve` or
`uvicorn planner.api.app:create_app --factory`.

One router per resource (planner.api.routers: graphs, plans, sweeps, partitions (an alias
of plans), methods, health, the page), their shared parts and
dependencies in planner.api.deps; the page's files and the offline API docs are mounted by
planner.api.web. Handlers that touch the database or the
CPU are plain `def` (run in the thread pool), so the event loop only ever routes requests;
solving happens in worker processes (planner.api.jobs).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from planner.api.auth_state import auth_at_start
from planner.api.deps import ServiceParts, identity_dependency
from planner.api.errors import BodyLimitMiddleware, install_error_handlers
from planner.api.plan_files import install_plan_cap_schema
from planner.api.request_documents import install_server_schema
from planner.api.routers import graphs, health, methods, page, partitions, plans, sweeps
from planner.api.settings import Settings, load_settings
from planner.api.uploads import UploadPool, UploadPoolMiddleware
from planner.api.web import install_web

DESCRIPTION = (
    "Memory plans for training graphs: POST a graph and a budget, get a schedule that fits "
    "(checked by the simulator). Errors are always "
    '`{"error": {"code", "message", "details"}}`.'
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    import anyio.to_thread

    parts: ServiceParts = app.state.parts
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = parts.settings.request_threads
    # Hand the GIL over sooner, so /healthz is not stuck behind busy handler threads.
    sys.setswitchinterval(0.001)
    parts.store.create_schema()
    # Fail closed here too (uvicorn --factory starts no `serve`): no open service on a
    # database that held keys and holds none now (planner.api.auth_state).
    _, refusal = auth_at_start(parts.settings, parts.store.has_keys())
    if refusal is not None:
        raise RuntimeError(refusal)
    parts.manager.start()
    # What start-up made lives as long as the process: out of the collector's reach, a full
    # collection (~130k objects: 80 ms, and 129 ms on /healthz under load) walks only what
    # requests made since.
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        app.state.upload_pool.shutdown()
        parts.service.close()
        parts.manager.stop()
        parts.store.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()
    from planner.engine.registry import register_method

    for name, target in settings.extra_methods.items():
        register_method(name, target)
    parts = ServiceParts.build(settings)
    app = FastAPI(title="Planner service", version="1", description=DESCRIPTION,
                  lifespan=lifespan)
    # Large bodies are parsed in the upload pool; the body limit is checked outside it.
    app.state.upload_pool = UploadPool(settings)
    app.add_middleware(UploadPoolMiddleware, pool=app.state.upload_pool)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    install_server_schema(app, settings)  # /openapi.json states this server's caps
    install_plan_cap_schema(app, settings)
    app.state.parts = parts
    app.state.storage_health = parts.manager.health  # the 503 handler's (errors.py)
    app.state.settings, app.state.store, app.state.manager = settings, parts.store, parts.manager
    identity = [identity_dependency(settings, parts)]
    for resource in (graphs, plans, sweeps, partitions, methods):
        app.include_router(resource.router, dependencies=identity)
    install_web(app)  # the page's files and the API docs, served offline
    app.include_router(page.router)
    app.include_router(health.router)
    return app

