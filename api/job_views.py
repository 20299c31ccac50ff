"""What a client sees of a job: its JSON view (JobView, times as ISO 8601 strings) and the
picture of its plan's memory over the schedule (timeline.png)."""

from __future__ import annotations

import os
import tempfile
import threading
from datetime import UTC, datetime

from planner.api.models import RUNNING, Job
from planner.api.schemas import JobView, Progress
from planner.core.graph import Graph

# pyplot keeps global state: one timeline drawn at a time.
_PLOT_LOCK = threading.Lock()


def iso(t: float | None) -> str | None:
    """A Unix time as an ISO 8601 string (UTC); None stays None."""
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def job_view(job: Job, *, cached: bool = False) -> JobView:
    """The job as the API shows it (`cached`: the answer came from the store at once)."""
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


def draw_timeline(graph: Graph, job: Job) -> bytes:
    """The PNG of `job`'s plan (one with actions) simulated on `graph`."""
    from planner.core.plan import Plan
    from planner.engine.timeline_plot import plot_timeline
    from planner.sim.simulator import simulate

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
