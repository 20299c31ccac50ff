"""What every router shares, built once per app (`ServiceParts`: settings, store, metrics, the
job manager, the plan service, authentication, the rate limit), and the FastAPI dependencies
that hand them to a route: `Parts`, `Service`, `StoreDep`, `SettingsDep`, `Identity`.

Routers are module-level (planner.service.routers); `create_app` keeps the parts on
`app.state.parts` and includes every /v1 router with `identity_dependency(settings)`: with API
keys configured the bearer scheme (declared in the OpenAPI document, so the docs page's
"Authorize" button sends it), without them the client's address.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from planner.service.jobs import JobManager
from planner.service.metrics import Metrics
from planner.service.schemas import ErrorBody
from planner.service.security import Authenticator, RateLimiter
from planner.service.service import PlanService
from planner.service.settings import Settings
from planner.service.store import Store

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
        return cls(settings, store, metrics, manager, service, Authenticator(settings),
                   RateLimiter(settings.submissions_per_minute))


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
    description="An API key from the server's PLANNER_API_KEYS: `Authorization: Bearer <key>`.",
)


def _identity(request: Request) -> str:
    """Who asks: worked out once per request (cheap: stays on the event loop)."""
    known: str | None = getattr(request.state, "identity", None)
    if known is None:
        known = parts_of(request).auth.identity(request)
        request.state.identity = known
    return known


async def identity_with_key(
    request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> str:
    return _identity(request)


async def identity_open(request: Request) -> str:
    return _identity(request)


async def current_identity(request: Request) -> str:
    """The identity the router's dependency established (a route that rate-limits needs it)."""
    return _identity(request)


def identity_dependency(settings: Settings) -> Any:
    """What each /v1 router is included with (see the module docstring)."""
    return Depends(identity_with_key if settings.auth_enabled else identity_open)


Parts = Annotated[ServiceParts, Depends(get_parts)]
Service = Annotated[PlanService, Depends(get_service)]
StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Identity = Annotated[str, Depends(current_identity)]
