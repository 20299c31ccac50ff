"""Large uploads are parsed in a pool of processes: the API process does only HTTP.

A 13 MB graph (20,000 nodes, inside the caps) cost 4-7.5 s of the API process's interpreter
to parse, validate, hash and resolve (its store-all peak for a relative budget), while it held
the GIL: six at once held another tenant's `GET /v1/plans` for 10 s. Now a body of
`upload_pool_min_bytes` or more sent to POST /v1/graphs, /v1/plans, /v1/sweeps or
/v1/partitions is read by `UploadPoolMiddleware` (bytes only), after the caller is known (401
and the rate limit answered before a byte of the body is read), and handed to a pool process
(`prepare_body`) that parses, validates, hashes and resolves it exactly as the route would (the
same models, the same `planner.api.service` functions, the same messages). What comes back is
small: the graph's canonical JSON, its hash and the resolved requests' values. The API process
stores the graph (a database write, in a thread) and runs the route on a small body naming it
by `graph_id`; the route takes the pool's resolution (planner.api.prepared) instead of reading
the graph again. A graph upload is answered here.

Bounded: `upload_workers` processes (niced, as solver processes are) parse at once;
`upload_queue` more wait (beyond: 503 with Retry-After), at most `upload_queue_per_tenant` of
them one tenant's (beyond: 429 with Retry-After).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from planner.api.errors import ApiError, error_response, storage_error_response
from planner.api.prepared import PREPARED, Prepared, request_values
from planner.api.settings import Settings

log = logging.getLogger("planner.api")

# Route -> the kind of body it reads.
KINDS = {"/v1/graphs": "graphs", "/v1/plans": "plans", "/v1/sweeps": "sweeps",
         "/v1/partitions": "partitions"}
BUSY_RETRY_S = 2  # Retry-After of a 503/429 when the pool's queue is full
POOL_NICE = 5  # the pool's processes yield the CPU to the API process (solvers: 10)


@dataclass(frozen=True)
class Refusal:
    """An error answer made in a pool process (ApiError's fields: picklable)."""

    status: int
    message: str
    code: str | None = None
    details: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def response(self) -> Any:
        return error_response(self.status, self.message, code=self.code, details=self.details,
                              headers=self.headers)


# -- in a pool process --------------------------------------------------------------------------
_SETTINGS: Settings | None = None


def _init_process(settings: Settings) -> None:
    global _SETTINGS
    _SETTINGS = settings
    try:
        os.nice(POOL_NICE)
    except OSError:  # pragma: no cover - not allowed here: run at the API's priority
        pass
    from planner.engine.registry import register_method

    for name, target in settings.extra_methods.items():
        register_method(name, target)


def prepare_body(kind: str, body: bytes, tenant: str) -> Prepared | Refusal | None:
    """What the route would make of `body` (a pool process): Prepared, or the error answer it
    would give (Refusal), or None when the body has no graph to take off the API's hands."""
    from planner.core.errors import InputError

    assert _SETTINGS is not None
    try:
        return _prepare(_SETTINGS, kind, body, tenant)
    except ApiError as e:
        return Refusal(e.status, e.message, e.code, e.details, e.headers)
    except InputError as e:
        return Refusal(422, str(e), details={"field": e.field} if e.field else None)
    except Exception as e:  # a bug: as the app's handler answers it
        log.exception("unhandled error in the upload pool")
        return Refusal(500, f"internal error ({type(e).__name__}); see the server log")


def _validation_refusal(errors: list[Any], body: bytes | str | None = None) -> Refusal:
    from fastapi.exceptions import RequestValidationError

    from planner.api.errors import describe_request_error

    located = [{**e, "loc": ("body", *e.get("loc", ()))} for e in errors]
    return Refusal(422, describe_request_error(RequestValidationError(located, body=body)))


def _prepare(settings: Settings, kind: str, body: bytes,
             tenant: str) -> Prepared | Refusal | None:
    from pydantic import TypeAdapter, ValidationError

    from planner.api import service
    from planner.api.request_documents import GraphBody
    from planner.api.schemas import PlanRequest, SweepRequest
    from planner.engine.request import RequestGraph

    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        return Refusal(422, "body: not valid UTF-8 JSON")
    except json.JSONDecodeError as e:
        return _validation_refusal([{"type": "json_invalid", "loc": (e.pos,),
                                     "msg": "JSON decode error", "input": {},
                                     "ctx": {"error": e.msg}}], e.doc)
    model: Any
    try:
        if kind == "graphs":
            document = TypeAdapter(GraphBody).validate_python(data)
            graph = service.parse_graph(settings, document)
            return Prepared(graph.content_hash(), graph.model_dump_json(), len(graph.nodes),
                            len(graph.edges), [], tenant=tenant)
        if kind == "partitions":
            return _prepare_partition(settings, data, tenant)
        model = (PlanRequest if kind == "plans" else SweepRequest).model_validate(data)
    except ValidationError as e:
        return _validation_refusal(e.errors())
    if model.graph is None:
        return None  # named by graph_id: nothing large to parse twice
    most = settings.max_sweep_budgets
    if kind == "sweeps" and len(model.budgets) > most:  # as the route says it
        return Refusal(422, f"budgets: {len(model.budgets)} budgets, over this server's limit "
                       f"of max_sweep_budgets={most}",
                       details={"limit": "max_sweep_budgets", "max": most})
    graph = service.parse_graph(settings, model.graph)
    source = RequestGraph.given(graph)
    requests = [service.resolve_plan(settings, source, model)] if kind == "plans" \
        else service.resolve_sweep(settings, source, model)
    rest = {k: v for k, v in data.items() if k != "graph"}
    rest["graph_id"] = source.content_hash
    return Prepared(source.content_hash, graph.model_dump_json(), len(graph.nodes),
                    len(graph.edges), [request_values(r) for r in requests],
                    body=json.dumps(rest).encode(), tenant=tenant)


def _prepare_partition(settings: Settings, data: Any, tenant: str) -> Prepared:
    """As POST /v1/partitions: the plan request it is, resolved; its route is /v1/plans."""
    from planner.api import service
    from planner.api.routers.partitions import (
        DEFAULT_TIME_LIMIT_S,
        PartitionRequest,
        in_body_words,
        plan_request,
    )
    from planner.core.errors import InputError
    from planner.engine.request import RequestGraph

    body = PartitionRequest.model_validate(data)
    if "time_limit" not in body.model_fields_set:  # the default, within this server's cap
        body = body.model_copy(update={"time_limit": min(
            DEFAULT_TIME_LIMIT_S, settings.max_time_limit_s)})
    try:
        plan_body = plan_request(body)
        graph = service.parse_graph(settings, plan_body.graph)
        source = RequestGraph.given(graph)
        request = service.resolve_plan(settings, source, plan_body)
    except InputError as e:
        raise in_body_words(e) from None
    rest = plan_body.model_dump(mode="json", exclude={"graph"}, exclude_defaults=True)
    rest["graph_id"] = source.content_hash
    return Prepared(source.content_hash, graph.model_dump_json(), len(graph.nodes),
                    len(graph.edges), [request_values(request)],
                    body=json.dumps(rest).encode(), path="/v1/plans", tenant=tenant)


# -- in the API process -------------------------------------------------------------------------
class UploadPool:
    """The processes, started at the first large upload, and the bounds on who waits."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._executor: ProcessPoolExecutor | None = None
        self._running: asyncio.Semaphore | None = None
        self.waiting = 0  # admitted, not yet parsed (running ones included)
        self.per_tenant: Counter[str] = Counter()

    def admit(self, tenant: str) -> None:
        """Count an upload in, or refuse it: 429 over the tenant's share, 503 over the
        queue."""
        s = self.settings
        if self.per_tenant[tenant] >= s.upload_queue_per_tenant:
            raise ApiError(
                429,
                f"tenant {tenant} has {self.per_tenant[tenant]} large uploads being parsed or "
                f"waiting, this server's limit is upload_queue_per_tenant="
                f"{s.upload_queue_per_tenant}; retry in {BUSY_RETRY_S} s",
                details={"limit": "upload_queue_per_tenant", "max": s.upload_queue_per_tenant,
                         "retry_after_s": BUSY_RETRY_S},
                headers={"Retry-After": str(BUSY_RETRY_S)},
            )
        if self.waiting >= s.upload_workers + s.upload_queue:
            raise ApiError(
                503,
                f"{self.waiting} large uploads are being parsed or waiting, this server's limit "
                f"is upload_workers + upload_queue = {s.upload_workers + s.upload_queue}; retry "
                f"in {BUSY_RETRY_S} s",
                details={"limit": "upload_queue", "retry_after_s": BUSY_RETRY_S},
                headers={"Retry-After": str(BUSY_RETRY_S)},
            )
        self.waiting += 1
        self.per_tenant[tenant] += 1

    def release(self, tenant: str) -> None:
        self.waiting -= 1
        self.per_tenant[tenant] -= 1
        if self.per_tenant[tenant] <= 0:
            del self.per_tenant[tenant]

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            import multiprocessing

            self._executor = ProcessPoolExecutor(
                self.settings.upload_workers, mp_context=multiprocessing.get_context("forkserver"),
                initializer=_init_process, initargs=(self.settings,))
        return self._executor

    async def prepare(self, kind: str, body: bytes, tenant: str) -> Prepared | Refusal | None:
        if self._running is None:
            self._running = asyncio.Semaphore(self.settings.upload_workers)
        async with self._running:
            pool = self._pool()
            try:
                return await asyncio.wrap_future(pool.submit(prepare_body, kind, body, tenant))
            except BrokenProcessPool:  # a process died (killed, out of memory): a fresh pool
                self._executor = None
                pool.shutdown(wait=False, cancel_futures=True)
                log.error("upload pool: a process died; starting a new pool")
                raise ApiError(503, "the upload pool lost a process; retry",
                               details={"retry_after_s": BUSY_RETRY_S},
                               headers={"Retry-After": str(BUSY_RETRY_S)}) from None

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _json_body(scope: Scope) -> bool:
    """As FastAPI decides to read a body as JSON: no content type, or application/*json."""
    import email.message

    for name, value in scope.get("headers", []):
        if name == b"content-type":
            message = email.message.Message()
            message["content-type"] = value.decode("latin-1")
            subtype = message.get_content_subtype()
            return message.get_content_maintype() == "application" and (
                subtype == "json" or subtype.endswith("+json"))
    return True


class UploadPoolMiddleware:
    """Routes large bodies through the upload pool (see the module docstring)."""

    def __init__(self, app: ASGIApp, pool: UploadPool) -> None:
        self.app = app
        self.pool = pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = KINDS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None or scope.get("method") != "POST" or not _json_body(scope):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        threshold = self.pool.settings.upload_pool_min_bytes
        if declared is not None and declared < threshold:
            await self.app(scope, receive, send)
            return
        try:
            who = await self._caller(scope)
        except Exception as e:
            await _error_answer(scope, e)(scope, receive, send)
            return
        read = await _read_body(receive, threshold if declared is None else None)
        if read is None:
            return  # the client left: nothing to answer
        body, small = read
        if small:  # a chunked body under the threshold: the route reads it as it is
            await self.app(scope, _replay(body, receive), send)
            return
        await self._large(kind, who, scope, body, receive, send)

    async def _caller(self, scope: Scope) -> Any:
        """The caller (401/403 as the routes answer them), and the rate limit's 429 now, before
        the body is read; counted in the pool's queue."""
        parts = scope["app"].state.parts
        request = Request(scope)
        known = parts.auth.caller_cached(request)
        if known is None:
            known = await run_in_threadpool(parts.auth.caller, request)
        request.state.caller = known  # the route's identity dependency reads it from here
        parts.limiter.peek(known)
        return known

    async def _large(self, kind: str, who: Any, scope: Scope, body: bytes, receive: Receive,
                     send: Send) -> None:
        parts = scope["app"].state.parts
        try:
            self.pool.admit(who.tenant)
        except ApiError as e:
            await _error_answer(scope, e)(scope, receive, send)
            return
        try:
            prepared = await self.pool.prepare(kind, body, who.tenant)
            if prepared is not None:
                body = b""  # not held while the route runs
            if isinstance(prepared, Prepared):
                if kind == "graphs":
                    parts.limiter.check(who)
                created = await run_in_threadpool(
                    parts.store.put_graph, prepared.graph_hash, prepared.document,
                    prepared.nodes, prepared.edges, who.tenant)
        except Exception as e:
            await _error_answer(scope, e)(scope, receive, send)
            return
        finally:
            self.pool.release(who.tenant)
        if isinstance(prepared, Refusal):
            await prepared.response()(scope, receive, send)
            return
        if prepared is None:  # nothing to take over: the route parses it (small work)
            await self.app(scope, _replay(body, receive), send)
            return
        if prepared.body is None:  # a graph upload: answered here
            from fastapi.responses import JSONResponse

            from planner.api.schemas import GraphCreated

            answer = GraphCreated(id=prepared.graph_hash, nodes=prepared.nodes,
                                  edges=prepared.edges, created=created,
                                  url=f"/v1/graphs/{prepared.graph_hash}")
            await JSONResponse(answer.model_dump(), status_code=201 if created else 200)(
                scope, receive, send)
            return
        small = prepared.body
        headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(small)).encode()))
        inner = {**scope, "headers": headers}
        if prepared.path is not None:
            inner["path"] = prepared.path
            inner["raw_path"] = prepared.path.encode()
        token = PREPARED.set(prepared)
        try:
            await self.app(inner, _replay(small, receive), send)
        finally:
            PREPARED.reset(token)


def _error_answer(scope: Scope, exc: Exception) -> Any:
    """What the app's handlers answer for `exc` (this middleware runs outside them): an
    ApiError as it says, a storage fault 503 with its cause (planner.api.errors); anything else
    is re-raised (the app's last handler: a 500)."""
    from sqlalchemy.exc import DBAPIError

    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, code=exc.code, details=exc.details,
                              headers=exc.headers)
    health = scope["app"].state.storage_health
    cause = health.failed(exc) if isinstance(exc, DBAPIError) else None
    problem = health.problem()
    if cause is None or problem is None:
        raise exc
    return storage_error_response(cause, problem[1])


async def _read_body(receive: Receive, limit: int | None) -> tuple[bytes, bool] | None:
    """(the body, whether it ended under `limit`), or None when the client left; reads all of
    it when `limit` is None."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), limit is not None and size < limit


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
