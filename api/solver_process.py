"""One job's solver process, as the job dispatcher (planner.api.jobs) sees it: start it in
the forkserver (planner.api.worker.run_job), read what it sends back, kill it, and say what
its outcome means for the job (status, plan, report, error)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from planner.api.models import DONE, FAILED, INFEASIBLE, Job
from planner.api.settings import Settings
from planner.api.worker import run_job

# plan.json status -> job status; a plan without a schedule within budget is not "done".
PLAN_TO_JOB_STATUS = {"optimal": DONE, "feasible": DONE, "infeasible": INFEASIBLE}


@dataclass
class RunningJob:
    """A job whose solver process runs: its pipes, its times (time.monotonic()), what it sent."""

    job: Job
    process: BaseProcess
    results: Connection
    lifeline: Connection
    started: float  # time.monotonic()
    deadline: float  # killed after this; restarted once the process has read its graph
    kill_after_s: float  # the job's time limit plus the kill grace
    stop_sent: bool = False  # asked to answer now with its best plan (fair time)
    reaped: threading.Event = field(default_factory=threading.Event)
    last_progress_write: float = 0.0
    pending_progress: tuple[float | None, float | None] | None = None
    outcome: tuple[Any, ...] | None = field(default=None)


def start_solver(
    ctx: ForkServerContext, job: Job, document: str, settings: Settings
) -> RunningJob:
    """Start the solver process of `job` on its graph `document`. Its time limit is the
    solver's own: it counts from when the process has read the graph ("loaded"), and the
    process is killed `settings.kill_grace_s` after that limit (before "loaded": counted from
    here, so a process that never loads is killed too)."""
    results_r, results_w = ctx.Pipe(duplex=False)
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    spec = {
        "budget_bytes": job.budget_bytes,
        "method": job.method,
        "time_limit_s": job.time_limit_s,
        "threads": settings.solver_threads,
        "nice": settings.solver_nice,
        "max_plan_bytes": settings.max_plan_bytes,
        "options": job.options,
        "resources": job.resources,
        "started_monotonic": time.monotonic(),  # its start and load are measured from here
    }
    process = ctx.Process(
        target=run_job,
        args=(spec, document, results_w, lifeline_r, dict(settings.extra_methods)),
        name=f"planner-job-{job.id}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        for conn in (results_r, results_w, lifeline_r, lifeline_w):
            conn.close()
        raise
    results_w.close()  # the child holds the only writer: EOF once it exits
    lifeline_r.close()
    now = time.monotonic()
    return RunningJob(
        job=job,
        process=process,
        results=results_r,
        lifeline=lifeline_w,
        started=now,
        deadline=now + job.time_limit_s + settings.kill_grace_s,
        kill_after_s=job.time_limit_s + settings.kill_grace_s,
    )


def drain(r: RunningJob) -> None:
    """Read what the process sent so far: its latest progress, or its outcome."""
    try:
        while r.outcome is None and r.results.poll():
            message = r.results.recv()
            if message[0] == "progress":
                r.pending_progress = (message[1], message[2])
            elif message[0] == "loaded":  # the solver's own time starts now
                r.deadline = time.monotonic() + r.kill_after_s
            else:
                r.outcome = message
    except (EOFError, OSError):
        pass


def ask_to_stop(r: RunningJob) -> bool:
    """Ask the solver to answer now with its best plan so far (SIGUSR1; planner.api.worker);
    whether the signal went out."""
    pid = r.process.pid
    if pid is None or r.stop_sent:
        return False
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return False
    r.stop_sent = True
    return True


def kill(r: RunningJob) -> None:
    if r.process.is_alive():
        r.process.kill()  # SIGKILL: solver libraries need not cooperate
    r.process.join(timeout=5)
    for conn in (r.results, r.lifeline):
        try:
            conn.close()
        except OSError:
            pass


def kill_now(r: RunningJob) -> None:
    """SIGKILL the process and go on: the dispatcher reaps it (`kill` waits for it)."""
    pid = r.process.pid
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)  # solver libraries need not cooperate
        except ProcessLookupError:
            pass


def job_outcome(r: RunningJob) -> tuple[str, str | None, dict[str, Any] | None, str | None]:
    """(status, plan, report, error) of the job whose process ended and was drained."""
    outcome = r.outcome
    if outcome is None:
        return FAILED, None, None, (f"the solver process exited with code {r.process.exitcode} "
                                    "without a result")
    if outcome[0] == "error":
        return FAILED, None, None, str(outcome[1])
    plan_json, report = outcome[1], outcome[2]
    plan_status = str(report.get("status"))
    status = PLAN_TO_JOB_STATUS.get(plan_status, FAILED)
    error = None
    if status == FAILED:
        notes = "; ".join(report.get("notes") or [])
        error = f"no plan: solver status {plan_status}" + (f" ({notes})" if notes else "")
    return status, plan_json, report, error


def proven_answer(status: str, report: dict[str, Any]) -> bool:
    """True when more search cannot change the answer: an optimal plan, or infeasibility shown
    by the engine's proof (some node alone needs more than the budget). Other infeasible
    answers hold only for the methods and the time tried."""
    if status == DONE:
        return report.get("status") == "optimal"
    return status == INFEASIBLE and report.get("backend") == "proof"
