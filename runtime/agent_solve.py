"""Where the runtime agent's plans are solved: in-process (`solve_here`) or on the service
(`ask_service`, POST /v1/plans polled until done), with progress lines while it waits.

One line when the wait starts (what, the budget, the time limit), one every
PLANNER_PROGRESS_EVERY_S seconds (default 5, as the CLI's plain progress lines) while it lasts,
with the best plan's overhead and the bound as the solver reports them, and the caller's result
line (`plan_outcome`). All on the `planner.runtime.agent` logger at INFO: a user silences them
with `logging.getLogger("planner.runtime.agent").setLevel(logging.WARNING)`. httpx's line per
request is kept to WARNING while the agent polls, unless its level was set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from planner.core.budget import format_bytes
from planner.core.graph import Graph
from planner.core.io import plan_from_dict
from planner.core.plan import Plan
from planner.engine.progress import progress_every_s, progress_text
from planner.engine.request import ResolvedRequest

log = logging.getLogger("planner.runtime.agent")


def plan_outcome(plan: Plan, seconds: float) -> str:
    """'peak 1.69 MiB, overhead +12.9 %, 19.8 s' (the result line's figures)."""
    predicted = plan.predicted
    if predicted is None:
        return f"{plan.status.value}, {seconds:.1f} s"
    return (f"peak {format_bytes(predicted.peak_bytes)}, overhead "
            f"{100 * predicted.overhead:+.1f} %, {seconds:.1f} s")


class SolveProgress:
    """`with SolveProgress(label, ...) as progress:` logs the start line, then a line every
    `progress_every_s()` until the block ends; `update` is an engine progress callback
    (planner.engine.progress), `update_job` the service client's `on_change`."""

    def __init__(self, label: str, budget_bytes: int, time_limit_s: float,
                 total_compute_ms: float) -> None:
        self.label, self.budget_bytes, self.time_limit_s = label, budget_bytes, time_limit_s
        self.total_compute_ms = total_compute_ms
        self.detail = "no plan yet"
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def update(self, objective: float | None, bound: float | None) -> None:
        self.detail = progress_text(objective, bound, self.total_compute_ms)

    def update_job(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        best, bound = progress.get("best_objective"), progress.get("best_bound")
        known = best is not None or bound is not None
        self.detail = str(job.get("status")) + (
            f" · {progress_text(best, bound, self.total_compute_ms)}" if known else "")

    def __enter__(self) -> SolveProgress:
        every_s = progress_every_s()
        log.info("%s for a budget of %s, time limit %g s", self.label,
                 format_bytes(self.budget_bytes), self.time_limit_s)
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._tick, args=(every_s,), daemon=True,
                                        name="planner-agent-progress")
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _tick(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            log.info("%s: %.1f s of %g s · %s", self.label, self.elapsed_s,
                     self.time_limit_s, self.detail)


class ServiceUnavailable(RuntimeError):
    """The service could not give a plan in time (unreachable, slow, failing)."""


class ServiceRefused(PermissionError):
    """The service refused this client's credentials (HTTP 401 or 403): a setting to fix, not
    an outage to fall back from (a fallback plan would hide it behind a worse schedule)."""


AUTH_STATUSES = (401, 403)
API_KEY_ENV = "PLANNER_API_KEY"  # as the CLI's --token


def api_key(token: str | None) -> str | None:
    """The key to send: `token`, else $PLANNER_API_KEY (as `planner-cli submit` reads it)."""
    return token or os.environ.get(API_KEY_ENV) or None


def refused_message(server: str, status: int, reason: str, token: str | None) -> str:
    sent = "the API key sent" if token else f"a request without an API key (${API_KEY_ENV} unset)"
    return (f"the service at {server} refused {sent}: HTTP {status} ({reason}); set "
            f"${API_KEY_ENV} or pass token= with a key of this server (`planner-cli keys add`)")


def solve_here(request: ResolvedRequest, label: str) -> tuple[Plan, str]:
    """The request's plan, with progress lines while it solves, and the result's figures."""
    with SolveProgress(label, request.budget_bytes, request.time_limit_s,
                       request.graph.total_compute_ms) as progress:
        plan = request.solve(progress=progress.update)
    return plan, plan_outcome(plan, progress.elapsed_s)


def cache_name(request: ResolvedRequest) -> str:
    """What the agent's plan cache files a request's plan under: its method, and with options
    the method and a digest of them (`rotor_1a2b3c4d5e`), so a plan made with options never
    answers the method's default request, nor the default plan an optioned one."""
    if not request.options:
        return request.method
    text = json.dumps(dict(request.options), sort_keys=True, separators=(",", ":"))
    return f"{request.method}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def ask_service(
    server: str, graph: Graph, budget_bytes: int, method: str, timeout_s: float,
    time_limit_s: float, token: str | None = None, *,
    options: Mapping[str, Any] | None = None,
) -> Plan:
    """POST /v1/plans (with the method's `options`) and poll until the job finishes;
    ServiceRefused when the service refuses the key (`token`, else $PLANNER_API_KEY),
    ServiceUnavailable on any other failure."""
    from planner.api.client import PlannerClient, ServiceError, ServiceTimeout

    token = api_key(token)
    body = {
        "graph": graph.model_dump(mode="json"),
        # bytes with their unit: read the same by servers before the one grammar (issue 49)
        "budget": f"{budget_bytes}B",
        "method": method,
        "time_limit": time_limit_s,
    }
    if options:
        body["options"] = dict(options)
    for name in ("httpx", "httpcore"):  # a line per poll at INFO, unless the user chose
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)
    progress = SolveProgress(f"asking the service at {server} ({method})", budget_bytes,
                             time_limit_s, graph.total_compute_ms)
    try:
        with PlannerClient(server, token, timeout_s=min(timeout_s, 30)) as client, progress:
            _, job = client.submit_plan(body)
            try:
                job = client.wait(str(job["id"]), timeout_s=timeout_s,
                                  on_change=progress.update_job)
            except ServiceTimeout as e:
                _cancel(client, str(job.get("id")))
                raise ServiceUnavailable(f"{e}, cancelled") from None
    except ServiceError as e:
        if e.status_code in AUTH_STATUSES:
            reason = str(e).rsplit(": ", 1)[-1]
            raise ServiceRefused(refused_message(server, e.status_code or 0, reason, token)) \
                from None
        raise ServiceUnavailable(str(e)) from None
    if job["status"] in ("failed", "cancelled") or not job.get("plan"):
        raise ServiceUnavailable(f"job {job.get('id')} {job['status']}: {job.get('error') or ''}")
    plan = plan_from_dict(job["plan"], where=f"{server} job {job.get('id')}")
    if plan.graph_hash != graph.content_hash():
        raise ServiceUnavailable("the service answered with a plan for another graph")
    return plan


def _cancel(client: Any, job_id: str) -> None:
    """Best effort: a solve nobody waits for should not keep a service worker busy."""
    try:
        client.cancel_plan(job_id)
    except Exception as e:  # the fallback matters more than the cancel
        log.warning("could not cancel job %s: %s", job_id, e)
