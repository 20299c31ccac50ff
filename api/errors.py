"""One JSON error shape for every failure, and the request-body size limit.

Every error is `{"error": {"code", "message", "details"}}` with one line of message that names
the field, node or limit, whatever raised it: our own ApiError, planner's InputError (the
request field at fault, as the body names it, also in `details.field`), FastAPI's request
validation, Starlette's 404/405, a storage fault (503 naming its cause: see StorageHealth), or
a bug (500, no traceback).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from planner.core.errors import InputError, describe_json_decode_error

log = logging.getLogger("planner.api")

CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_input",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or CODES.get(status, "error")
        self.details = details
        self.headers = headers


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code or CODES.get(status, "error"), "message": message,
                      "details": details}}
    return JSONResponse(body, status_code=status, headers=headers)


# Storage faults: cause -> what it means to a person. Classified from the driver's own error.
DISK_FULL, READ_ONLY, UNREACHABLE, BUSY, NO_TABLES, FAILING = (
    "disk_full", "read_only", "unreachable", "busy", "no_tables", "failing")
STORAGE_CAUSES = {
    DISK_FULL: "the database's disk is full",
    READ_ONLY: "the database is read-only",
    UNREACHABLE: "the database cannot be opened or reached",
    BUSY: "the database is locked by another writer",
    # A PostgreSQL database dropped and created again under the service (or its tables
    # dropped): each statement failed with UndefinedTable, a 500 before.
    NO_TABLES: "the database has lost the service's tables (dropped and created again?); "
    "restore it, or restart the service to make them anew",
    FAILING: "the database failed",
}
STORAGE_RETRY_AFTER_S = 5
# sqlite3's messages and PostgreSQL's SQLSTATEs (psycopg puts them on `sqlstate`).
_SQLITE_TEXT = (("database or disk is full", DISK_FULL), ("no space left", DISK_FULL),
                ("readonly database", READ_ONLY), ("read-only", READ_ONLY),
                ("unable to open", UNREACHABLE), ("database is locked", BUSY),
                ("no such table", NO_TABLES))
# 3D000: the database does not exist (dropped); 42P01: a table does not exist.
_SQLSTATES = {"53100": DISK_FULL, "25006": READ_ONLY, "57P01": UNREACHABLE,
              "57P02": UNREACHABLE, "57P03": UNREACHABLE, "3D000": UNREACHABLE,
              "42P01": NO_TABLES}


def public_detail(exc: BaseException) -> str:
    """What a client may read of a storage error. SQLite's messages are fixed phrases ("database
    or disk is full"); a network driver's name the database's host and port ("connection to
    server at ... port 5432 failed"), which an unauthenticated probe must not learn: those give
    only their SQLSTATE or class. The log keeps the whole text."""
    import sqlite3

    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, sqlite3.Error):
        return " ".join(str(orig).split())[:200]
    state = str(getattr(orig, "sqlstate", "") or "")
    return f"SQLSTATE {state}" if state else type(orig).__name__


def classify_storage_error(exc: BaseException) -> str | None:
    """The storage cause of a database error (a key of STORAGE_CAUSES), or None when it is not
    the storage's fault (a constraint, a bug in a statement: those stay 500s)."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    state = str(getattr(orig, "sqlstate", "") or "")
    if state in _SQLSTATES:
        return _SQLSTATES[state]
    if state.startswith("08") or exc.connection_invalidated:  # connection exceptions
        return UNREACHABLE
    text = str(orig if orig is not None else exc).lower()
    for needle, cause in _SQLITE_TEXT:
        if needle in text:
            return cause
    if isinstance(exc, OperationalError):  # psycopg: "connection failed", "server closed", ...
        return UNREACHABLE if "connect" in text or "server closed" in text else FAILING
    return None


