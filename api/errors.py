"""One JSON error shape for every failure, and the request-body size limit.

Every error is `{"error": {"code", "message", "details"}}` with one line of message that names
the field, node or limit, whatever raised it: our own ApiError, planner's InputError (the
request field at fault, as the body names it, also in `details.field`), FastAPI's request
validation, Starlette's 404/405, or a bug (500, no traceback).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error ({type(exc).__name__}); see the server log")


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
