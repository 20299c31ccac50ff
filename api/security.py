"""Who asks (`Caller`: a tenant, perhaps an admin), from bearer API keys; and the per-tenant
submission rate limit (the `limits` library's moving window).

Keys come from the database (`planner-cli keys add`, stored as sha256 digests, read through a
short cache so a revoked key stops working within `api_key_cache_s` without a restart) and from
`PLANNER_API_KEYS` (`"KEY"` belongs to the default tenant, `"TENANT:KEY"` to TENANT) and
`PLANNER_ADMIN_API_KEY`. Authentication is on when any of them holds a key; without keys every
caller is the default tenant, as before tenants existed.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from fastapi import Request
from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from planner.api.auth_state import remember_auth
from planner.api.errors import ApiError
from planner.api.models import DEFAULT_TENANT
from planner.api.settings import Settings
from planner.api.store import Store
from planner.api.store_tenants import ApiKey, check_tenant_name, key_digest

MAX_CACHED_KEYS = 10_000  # beyond this the key cache starts over (unknown keys are cached too)


@dataclass(frozen=True)
class Caller:
    """Who asks: the tenant that owns what it creates; an admin sees every tenant's objects."""

    tenant: str = DEFAULT_TENANT
    admin: bool = False
    identity: str = "tenant:" + DEFAULT_TENANT  # whom the rate limit counts

    @property
    def scope(self) -> str | None:
        """The tenant whose objects this caller may see; None: every tenant's."""
        return None if self.admin else self.tenant


def env_keys(settings: Settings) -> dict[str, Caller]:
    """digest -> caller for the keys in the settings (see the module docstring)."""
    callers: dict[str, Caller] = {}
    for secret in settings.api_keys:
        text = secret.get_secret_value()
        tenant, sep, key = text.partition(":")
        if not sep:
            tenant, key = DEFAULT_TENANT, text
        check_tenant_name(tenant, "PLANNER_API_KEYS")
        callers[key_digest(key)] = Caller(tenant, False, "tenant:" + tenant)
    if settings.admin_api_key is not None:
        callers[key_digest(settings.admin_api_key.get_secret_value())] = Caller(
            DEFAULT_TENANT, True, "tenant:" + DEFAULT_TENANT)
    return callers


def _bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "missing credentials: send 'Authorization: Bearer <api key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "malformed Authorization header: expected 'Bearer <api key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


class Authenticator:
    """Resolves a request's caller. `caller_cached` answers from memory (the event loop);
    when it cannot, `caller` asks the database (call it from a thread)."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self._env = env_keys(settings)
        self._store = store
        self._database_url, self._state_dir = settings.database_url, settings.state_dir
        self._ttl_s = settings.api_key_cache_s
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[float, ApiKey | None]] = {}  # digest -> (read at, key)
        self._db_has_keys: tuple[float, bool] = (-math.inf, False)

    @property
    def declared(self) -> bool:
        """Keys in the settings: the OpenAPI document declares the bearer scheme."""
        return bool(self._env)

    def _fresh(self, read_at: float) -> bool:
        return time.monotonic() - read_at < self._ttl_s

    def enabled(self) -> bool:
        if self._env:
            return True
        read_at, has = self._db_has_keys
        if not self._fresh(read_at) and not has:  # once on, stays on (keys are never deleted)
            has = self._store.has_keys()
            self._db_has_keys = (time.monotonic(), has)
            if has:  # a key added while running: a lost database must not reopen the service
                remember_auth(self._database_url, self._state_dir)
        return has

    def caller_cached(self, request: Request) -> Caller | None:
        """The caller from memory, or None when the database must be asked."""
        read_at, has = self._db_has_keys
        if not self._env and not has and not self._fresh(read_at):
            return None
        if not self._env and not has:
            return self._open_caller(request)
        digest = key_digest(_bearer_token(request))
        if digest in self._env:
            return self._env[digest]
        cached = self._keys.get(digest)
        if cached is None or not self._fresh(cached[0]):
            return None
        return self._from_key(cached[1])

    def caller(self, request: Request) -> Caller:
        """The caller, reading the database where the cache has nothing fresh (a thread)."""
        if not self.enabled():
            return self._open_caller(request)
        digest = key_digest(_bearer_token(request))
        if digest in self._env:
            return self._env[digest]
        key = self._store.find_key_by_digest(digest)
        with self._lock:
            if len(self._keys) >= MAX_CACHED_KEYS:
                self._keys.clear()
            self._keys[digest] = (time.monotonic(), key)
        return self._from_key(key)

    @staticmethod
    def _open_caller(request: Request) -> Caller:
        host = request.client.host if request.client else "unknown"
        return Caller(DEFAULT_TENANT, False, "addr:" + host)

    @staticmethod
    def _from_key(key: ApiKey | None) -> Caller:
        if key is None:
            raise ApiError(403, "the API key is not valid for this server")
        if key.revoked_at is not None:
            raise ApiError(401, f"the API key {key.prefix}... (id {key.id}) was revoked; ask "
                           "the operator for a new one", headers={"WWW-Authenticate": "Bearer"})
        return Caller(key.tenant, key.admin, "tenant:" + key.tenant)


class RateLimiter:
    """At most `per_minute` submissions per caller identity (its tenant; its address without
    keys) in any moving 60-second window. In memory: each service instance counts its own."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._item = RateLimitItemPerMinute(per_minute)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(self, caller: Caller, cost: int = 1) -> None:
        if self._limiter.hit(self._item, caller.identity, cost=cost):
            return
        self._refuse(caller)

    def peek(self, caller: Caller, cost: int = 1) -> None:
        """The 429 `check` would answer now, without counting a submission (a large upload is
        refused before it is read and parsed; its route counts it)."""
        if not self._limiter.test(self._item, caller.identity, cost=cost):
            self._refuse(caller)

    def _refuse(self, caller: Caller) -> None:
        stats = self._limiter.get_window_stats(self._item, caller.identity)
        retry_s = max(1, math.ceil(stats.reset_time - time.time()))
        who = "tenant " + caller.tenant if caller.identity.startswith("tenant:") else \
            "this client"
        raise ApiError(
            429,
            f"over this server's limit of submissions_per_minute={self.per_minute} for "
            f"{who}; retry in {retry_s} s",
            details={"limit": "submissions_per_minute", "retry_after_s": retry_s},
            headers={"Retry-After": str(retry_s)},
        )
