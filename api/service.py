"""What the routes do, without HTTP: resolve graphs and budgets, answer from the store or queue
a job, cancel, draw timelines. Bad input raises ApiError/InputError with the CLI's messages."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from datetime import UTC, datetime
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.service.bounds import check_graph_bounds
from planner.service.cache import KeyIndex, RenderedCache
from planner.service.errors import ApiError
from planner.service.jobs import JobManager
from planner.service.metrics import Metrics
from planner.service.models import CACHEABLE, FINISHED, RUNNING, Job
from planner.service.schemas import JobView, Progress
from planner.service.settings import Settings
from planner.service.store import Store

# pyplot keeps global state: one timeline drawn at a time.
_PLOT_LOCK = threading.Lock()


def request_key(
    graph_hash: str,
    budget_bytes: int,
    method: str,
    options: dict[str, Any],
    resources: dict[str, Any] | None = None,
) -> str:
    body: dict[str, Any] = {
        "graph": graph_hash, "budget": budget_bytes, "method": method, "options": options
    }
    if resources is not None:  # absent from keys made before resources existed: they still match
        body["resources"] = resources
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


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
        # request key -> (job id, its time limit, proven): the newest finished answer.
        self.answered: KeyIndex[tuple[str, float, bool]] = KeyIndex(max_entries=100_000)
        self.known_graphs: KeyIndex[str] = KeyIndex(max_entries=100_000)

    # -- graphs -------------------------------------------------------------------------------
    def parse_graph(self, data: Any) -> Graph:
        """Validate a graph document within the size limits (422 naming the limit)."""
        if isinstance(data, dict):
            nodes = data.get("nodes")
            edges = data.get("edges", data.get("links"))
            s = self.settings
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
        return graph

    def put_graph(self, graph: Graph) -> tuple[str, bool]:
        graph_hash = graph.content_hash()
        created = self.store.put_graph(
            graph_hash, graph.model_dump_json(), len(graph.nodes), len(graph.edges)
        )
        return graph_hash, created

    def stored_graph(self, graph_id: str) -> Graph:
        document = self.store.get_graph_document(graph_id)
        if document is None:
            raise ApiError(
                404, f"graph_id {graph_id!r}: no such graph; upload it with POST /v1/graphs"
            )
        return Graph.model_validate_json(document)

    def resolve_graph(
        self, graph: dict[str, Any] | None, graph_id: str | None
    ) -> tuple[str, Graph | None]:
        """(graph hash, the Graph when it was sent inline)."""
        if (graph is None) == (graph_id is None):
            raise ApiError(422, "give exactly one of 'graph' (a graph.json) or 'graph_id'")
        if graph is not None:
            parsed = self.parse_graph(graph)
            graph_hash, _ = self.put_graph(parsed)
            return graph_hash, parsed
        assert graph_id is not None
        if self.known_graphs.get(graph_id) is None:
            if not self.store.graph_exists(graph_id):
                self.stored_graph(graph_id)  # raises the 404
            self.known_graphs.put(graph_id, graph_id)
        return graph_id, None

    # -- plans --------------------------------------------------------------------------------
    def resources(self, value: dict[str, Any] | str | None) -> dict[str, Any] | None:
        """The request's resources (a resources.json document or a preset name), validated and
        normalised; InputError (422) naming the field otherwise."""
        if value is None:
            return None
        from planner.core.resources import resources_from_dict

        return resources_from_dict(value, where="resources").model_dump(mode="json")

    def budget_bytes(
        self,
        budget: int | float | str | None,
        graph_hash: str,
        graph: Graph | None,
        resources: dict[str, Any] | None = None,
        name: str = "budget",
    ) -> int:
        from planner.core.budget import MAX_BUDGET_BYTES, parse_budget_spec

        if budget is None:
            memory = (resources or {}).get("device_memory_bytes")
            if memory is None:
                raise InputError(
                    f"{name}: missing; give a budget (0.8, '11GiB', bytes) or resources that "
                    "name a device (e.g. \"h100-pcie-gen5\")"
                )
            if int(memory) > MAX_BUDGET_BYTES:
                raise InputError(
                    f"resources.device_memory_bytes {memory}: over the largest budget of "
                    f"{MAX_BUDGET_BYTES} bytes (1 EiB)"
                )
            return int(memory)
        # One grammar with the CLI; it refuses budgets over 1 EiB (the store's columns are int64).
        spec = parse_budget_spec(budget, name)
        if not spec.needs_reference:
            return spec.resolve(None, name)
        from planner.solvers.baselines import store_all_peak_bytes

        reference = store_all_peak_bytes(graph or self.stored_graph(graph_hash))
        return spec.resolve(reference, name)

    def check_method(self, method: str, options: dict[str, Any] | None = None) -> None:
        """422 for an unknown method, or options it does not take (planner.engine.options)."""
        from planner.engine.options import check_options
        from planner.engine.registry import load_method

        try:
            load_method(method)
        except ImportError as e:
            raise ApiError(422, f"method {method!r} is not available on this server: {e}") from None
        check_options(method, options or {})

    def check_offload(self, graph_hash: str, graph: Graph | None, method: str,
                      resources: dict[str, Any] | None) -> None:
        """422 for an offload method on a machine without a host tier or a graph with nothing
        to offload: the CLI's exit-2 line (planner.engine.offload_checks)."""
        from planner.core.resources import resources_from_dict
        from planner.engine.offload_checks import check_offload_request, is_offload_method

        if not is_offload_method(method):
            return
        machine = resources_from_dict(resources, "resources") if resources is not None else None
        check_offload_request(graph or self.stored_graph(graph_hash), method, machine,
                              graph_where="graph", resources_where="resources")

    def time_limit(self, requested: float | None) -> float:
        cap = self.settings.max_time_limit_s
        if requested is None:
            return min(self.settings.default_time_limit_s, cap)
        from planner.core.limits import check_time_limit

        requested = check_time_limit(requested, "time_limit")  # the CLI's rule: finite, > 0
        if requested > cap:
            raise ApiError(
                422,
                f"time_limit {requested:g} s: over this server's cap of max_time_limit_s={cap:g}",
                details={"limit": "max_time_limit_s", "max": cap},
            )
        return requested

    def submit(
        self,
        graph_hash: str,
        budget_bytes: int,
        method: str,
        options: dict[str, Any],
        time_limit_s: float,
        resources: dict[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> tuple[Job, bool]:
        """(job, answered from the store at once). A finished answer serves the request when no
        more search could improve it (proven, or solved with at least this time limit), unless
        `force`; identical active requests (same key and time limit) share one job."""
        key = request_key(graph_hash, budget_bytes, method, options, resources)
        if not force:
            done = self._known_answer(key, time_limit_s)
            if done is None:
                done = self.store.find_answer(key, time_limit_s)
            if done is not None:
                self._remember_answer(key, done)
                self.metrics.cache_hits.inc()
                return done, True
        job, created = self.store.create_or_join_job(
            request_key=key,
            graph_hash=graph_hash,
            budget_bytes=budget_bytes,
            method=method,
            options=options,
            time_limit_s=time_limit_s,
            resources=resources,
        )
        if created:
            self.metrics.submissions.inc()
            self.manager.wake()
        return job, False

    def _known_answer(self, key: str, time_limit_s: float) -> Job | None:
        known = self.answered.get(key)
        if known is None:
            return None
        job_id, solved_with_s, proven = known
        if not proven and solved_with_s < time_limit_s:
            return None
        return self.store.get_job(job_id)

    def _remember_answer(self, key: str, job: Job) -> None:
        """Keep the answer that serves the most requests: a proven one, else the one solved
        with the longest time limit."""
        known = self.answered.get(key)
        if known is not None and known[0] != job.id:
            _, solved_with_s, proven = known
            if proven or (not job.proven and solved_with_s > job.time_limit_s):
                return
        self.answered.put(key, (job.id, job.time_limit_s, job.proven))

    def get(self, job_id: str) -> Job:
        job = self.store.get_job(job_id)
        if job is None:
            raise ApiError(404, f"plan {job_id!r}: no such plan job")
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
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
        return self.get(job_id)

    def timeline_png(self, job: Job) -> bytes:
        if job.plan is None or not job.plan.get("actions"):
            raise ApiError(
                409,
                f"plan {job.id} is {job.status}: no schedule to draw",
                details={"status": job.status},
            )
        from planner.core.plan import Plan
        from planner.engine.timeline_plot import plot_timeline
        from planner.sim.simulator import simulate

        graph = self.stored_graph(job.graph_hash)
        plan = Plan.model_validate(job.plan)
        sim = simulate(graph, plan.actions)
        fd, path = tempfile.mkstemp(suffix=".png")
        os.close(fd)
        try:
            with _PLOT_LOCK:
                plot_timeline(
                    sim,
                    path,
                    title=f"{plan.method}: {plan.status.value}",
                    budget_bytes=job.budget_bytes,
                )
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    # -- views --------------------------------------------------------------------------------
    def cached_answer(self, graph_id: str | None, budget: object, method: str,
                      options: dict[str, Any], resources: object = None,
                      time_limit: float | None = None, force: bool = False) -> bytes | None:
        """The rendered 200 answer of a request solved before, from memory only (no database,
        no thread): graph by id, budget in bytes. None when the slow path must decide."""
        from planner.core.budget import MAX_BUDGET_BYTES, MIN_PLAIN_BYTES

        if (force or graph_id is None or resources is not None or not isinstance(budget, int)
                or not MIN_PLAIN_BYTES <= budget <= MAX_BUDGET_BYTES):
            return None  # resources are validated (and keyed) on the slow path
        cap = self.settings.max_time_limit_s
        requested_s = min(self.settings.default_time_limit_s, cap) if time_limit is None \
            else time_limit
        if requested_s > cap:
            return None  # the slow path says why
        known = self.answered.get(request_key(graph_id, budget, method, options))
        if known is None:
            return None
        job_id, solved_with_s, proven = known
        if not proven and solved_with_s < requested_s:
            return None
        body = self.rendered.get((job_id, True))
        if body is not None:
            self.metrics.cache_hits.inc()
        return body

    def render(self, job: Job, *, cached: bool = False) -> bytes:
        key = (job.id, cached)
        if job.status in FINISHED and (body := self.rendered.get(key)) is not None:
            return body
        body = self.view(job, cached=cached).model_dump_json().encode()
        if job.status in FINISHED:
            self.rendered.put(key, body)
        return body

    def remember_finished(self, job_id: str) -> None:
        """Warm the in-memory answers with a job that just finished (dispatcher thread), so the
        next identical request and the next poll are served without the database."""
        job = self.store.get_job(job_id)
        if job is None or job.status not in FINISHED:
            return
        self.render(job)
        if job.status in CACHEABLE:
            self.render(job, cached=True)
            self._remember_answer(request_key(job.graph_hash, job.budget_bytes, job.method,
                                              job.options, job.resources), job)

    def rendered_finished(self, job_id: str) -> bytes | None:
        """A finished job's view from memory, or None (then ask the store)."""
        return self.rendered.get((job_id, False))

    @staticmethod
    def view(job: Job, *, cached: bool = False) -> JobView:
        url = f"/v1/plans/{job.id}"
        progress = None
        if job.status == RUNNING:
            progress = Progress(
                best_objective=job.progress_objective, best_bound=job.progress_bound
            )
        return JobView(
            id=job.id,
            status=job.status,
            url=url,
            graph_id=job.graph_hash,
            budget_bytes=job.budget_bytes,
            method=job.method,
            options=job.options,
            resources=job.resources,
            time_limit_s=job.time_limit_s,
            attempts=job.attempts,
            cached=cached,
            created_at=iso(job.created_at) or "",
            started_at=iso(job.started_at),
            finished_at=iso(job.finished_at),
            solve_seconds=job.solve_seconds,
            worker_pid=job.worker_pid if job.status == RUNNING else None,
            instance=job.owner_instance if job.status == RUNNING else None,
            progress=progress,
            plan=job.plan,
            report=job.report,
            error=job.error,
            timeline_url=f"{url}/timeline.png" if job.plan and job.plan.get("actions") else None,
        )
