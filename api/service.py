"""What the routes do, without HTTP: resolve a request once (planner.engine.request), answer
from the store or queue a job, cancel, draw timelines. Bad input raises ApiError, or InputError
naming the body's field (the request's field names are the body's)."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, BinaryIO

from planner.api.bounds import check_graph_bounds
from planner.api.cache import KeyIndex, RenderedCache
from planner.api.caps import check_graph_caps, check_option_caps, check_resource_caps
from planner.api.errors import ApiError
from planner.api.job_views import draw_timeline, job_view
from planner.api.jobs import JobManager
from planner.api.metrics import Metrics
from planner.api.models import CACHEABLE, CANCELLED, DEFAULT_TENANT, FINISHED, RUNNING, Job
from planner.api.plan_files import LARGE_PLAN_CHARS, RenderedFiles, render_spliced
from planner.api.settings import Settings
from planner.api.store import Store
from planner.core.errors import InputError
from planner.core.graph import Graph

if TYPE_CHECKING:
    from planner.api.schemas import PlanRequest, SweepRequest
    from planner.engine.request import RequestGraph, ResolvedRequest

ACTIVE_CAP_RETRY_S = 5  # Retry-After when a tenant is at its cap of active jobs


def request_key(
    graph_hash: str,
    budget_bytes: int,
    method: str,
    options: dict[str, Any],
    resources: dict[str, Any] | None = None,
    tenant: str = DEFAULT_TENANT,
) -> str:
    body: dict[str, Any] = {
        "graph": graph_hash, "budget": budget_bytes, "method": method, "options": options
    }
    if resources is not None:  # absent from keys made before resources existed: they still match
        body["resources"] = resources
    if tenant != DEFAULT_TENANT:  # likewise: a tenant's questions and answers are its own
        body["tenant"] = tenant
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def default_limit_s(settings: Settings, method: str) -> float:
    """A request's time limit when it gives none: the server's setting, else the default of
    the method's plan kind (the CLI's too), within the server's cap."""
    from planner.engine.request import default_time_limit_s

    chosen = settings.default_time_limit_s
    return min(default_time_limit_s(method) if chosen is None else chosen,
               settings.max_time_limit_s)


def parse_graph(settings: Settings, data: Any) -> Graph:
    """Validate a graph document within the size limits (422 naming the limit)."""
    if isinstance(data, dict):
        nodes = data.get("nodes")
        edges = data.get("edges", data.get("links"))
        s = settings
        if isinstance(nodes, list) and len(nodes) > s.max_nodes:
            raise ApiError(
                422,
                f"graph: {len(nodes)} nodes, over this server's limit of "
                f"max_nodes={s.max_nodes}",
                details={"limit": "max_nodes", "max": s.max_nodes, "got": len(nodes)},
            )
        if isinstance(edges, list) and len(edges) > s.max_edges:
            raise ApiError(
                422,
                f"graph: {len(edges)} edges, over this server's limit of "
                f"max_edges={s.max_edges}",
                details={"limit": "max_edges", "max": s.max_edges, "got": len(edges)},
            )
    from planner.engine.inputs import graph_from_dict

    graph = graph_from_dict(data, where="graph")
    check_graph_bounds(graph)
    check_graph_caps(graph)
    return graph


def resolve(
    settings: Settings,
    source: RequestGraph,
    budget: int | float | str | None,
    *,
    method: str,
    options: dict[str, Any],
    resources: dict[str, Any] | str | None,
    time_limit: float | None,
) -> ResolvedRequest:
    """One request resolution (planner.engine.request), once per request: InputError (422)
    naming the body's field; then this server's cap on the time limit. Reads only `settings`:
    the upload pool's processes run it too (planner.api.uploads)."""
    from planner.engine.request import resolve_request, resolve_resources

    try:  # the caps first: no check below runs on a machine of 2**63 devices
        machine = resolve_resources(resources)
    except InputError:
        machine = None  # a bad document: resolve_request says so, in its order of fields
    check_resource_caps(machine)
    check_option_caps(method, options)
    cap = settings.max_time_limit_s
    request = resolve_request(
        source, budget, resources=resources, method=method, options=options,
        time_limit=default_limit_s(settings, method) if time_limit is None else time_limit,
        threads=settings.solver_threads,
    )
    if request.time_limit_s > cap:
        raise ApiError(
            422,
            f"time_limit {request.time_limit_s:g} s: over this server's cap of "
            f"max_time_limit_s={cap:g}",
            details={"limit": "max_time_limit_s", "max": cap},
        )
    return request


