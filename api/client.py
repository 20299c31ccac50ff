"""The HTTP client of the planning service, shared by `planner-cli submit/status` and the runtime
agent: one place for the endpoints, the error answers and the polling policy.

It speaks HTTP only (httpx, imported when a client is made) and never imports the service.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

FINISHED = ("done", "infeasible", "failed", "cancelled")
POLL_FIRST_S = 0.1  # first poll delay; grows ×1.5 up to POLL_MAX_S, so a long solve costs few polls
POLL_MAX_S = 2.0


class ServiceError(RuntimeError):
    """The service could not be used: unreachable, an error answer, or an answer that is not
    JSON. `status_code` is the HTTP status where there was one."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ServiceTimeout(ServiceError):
    """The job was still unfinished when the caller's wait ran out."""


CONNECT_RETRIES = 5  # about 7.5 s of refused connections before giving up


class PlannerClient:
    """`with PlannerClient(url, token) as c: job = c.wait(c.submit_plan(body)["id"])`."""

    def __init__(self, server: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        import httpx

        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # A service still starting (README: `serve &` then `submit`) refuses connections for a
        # few seconds: httpx's transport retries those, with backoff (0.5, 1, 2, 4 s).
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s,
                                  transport=httpx.HTTPTransport(retries=CONNECT_RETRIES))

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """(HTTP status, JSON body); ServiceError for transport failures and error answers."""
        import httpx

        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise ServiceError(f"{self.server}: cannot reach the service: {e}") from None
        try:
            body = response.json()
        except ValueError:
            raise ServiceError(
                f"{self.server}{path}: HTTP {response.status_code}, not a JSON answer",
                response.status_code,
            ) from None
        if response.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise ServiceError(
                f"{self.server}: HTTP {response.status_code}: {message or body}",
                response.status_code,
            )
        return response.status_code, body

    # -- plans ---------------------------------------------------------------------------------
    def submit_plan(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST /v1/plans: 202 and the queued job, or 200 with a finished one (from the store)."""
        code, job = self.request("POST", "/v1/plans", json=body)
        return code, job

    def get_plan(self, job_id: str) -> dict[str, Any]:
        _, job = self.request("GET", f"/v1/plans/{job_id}")
        return dict(job)

    def cancel_plan(self, job_id: str) -> None:
        self.request("DELETE", f"/v1/plans/{job_id}", timeout=5)

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job is finished, backing off; `on_change` sees the job only when its
        status or progress changed. ServiceTimeout when `timeout_s` passes first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = POLL_FIRST_S
        seen: tuple[Any, Any] | None = None
        while True:
            job = self.get_plan(job_id)
            if job.get("status") in FINISHED:
                return job
            state = (job.get("status"), repr(job.get("progress")))
            if on_change is not None and state != seen:
                on_change(job)
            seen = state
            if deadline is not None and time.monotonic() + delay > deadline:
                raise ServiceTimeout(f"no plan after {timeout_s:g} s (job {job_id})")
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)
