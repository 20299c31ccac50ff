"""What every router shares, built once per app (`ServiceParts`: settings, store, metrics, the
job manager, the plan service, authentication, the rate limit), and the FastAPI dependencies
that hand them to a route: `Parts`, `Service`, `StoreDep`, `Identity` (the
`Caller`: its tenant, whether it is an admin).

Routers are module-level (planner.api.routers); `create_app` keeps the parts on
`app.state.parts` and includes every /v1 router with `identity_dependency(settings)`: with API
keys configured the bearer scheme (declared in the OpenAPI document, so the docs page's
"Authorize" button sends it), without them the client's address.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import SQLAlchemyError

from planner.api.jobs import JobManager
from planner.api.metrics import Metrics
from planner.api.schemas import ErrorBody
from planner.api.security import Authenticator, Caller, RateLimiter
from planner.api.service import PlanService
from planner.api.settings import Settings
from planner.api.store import Store

AUTH_ERRORS = (401, 403)
COMMON_ERRORS = (*AUTH_ERRORS, 413, 422)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error codes: each in the API's one error shape."""
    return {code: {"model": ErrorBody} for code in codes}


@dataclass(frozen=True)
class ServiceParts:
    settings: Settings
    store: Store
    metrics: Metrics
    manager: JobManager
    service: PlanService
    auth: Authenticator
    limiter: RateLimiter

    @classmethod
    def build(cls, settings: Settings) -> ServiceParts:
        store = Store(settings.database_url)
        metrics = Metrics(store.counts_by_status)
        manager = JobManager(store, settings, metrics)
        service = PlanService(store, settings, metrics, manager)
        manager.on_finished = service.remember_finished
        return cls(settings, store, metrics, manager, service, Authenticator(settings, store),
                   RateLimiter(settings.submissions_per_minute))

    def keys_declared(self) -> bool:
        """Whether the OpenAPI document declares the bearer scheme: keys in the settings, or in
        the database when the app is made (keys added later are enforced all the same)."""
        if self.auth.declared:
            return True
        try:
            return self.store.has_keys()
        except SQLAlchemyError:  # no schema yet (a new store), or unreachable: start-up says
            return False


def parts_of(request: Request) -> ServiceParts:
    parts: ServiceParts = request.app.state.parts
    return parts


# Dependencies are `async`: they stay on the event loop (a plain `def` would cost every request
# a hop to the thread pool, even the answers served from memory).
async def get_parts(request: Request) -> ServiceParts:
    return parts_of(request)


async def get_service(request: Request) -> PlanService:
    return parts_of(request).service


async def get_store(request: Request) -> Store:
    return parts_of(request).store


async def get_settings(request: Request) -> Settings:
    return parts_of(request).settings


# The auth scheme as the OpenAPI document declares it; Authenticator answers 401/403 in the
# API's own error shape, so the scheme itself never refuses (auto_error=False).
bearer = HTTPBearer(
    auto_error=False,
    description="An API key (`planner-cli keys add`, or the server's PLANNER_API_KEYS): "
    "`Authorization: Bearer <key>`.",
)


async def _caller(request: Request) -> Caller:
    """Who asks: worked out once per request, from memory on the event loop when the key cache
    knows the key, else from the database in a thread."""
    known: Caller | None = getattr(request.state, "caller", None)
    if known is None:
        auth = parts_of(request).auth
        known = auth.caller_cached(request)
        if known is None:
            known = await run_in_threadpool(auth.caller, request)
        request.state.caller = known
    return known


async def identity_with_key(
    request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Caller:
    return await _caller(request)


async def identity_open(request: Request) -> Caller:
    return await _caller(request)


async def current_identity(request: Request) -> Caller:
    """The caller the router's dependency established (every route that reads or writes a
    tenant's objects needs it)."""
    return await _caller(request)


def identity_dependency(settings: Settings, parts: ServiceParts | None = None) -> Any:
    """What each /v1 router is included with (see the module docstring). Either way every
    route learns its caller the same way; only the OpenAPI document differs."""
    declared = settings.auth_enabled or (parts is not None and parts.keys_declared())
    return Depends(identity_with_key if declared else identity_open)


Parts = Annotated[ServiceParts, Depends(get_parts)]
Service = Annotated[PlanService, Depends(get_service)]
StoreDep = Annotated[Store, Depends(get_store)]
Identity = Annotated[Caller, Depends(current_identity)]