def resolve_plan(settings: Settings, source: RequestGraph, body: PlanRequest) -> ResolvedRequest:
    return resolve(settings, source, body.budget, method=body.method, options=body.options,
                   resources=body.resources, time_limit=body.time_limit)


def resolve_sweep(settings: Settings, source: RequestGraph,
                  body: SweepRequest) -> list[ResolvedRequest]:
    """One request per distinct budget, smallest first; a budget's errors name it
    (`budgets[2]`)."""
    from planner.engine.request import resolve_budget

    try:
        first = resolve(settings, source, body.budgets[0], method=body.method,
                        options=body.options, resources=body.resources,
                        time_limit=body.time_limit)
    except InputError as e:
        raise e.renamed({"budget": "budgets[0]"}) from None
    budgets = {first.budget_bytes}
    for i, budget in enumerate(body.budgets[1:], start=1):
        try:
            budgets.add(resolve_budget(budget, source, first.resources, method=first.method,
                                       options=first.options))
        except InputError as e:
            raise e.renamed({"budget": f"budgets[{i}]"}) from None
    return [replace(first, budget_bytes=b) for b in sorted(budgets)]


class PlanService:
    def __init__(
        self, store: Store, settings: Settings, metrics: Metrics, manager: JobManager
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.manager = manager
        # Finished jobs are immutable: their rendered views and request keys are cached.
        self.rendered = RenderedCache(settings.response_cache_bytes)
        self.files = RenderedFiles(settings.rendered_disk_bytes)  # those too large for memory
        self._render_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # request key -> (job id, its time limit, proven): the newest finished answer.
        self.answered: KeyIndex[tuple[str, float, bool]] = KeyIndex(max_entries=100_000)
        self.known_graphs: KeyIndex[str] = KeyIndex(max_entries=100_000)

    # -- graphs -------------------------------------------------------------------------------
    def parse_graph(self, data: Any) -> Graph:
        """Validate a graph document within the size limits (422 naming the limit)."""
        return parse_graph(self.settings, data)

    def put_graph(self, graph: Graph, tenant: str = DEFAULT_TENANT) -> tuple[str, bool]:
        graph_hash = graph.content_hash()
        created = self.store.put_graph(
            graph_hash, graph.model_dump_json(), len(graph.nodes), len(graph.edges), tenant
        )
        return graph_hash, created

    def stored_graph(self, graph_id: str, tenant: str | None = None) -> Graph:
        document = self.store.get_graph_document(graph_id, tenant)
        if document is None:
            raise ApiError(
                404, f"graph_id {graph_id!r}: no such graph; upload it with POST /v1/graphs"
            )
        return Graph.model_validate_json(document)

    def request_graph(self, graph: dict[str, Any] | None, graph_id: str | None,
                      tenant: str = DEFAULT_TENANT) -> RequestGraph:
        """The request's graph: sent inline (validated and stored now) or named by its id (read
        from the store only when the request needs it: a relative budget, an offload check)."""
        from planner.engine.request import RequestGraph

        if (graph is None) == (graph_id is None):
            raise ApiError(422, "give exactly one of 'graph' (a graph.json) or 'graph_id'")
        if graph is not None:
            parsed = self.parse_graph(graph)
            self.put_graph(parsed, tenant)
            return RequestGraph.given(parsed)
        assert graph_id is not None
        held = f"{tenant}/{graph_id}"
        if self.known_graphs.get(held) is None:
            if not self.store.graph_exists(graph_id, tenant):
                self.stored_graph(graph_id, tenant)  # raises the 404
            self.known_graphs.put(held, graph_id)
        return RequestGraph(graph_id, lambda: self.stored_graph(graph_id))

    # -- plans --------------------------------------------------------------------------------
    def resolve(
        self,
        source: RequestGraph,
        budget: int | float | str | None,
        *,
        method: str,
        options: dict[str, Any],
        resources: dict[str, Any] | str | None,
        time_limit: float | None,
    ) -> ResolvedRequest:
        """One request resolution (planner.engine.request), once per request: InputError (422)
        naming the body's field; then this server's cap on the time limit."""
        return resolve(self.settings, source, budget, method=method, options=options,
                       resources=resources, time_limit=time_limit)

    def resolve_plan(self, body: PlanRequest, tenant: str = DEFAULT_TENANT) -> ResolvedRequest:
        prepared = self._prepared(body.graph, body.graph_id, tenant)
        if prepared is not None:  # resolved by the upload pool (planner.api.uploads)
            return prepared[0]
        return resolve_plan(self.settings, self.request_graph(body.graph, body.graph_id, tenant),
                            body)

    def resolve_sweep(self, body: SweepRequest,
                      tenant: str = DEFAULT_TENANT) -> list[ResolvedRequest]:
        """One request per distinct budget, smallest first; a budget's errors name it
        (`budgets[2]`)."""
        prepared = self._prepared(body.graph, body.graph_id, tenant)
        if prepared is not None:
            return prepared
        return resolve_sweep(self.settings,
                             self.request_graph(body.graph, body.graph_id, tenant), body)

    def _prepared(self, graph: object, graph_id: str | None,
                  tenant: str) -> list[ResolvedRequest] | None:
        """This request's resolution by the upload pool, when it made one: its graph is stored
        and held by `tenant`, and is read back (in a handler thread) only if a job needs it."""
        from planner.api.prepared import PREPARED

        prepared = PREPARED.get()
        if (prepared is None or graph is not None or graph_id != prepared.graph_hash
                or prepared.tenant != tenant):
            return None
        return prepared.requests(lambda: self.stored_graph(prepared.graph_hash))

    def submit(self, request: ResolvedRequest, *, force: bool = False,
               tenant: str = DEFAULT_TENANT) -> tuple[Job, bool]:
        """(job, answered from the store at once). A finished answer serves the request when no
        more search could improve it (proven, or solved with at least this time limit), unless
        `force`; identical active requests (same key and time limit) share one job. All of it
        within `tenant`: another tenant's answers and jobs are never its."""
        resources = request.resources_document()
        options = dict(request.options)
        key = request_key(request.graph_hash, request.budget_bytes, request.method, options,
                          resources, tenant)
        if not force:
            done = self._known_answer(key, request.time_limit_s)
            if done is None:
                done = self.store.find_answer(key, request.time_limit_s)
            if done is not None:
                self._remember_answer(key, done)
                self.metrics.cache_hits.inc()
                return done, True
        if self.store.find_active(key, request.time_limit_s) is None:
            self.check_active_cap(tenant)
        job, created = self.store.create_or_join_job(
            request_key=key,
            graph_hash=request.graph_hash,
            budget_bytes=request.budget_bytes,
            method=request.method,
            options=options,
            time_limit_s=request.time_limit_s,
            resources=resources,
            tenant=tenant,
        )
        if created:
            self.metrics.submissions.inc()
            self.manager.wake()
        return job, False

    def check_active_cap(self, tenant: str, adding: int = 1) -> None:
        """429 when `adding` more jobs would put the tenant over max_active_jobs_per_tenant
        (checked, then created: concurrent submissions may pass it by a few)."""
        cap = self.settings.max_active_jobs_per_tenant
        active = self.store.active_count(tenant)
        if active + adding > cap:
            raise ApiError(
                429,
                f"tenant {tenant} has {active} queued or running jobs, this server's limit is "
                f"max_active_jobs_per_tenant={cap}; retry when some finish",
                details={"limit": "max_active_jobs_per_tenant", "max": cap, "active": active,
                         "retry_after_s": ACTIVE_CAP_RETRY_S},
                headers={"Retry-After": str(ACTIVE_CAP_RETRY_S)},
            )

    def _known_answer(self, key: str, time_limit_s: float) -> Job | None:
        known = self.answered.get(key)
        if known is None:
            return None
        job_id, solved_with_s, proven = known
        if not proven and solved_with_s < time_limit_s:
            return None
        found = self.store.get_job_text(job_id)  # rendered from its text once, if at all
        return None if found is None else found[0]

    def _remember_answer(self, key: str, job: Job) -> None:
        """Keep the answer that serves the most requests: a proven one, else the one solved
        with the longest time limit."""
        known = self.answered.get(key)
        if known is not None and known[0] != job.id:
            _, solved_with_s, proven = known
            if proven or (not job.proven and solved_with_s > job.time_limit_s):
                return
        self.answered.put(key, (job.id, job.time_limit_s, job.proven))

    def get(self, job_id: str, tenant: str | None = None) -> Job:
        """The job, if `tenant` (None: any) may see it; another tenant's is a 404 like a
        missing one, so its existence does not leak."""
        job = self.store.get_job(job_id, tenant)
        if job is None:
            raise ApiError(404, f"plan {job_id!r}: no such plan job")
        if job.status == CANCELLED:  # DELETE removed it from reads (its row stays, recorded)
            raise ApiError(404, f"plan {job_id!r}: deleted (cancelled by DELETE); POST the "
                           "request again to plan it")
        return job

    def cancel(self, job_id: str, tenant: str | None = None) -> Job:
        job = self.get(job_id, tenant)
        if job.status in FINISHED:
            raise ApiError(
                409,
                f"plan {job_id}: already {job.status}; only queued or running jobs can be "
                "cancelled",
                details={"status": job.status},
            )
        before = self.store.cancel(job_id)
        if before == RUNNING:
            self.manager.cancel(job_id)
        final = self.store.get_job(job_id)  # its last view: reads answer 404 from now on
        if final is None:
            raise ApiError(404, f"plan {job_id!r}: no such plan job")
        return final

    def timeline_png(self, job: Job) -> bytes:
        if job.plan is None or not job.plan.get("actions"):
            raise ApiError(
                409,
                f"plan {job.id} is {job.status}: no schedule to draw",
                details={"status": job.status},
            )
        return draw_timeline(self.stored_graph(job.graph_hash), job)

    # -- views --------------------------------------------------------------------------------
    def cached_answer(self, graph_id: str | None, budget: object, method: str,
                      options: dict[str, Any], resources: object = None,
                      time_limit: float | None = None, force: bool = False,
                      tenant: str = DEFAULT_TENANT) -> bytes | None:
        """The rendered 200 answer of a request solved before, from memory only (no database,
        no thread): graph by id, budget in bytes. None when the slow path must decide."""
        from planner.core.budget import MAX_BUDGET_BYTES

        # An int (never a bool) is bytes in the budget grammar, from 1 byte up.
        if (force or graph_id is None or resources is not None or not isinstance(budget, int)
                or isinstance(budget, bool) or not 1 <= budget <= MAX_BUDGET_BYTES):
            return None  # resources are validated (and keyed) on the slow path
        cap = self.settings.max_time_limit_s
        requested_s = default_limit_s(self.settings, method) if time_limit is None \
            else time_limit
        if requested_s > cap:
            return None  # the slow path says why
        known = self.answered.get(request_key(graph_id, budget, method, options, None, tenant))
        if known is None:
            return None
        job_id, solved_with_s, proven = known
        if not proven and solved_with_s < requested_s:
            return None
        body = self.rendered.get((job_id, True, tenant))
        if body is not None:
            self.metrics.cache_hits.inc()
        return body

    def render(self, job: Job, *, cached: bool = False) -> bytes | BinaryIO:
        """The job's view: bytes, or for a large finished plan its file (rendered once,
        planner.api.plan_files)."""
        key = (job.id, cached, job.tenant)
        if job.status in FINISHED:
            if (body := self.rendered.get(key)) is not None:
                return body
            if (opened := self.files.open(job.id, cached, job.tenant)) is not None:
                return opened
        text = job.plan_text
        if job.plan is None and text is not None:  # read without its plan parsed
            if job.status in FINISHED and len(text) >= LARGE_PLAN_CHARS:
                return self._keep(job, cached, render_spliced(job, text, cached=cached))
            job = replace(job, plan=json.loads(text), plan_text=None)
        body = job_view(job, cached=cached).model_dump_json().encode()
        if job.status in FINISHED:
            return self._keep(job, cached, body)
        return body

    def _keep(self, job: Job, cached: bool, body: bytes) -> bytes | BinaryIO:
        """A finished view kept: in memory, or in a file when too large for memory."""
        if len(body) <= self.rendered.max_bytes // 4:
            self.rendered.put((job.id, cached, job.tenant), body)
            return body
        return self.files.put(job.id, cached, job.tenant, body) or body

    def view(self, job_id: str, tenant: str | None) -> bytes | BinaryIO:
        """GET /v1/plans/{id}: the job's view, if `tenant` (None: any) may see it. A large
        finished plan is never parsed: its stored text is spliced into its view once, kept in
        a file and streamed from it; one render of a job at a time."""
        with self._render_lock(job_id):
            opened = self.files.open(job_id, False, tenant)
            if opened is not None:
                return opened
            found = self.store.get_job_text(job_id, tenant)
            if found is None:
                raise ApiError(404, f"plan {job_id!r}: no such plan job")
            job = found[0]
            if job.status == CANCELLED:
                self.get(job_id, tenant)  # raises its 404
            return self.render(job)  # its plan parsed only if small

    def _render_lock(self, job_id: str) -> threading.Lock:
        with self._locks_lock:
            lock = self._render_locks.get(job_id)
            if lock is None:
                if len(self._render_locks) > 1000:
                    self._render_locks.clear()
                lock = self._render_locks[job_id] = threading.Lock()
            return lock

    def remember_finished(self, job_id: str) -> None:
        """Warm the answers with a job that just finished (dispatcher thread), so the next
        identical request and the next poll are served without the database: in memory, or
        a large plan's views spliced into files (its plan never parsed here)."""
        found = self.store.get_job_text(job_id)
        if found is None:
            return
        job, text = found
        if job.status not in FINISHED or job.status == CANCELLED:
            return  # a cancelled job is deleted: reads answer 404, never a remembered view
        large = text is not None and len(text) >= LARGE_PLAN_CHARS
        if large and text is not None:
            for cached in (False, True) if job.status in CACHEABLE else (False,):
                kept = self._keep(job, cached, render_spliced(job, text, cached=cached))
                if not isinstance(kept, bytes):
                    kept.close()
        else:
            job = replace(job, plan=json.loads(text) if text else None)
            self.render(job)
            if job.status in CACHEABLE:
                self.render(job, cached=True)
        if job.status in CACHEABLE:
            # The stored key is the request's (its tenant's): the question it answers.
            self._remember_answer(job.request_key, job)

    def rendered_finished(self, job_id: str, tenant: str | None) -> bytes | None:
        """A finished job of `tenant` from memory, or None (then ask the store; an admin's
        reads, tenant None, always do)."""
        return None if tenant is None else self.rendered.get((job_id, False, tenant))

    def close(self) -> None:
        self.files.close()
