"""Optional bearer-token authentication and a per-key submission rate limit."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque

from fastapi import Request

from planner.service.errors import ApiError
from planner.service.settings import Settings


class Authenticator:
    """Keys from settings; every key is compared (in constant time) so timing tells nothing."""

    def __init__(self, settings: Settings) -> None:
        self._keys = [k.get_secret_value().encode() for k in settings.api_keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def identity(self, request: Request) -> str:
        """Who is asking: a digest of the token, or the client address when auth is off."""
        if not self.enabled:
            return "addr:" + (request.client.host if request.client else "unknown")
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise ApiError(
                401,
                "missing credentials: send 'Authorization: Bearer <api key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "malformed Authorization header: expected 'Bearer <api key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        presented = token.strip().encode()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        if not matched:
            raise ApiError(403, "the API key is not valid for this server")
        return "key:" + hashlib.sha256(presented).hexdigest()[:16]


class RateLimiter:
    """At most `per_minute` submissions per identity in any sliding 60-second window."""

    WINDOW_S = 60.0
    MAX_IDENTITIES = 10_000  # beyond this, idle identities are forgotten

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, identity: str, cost: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._events) > self.MAX_IDENTITIES:
                self._events = {
                    k: v for k, v in self._events.items() if v and now - v[-1] <= self.WINDOW_S
                }
            events = self._events.setdefault(identity, deque())
            while events and now - events[0] > self.WINDOW_S:
                events.popleft()
            if len(events) + cost > self.per_minute:
                retry = max(1, int(self.WINDOW_S - (now - events[0])) + 1) if events else 60
                raise ApiError(
                    429,
                    f"over this server's limit of submissions_per_minute={self.per_minute} "
                    f"for this client; retry in {retry} s",
                    details={"limit": "submissions_per_minute", "retry_after_s": retry},
                    headers={"Retry-After": str(retry)},
                )
            events.extend([now] * cost)
