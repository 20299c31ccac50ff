"""Large finished plans: rendered once, kept in a file, streamed on every read (issue 50 item 5).

A finished job's view never changes. Views small enough live in memory (planner.api.cache); a
larger one (a 107 MB plan was rendered again on every GET, and four GETs at once took the API
process to 5.4 GB) is rendered once, by splicing the plan's stored JSON text into the rest of
the view (no parse, no second serialisation: string concatenation), written to a file of this
process, and streamed from it in chunks. The files are bounded in total
(`rendered_disk_bytes`, least recently used first out; a file being streamed stays readable
after it is evicted, as an open file does) and removed when the service stops.

`install_plan_cap_schema` states the plan size cap (`max_plan_bytes`, enforced for every method
by the solver process: planner.api.worker) in the OpenAPI document.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, BinaryIO

from planner.api.models import Job

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.responses import Response

    from planner.api.settings import Settings

LARGE_PLAN_CHARS = 1 << 20  # a plan's stored JSON this long or longer is spliced, not parsed
CHUNK_BYTES = 1 << 20
_SPLICE = "__planner_plan_text__"


def render_spliced(job: Job, plan_text: str, *, cached: bool = False) -> bytes:
    """`job`'s view (its plan left unparsed as `plan_text`): what `job_view(job with the plan
    parsed).model_dump_json()` says, without parsing or serialising the plan."""
    from planner.api.job_views import job_view

    marker = {_SPLICE: True}
    view = job_view(replace(job, plan=marker), cached=cached)
    has_actions = '"actions":[' in plan_text and '"actions":[]' not in plan_text
    view.timeline_url = f"{view.url}/timeline.png" if has_actions else None
    text = view.model_dump_json()
    head, sep, tail = text.partition(f'{{"{_SPLICE}":true}}')
    assert sep, "the plan's marker is in the view"
    return b"".join((head.encode(), plan_text.encode(), tail.encode()))


class RenderedFiles:
    """Rendered views in files of one folder (made on first use), by (job id, cached); each
    remembers its tenant (a read of another tenant's answers no file). Bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._folder: str | None = None
        self._items: OrderedDict[tuple[str, bool], tuple[str, int, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def open(self, job_id: str, cached: bool, tenant: str | None) -> BinaryIO | None:
        """The view's file, open for reading (None: none, or another tenant's)."""
        with self._lock:
            item = self._items.get((job_id, cached))
            if item is None or tenant not in (None, item[2]):
                return None
            self._items.move_to_end((job_id, cached))
            try:
                return open(item[0], "rb")  # noqa: SIM115 - closed by the response
            except OSError:
                self._drop((job_id, cached))
                return None

    def put(self, job_id: str, cached: bool, tenant: str, body: bytes) -> BinaryIO | None:
        """Keep `body` in a file (written, then renamed into place); it, open, or None when
        it cannot be kept (too large for the bound, or the disk refuses)."""
        if len(body) > self.max_bytes:
            return None
        try:
            with self._lock:
                if self._folder is None:
                    self._folder = tempfile.mkdtemp(prefix="planner-rendered-")
                folder = self._folder
            path = os.path.join(folder, f"{job_id}-{int(cached)}.json")
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return None  # served from memory this once; rendered again next time
        with self._lock:
            self._drop((job_id, cached))
            self._items[(job_id, cached)] = (path, len(body), tenant)
            self._bytes += len(body)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                self._drop(next(iter(self._items)))
            return open(path, "rb")  # noqa: SIM115 - closed by the response

    def _drop(self, key: tuple[str, bool]) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]
            try:
                os.unlink(item[0])
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            folder, self._folder = self._folder, None
            self._items.clear()
            self._bytes = 0
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def json_response(answer: bytes | BinaryIO, status_code: int = 200) -> Response:
    """A rendered view as a response: bytes as they are, a file streamed in chunks."""
    from starlette.responses import Response, StreamingResponse

    if isinstance(answer, bytes):
        return Response(answer, status_code=status_code, media_type="application/json")
    size = os.fstat(answer.fileno()).st_size

    def chunks() -> Iterator[bytes]:  # read in a thread (Starlette iterates it off the loop)
        try:
            while chunk := answer.read(CHUNK_BYTES):
                yield chunk
        finally:
            answer.close()

    return StreamingResponse(chunks(), status_code=status_code, media_type="application/json",
                             headers={"Content-Length": str(size)})


def install_plan_cap_schema(app: FastAPI, settings: Settings) -> None:
    """The OpenAPI document states `max_plan_bytes` on a job's plan (JobView.plan)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = build()
        if fresh:
            schemas = document.get("components", {}).get("schemas", {})
            plan = schemas.get("JobView", {}).get("properties", {}).get("plan")
            if plan is not None:
                plan["x-max-bytes"] = settings.max_plan_bytes
                plan["description"] = (
                    plan.get("description", "") + f" At most max_plan_bytes="
                    f"{settings.max_plan_bytes} bytes of JSON, for every method: a larger "
                    "plan fails its job with the reason.").strip()
        return document

    app.openapi = openapi  # type: ignore[method-assign]