class StorageHealth:
    """Whether the store takes writes: set by any storage error (request handlers, the job
    dispatcher), cleared by the next write that succeeds (the dispatcher's heartbeat, /readyz's
    probe). Logs one line per cause per minute, however many requests fail."""

    LOG_INTERVAL_S = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.cause: str | None = None
        self.detail = ""  # the driver's whole text: for the log
        self.public = ""  # what clients read (public_detail)
        self._logged_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def failed(self, exc: BaseException) -> str | None:
        """Record a storage error; its cause, or None when `exc` is no storage error."""
        cause = classify_storage_error(exc)
        if cause is None:
            return None
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        detail = " ".join(str(orig).split())[:200]
        now = self._clock()
        with self._lock:
            self.cause, self.detail, self.public = cause, detail, public_detail(exc)
            last = self._logged_at.get(cause)
            if last is not None and now - last < self.LOG_INTERVAL_S:
                self._suppressed[cause] = self._suppressed.get(cause, 0) + 1
                return cause
            self._logged_at[cause] = now
            repeats = self._suppressed.pop(cause, 0)
        more = f" ({repeats} more since the last report)" if repeats else ""
        log.error("storage fault: %s (%s)%s; writes answer 503 until one succeeds",
                  STORAGE_CAUSES[cause], detail, more)
        return cause

    def recovered(self) -> None:
        """A write succeeded: ready again."""
        with self._lock:
            cause, self.cause, self.detail, self.public = self.cause, None, "", ""
        if cause is not None:
            log.warning("storage recovered: writes succeed again (was: %s)",
                        STORAGE_CAUSES[cause])

    def problem(self) -> tuple[str, str] | None:
        """(cause, one-line message for clients) while the store refuses writes, else None."""
        with self._lock:
            cause, detail = self.cause, self.public
        if cause is None:
            return None
        return cause, f"{STORAGE_CAUSES[cause]} ({detail})"


def storage_error_response(cause: str, message: str) -> JSONResponse:
    return error_response(
        503, f"storage unavailable: {message}; retry later",
        code="storage_" + cause, details={"cause": cause},
        headers={"Retry-After": str(STORAGE_RETRY_AFTER_S)},
    )


def describe_request_error(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":  # a character offset alone says nothing to a person
        at = first.get("loc", ())
        offset = at[1] if len(at) > 1 and isinstance(at[1], int) else 0
        reason = str((first.get("ctx") or {}).get("error", "invalid JSON"))
        body = exc.body if isinstance(exc.body, str | bytes) else None
        return describe_json_decode_error(body, offset, reason)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    where = ".".join(loc) or "body"
    msg = str(first.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}: {msg}{more}"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(
            exc.status, exc.message, code=exc.code, details=exc.details, headers=exc.headers
        )

    @app.exception_handler(InputError)
    async def _input_error(_: Request, exc: InputError) -> JSONResponse:
        # The request field at fault, in the body's words (`budget`, `options.slots`).
        details = {"field": exc.field} if exc.field else None
        return error_response(422, str(exc), details=details)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, describe_request_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 400 and "parsing the body" in message:
            # Undecodable bytes: a malformed body, like any other (422, not a bare 400).
            return error_response(422, "body: not valid UTF-8 JSON")
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such resource: {request.url.path}"
        headers = getattr(exc, "headers", None)
        allowed = allowed_methods(request) if exc.status_code == 405 else []
        if allowed:
            # Starlette names only the first matching route's methods; a path served by
            # several routes (GET and DELETE /v1/plans/{id}) allows them all.
            message = f"{request.method} is not allowed on {request.url.path}; use " + \
                ", ".join(allowed)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(DBAPIError)
    async def _storage_error(request: Request, exc: DBAPIError) -> JSONResponse:
        health: StorageHealth = request.app.state.storage_health
        cause = health.failed(exc)  # logs once per cause and minute
        problem = health.problem()
        if cause is None or problem is None:
            return await _bug(request, exc)
        return storage_error_response(cause, problem[1])

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        # Starlette answers this one from its outermost middleware, outside the one that adds
        # the security headers (planner.api.web): they go on here.
        from planner.api.web import DEFAULT_CSP, SECURITY_HEADERS

        log.exception("unhandled error")
        return error_response(500, f"internal error ({type(exc).__name__}); see the server log",
                              headers={**SECURITY_HEADERS, "Content-Security-Policy": DEFAULT_CSP})


def allowed_methods(request: Request) -> list[str]:
    """Every method the OpenAPI document lists for this request's path (what a client reads
    as the API's contract, whichever internal routes serve it)."""
    import re

    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, request.url.path):
            methods |= {m.upper() for m in operations}
    return sorted(methods)


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: by Content-Length up front, or while a chunked body
    streams in (the app has not answered yet, since it reads the body before responding)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(scope, receive, send)
                    return
        seen = 0
        exceeded = False
        replaced = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge  # the framework may turn this into its own 400
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal replaced
            if not exceeded:
                await send(message)
            elif not replaced:  # whatever the app answers to the cut body becomes our 413
                replaced = True
                await self._reject(scope, receive, send)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            pass
        if exceeded and not replaced:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            f"request body over this server's limit of max_body_bytes={self.max_bytes} (graph "
            "uploads with POST /v1/graphs have the same limit); a larger graph needs a server "
            "started with a larger PLANNER_MAX_BODY_BYTES",
            details={"limit": "max_body_bytes", "max_bytes": self.max_bytes},
        )
        await response(scope, receive, send)
