"""The job manager: runs queued jobs in solver processes, at most `workers` at once.

One dispatcher thread in the server process owns the child processes: it claims queued jobs
from the store, fairly between tenants (Store.claim_next), starts a process per job
(planner.api.solver_process; forkserver: a clean fork, planner preloaded), relays progress
and results into the store, enforces each job's time limit and kills the process of a
cancelled job. The event loop never waits on any of this.

Each server is an instance with a lease in the store, renewed by this thread's heartbeat; the
jobs it runs carry its id. Jobs of an instance whose lease expired (it died, or lost the
database for longer than the lease) are re-queued or failed by whichever instance notices first
(Store.reap), at start-up and then every heartbeat; a live instance's jobs are never touched.
At a clean shutdown, running jobs are re-queued without counting the interrupted attempt.

Storage faults (disk full, read-only, unreachable) go to `health` (one log line per cause and
minute); a result that cannot be written is kept and written once the store takes writes again,
and while the store is unhealthy every loop tries the heartbeat, whose success clears it. A job
whose solver process cannot start is re-queued once, then failed with the reason.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from planner.api.errors import StorageHealth
from planner.api.held_writes import HeldWrites
from planner.api.metrics import Metrics
from planner.api.models import CANCELLED, FAILED, RUNNING, Job
from planner.api.settings import Settings
from planner.api.solver_process import (
    RunningJob,
    ask_to_stop,
    drain,
    job_outcome,
    kill,
    kill_now,
    proven_answer,
    start_solver,
)
from planner.api.store import Store, new_id

log = logging.getLogger("planner.api.jobs")

PRELOAD = ["planner.engine.solve", "planner.engine.reports", "planner.api.worker"]
PROGRESS_WRITE_INTERVAL_S = 1.0
# How often running jobs are checked against the store (a cancel through another instance).
STATUS_CHECK_INTERVAL_S = 1.0
IDLE_POLL_S = 0.5
# Fair time: a job of a tenant holding several workers is asked to answer with its best plan so
# far while another tenant waits with none, once it has run this long (its search has a plan)...
SHARE_AFTER_S = 2.0
# ... the store is asked whether someone waits at most this often while every worker is busy.
SHARE_CHECK_INTERVAL_S = 1.0
# A solver process that cannot start (fork refused: memory, process limits) is a fault of this
# machine: claims pause this long, doubling with each failure in a row up to the maximum, and
# /readyz says so meanwhile (before: both attempts of a job spent within a second, "ready").
SPAWN_BACKOFF_S = 3.0
SPAWN_BACKOFF_MAX_S = 60.0


def _shutdown_fault(exc: Exception, what: str, then: str) -> None:
    """One line for a store that refuses a write at shutdown (read-only, full, gone): the
    cause, the driver's words, what happens instead. Anything else is a bug: its traceback."""
    from planner.api.errors import STORAGE_CAUSES, classify_storage_error

    cause = classify_storage_error(exc)
    if cause is None:
        log.exception("%s", what)
        return
    orig = getattr(exc, "orig", None) or exc
    detail = " ".join(str(orig).split())[:200]
    log.error("%s: %s (%s); %s", what, STORAGE_CAUSES[cause], detail, then)


class JobManager:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        metrics: Metrics,
        on_finished: Callable[[str], None] | None = None,
    ) -> None:
        self.on_finished = on_finished  # called with a job id once its result is stored
        self.health = StorageHealth()
        self._held = HeldWrites(self.health)
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._running: dict[str, RunningJob] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Self-pipe: a submission wakes the dispatcher out of its wait() at once.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already means "wake up"
        self._thread: threading.Thread | None = None
        self._last_status_check = 0.0
        self._next_share_check = 0.0  # time.monotonic(): fair time's next look at the store
        self._spawn_failures = 0  # solver processes that could not start, in a row
        self._spawn_retry_at = 0.0  # time.monotonic(): no claims before this
        self._spawn_error = ""  # the last such failure, for /readyz
        self.instance_id = new_id()
        self.address = f"{settings.host}:{settings.port}"
        self._last_heartbeat = 0.0

    @property
    def heartbeat_interval_s(self) -> float:
        return self.settings.instance_lease_s / 3

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> list[tuple[str, str]]:
        self._register()
        recovered = self._reap()
        # Start the forkserver now (it imports planner once), not in the first job's time.
        from multiprocessing import forkserver

        forkserver.ensure_running()
        self._thread = threading.Thread(target=self._loop, name="planner-jobs", daemon=True)
        self._thread.start()
        return recovered

    def stop(self) -> None:
        """Stop dispatching; kill running solves and put their jobs back in the queue (the
        interrupted attempt not counted); give the lease up."""
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            running = list(self._running.values())
            self._running.clear()
        for r in running:
            kill(r)
            r.reaped.set()
            try:
                self.store.requeue(r.job.id, "the server shut down during this attempt; "
                                   "re-queued", self.instance_id, count_attempt=False)
            except Exception as e:  # the database is gone: the lease expires and others take it
                _shutdown_fault(e, f"could not re-queue job {r.job.id} at shutdown",
                                "it is re-queued once this instance's lease expires")
        try:
            self.store.deregister_instance(self.instance_id)
        except Exception as e:
            _shutdown_fault(e, f"could not give up the lease of instance {self.instance_id}",
                            "it expires by itself")
        self._thread = None  # wake() is a no-op from here on: the pipe is closed
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _register(self) -> None:
        self.store.register_instance(
            self.instance_id, self.settings.instance_lease_s,
            hostname=socket.gethostname(), pid=os.getpid(), address=self.address,
        )
        self._last_heartbeat = time.monotonic()
        log.info("instance %s holds a %g s lease", self.instance_id,
                 self.settings.instance_lease_s)

    def _reap(self) -> list[tuple[str, str]]:
        recovered = self.store.reap(self.settings.recover_running, self.settings.max_attempts,
                                    self.instance_id)
        for job_id, status in recovered:
            log.warning("job %s: its instance is gone (lease expired): now %s", job_id, status)
        if recovered:
            self.wake()
        return recovered

    def _keep_lease(self) -> None:
        """Heartbeat, then take over the jobs of instances whose leases expired. A lease found
        lost (this instance was presumed dead) means its jobs are others' now: their solver
        processes are killed and the instance registers again under a new id."""
        now = time.monotonic()
        unhealthy = self.health.problem() is not None
        if now - self._last_heartbeat < self.heartbeat_interval_s and not unhealthy:
            return
        if self.heartbeat_now():
            self._last_heartbeat = now
        else:
            log.error("instance %s lost its lease (no heartbeat for %g s): its jobs were taken "
                      "over; stopping their solvers and registering again", self.instance_id,
                      self.settings.instance_lease_s)
            with self._lock:
                lost = list(self._running.values())
                self._running.clear()
            for r in lost:
                kill(r)
                r.reaped.set()
            self.instance_id = new_id()
            self._register()
        self._reap()

    def heartbeat_now(self) -> bool:
        """Renew the lease now: a write, so its success means the store is healthy again
        (/readyz calls it while not ready). False: the lease was lost."""
        kept = self.store.heartbeat(self.instance_id, self.settings.instance_lease_s)
        self.health.recovered()
        return kept

    def wake(self) -> None:
        if self._stop.is_set() and self._thread is None:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    @property
    def running_count(self) -> int:
        return len(self._running)

    def cancel(self, job_id: str, wait_s: float = 10.0) -> bool:
        """SIGKILL the job's solver process if it runs here and wait until the dispatcher has
        reaped it; call after Store.cancel so the dispatcher does not record a failure."""
        with self._lock:
            r = self._running.get(job_id)
        if r is None:
            return False
        kill_now(r)
        self.metrics.solves.labels(status=CANCELLED).inc()
        self.wake()
        return r.reaped.wait(wait_s)

    # -- the dispatcher thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._keep_lease()
                self._held.save_held()
                self._dispatch()
                self._share_workers()
                self._poll()
            except Exception as e:  # keep dispatching; the store may be briefly unavailable
                if self.health.failed(e) is None:  # not the storage: a bug, with its traceback
                    log.exception("job dispatcher error")
                time.sleep(IDLE_POLL_S)

    @property
    def spawn_problem(self) -> str | None:
        """Why solver processes cannot start, while claims are paused for it; None otherwise."""
        if self._spawn_failures and time.monotonic() < self._spawn_retry_at:
            return self._spawn_error
        return None

    def _dispatch(self) -> None:
        free = self.settings.workers - len(self._running)
        if free <= 0 or time.monotonic() < self._spawn_retry_at:
            return
        # One claim at a time, each seeing the last: the store picks the oldest queued job of
        # the tenant with the fewest running jobs (fair shares of the pool, across instances).
        for _ in range(free):
            job = self.store.claim_next(self.instance_id)
            if job is None:
                return
            self._start(job)
            if time.monotonic() < self._spawn_retry_at:  # it could not start: pause claims
                return

    def _share_workers(self) -> None:
        """Fair time, not only fair order: while a tenant has queued jobs and no worker, and
        every worker here is busy, the longest-running job of the tenant holding the most
        workers (two or more) is asked to answer now with its best plan so far (solvers are
        anytime: it ends as done, with a note), so the waiting tenant's job starts within
        seconds instead of after that job's whole limit. Stopping beats reserving a worker: a
        reservation idles it whenever one tenant is alone. Methods without an anytime answer
        (pipeline partitions) finish at their limit."""
        now = time.monotonic()
        if (self.settings.workers > len(self._running) or now < self._next_share_check):
            return
        self._next_share_check = now + SHARE_CHECK_INTERVAL_S
        with self._lock:
            running = list(self._running.values())
        held: dict[str, int] = {}  # tenant -> workers here
        for r in running:
            held[r.job.tenant] = held.get(r.job.tenant, 0) + 1
        ready = [r for r in running if not r.stop_sent and now - r.started >= SHARE_AFTER_S
                 and held[r.job.tenant] >= 2]
        if not ready or not self.store.tenant_waiting_without_worker():
            return
        most = max(held[r.job.tenant] for r in ready)
        victim = max((r for r in ready if held[r.job.tenant] == most),
                     key=lambda r: now - r.started)
        if ask_to_stop(victim):
            log.info("job %s (tenant %s, %d workers) asked to answer now: another tenant waits",
                     victim.job.id, victim.job.tenant, most)

    def _start(self, job: Job) -> None:
        """Start a claimed job's solver process; a job that cannot start never stays running:
        it is re-queued once (a passing fork failure), then failed with the reason; claims
        pause meanwhile (`_spawn_failed`)."""
        try:
            self._spawn(job)
        except Exception as e:
            if self.health.failed(e) is not None:
                reason = f"the store failed before its solver started: {self.health.public}"
            else:
                reason = f"its solver process could not start: {type(e).__name__}: {e}"
                self._spawn_failed(f"{type(e).__name__}: {e}")
                log.error("job %s: %s", job.id, reason)
            self._not_started(job, reason)
        else:
            self._spawn_failures = 0

    def _spawn_failed(self, error: str) -> None:
        """Pause claims, longer with each failure in a row (see SPAWN_BACKOFF_S)."""
        self._spawn_failures += 1
        pause_s = min(SPAWN_BACKOFF_MAX_S, SPAWN_BACKOFF_S * 2 ** (self._spawn_failures - 1))
        self._spawn_retry_at = time.monotonic() + pause_s
        self._spawn_error = error

    def _not_started(self, job: Job, reason: str) -> None:
        instance_id = self.instance_id
        if job.attempts < self.settings.max_attempts:
            self._held.write_or_keep(lambda: self.store.requeue(
                job.id, reason + "; re-queued", instance_id))
            self.wake()
        else:
            self._finish(job, FAILED, error=reason + f" (attempt {job.attempts})")

    def _spawn(self, job: Job) -> None:
        document = self.store.get_graph_document(job.graph_hash)
        if document is None:
            self._finish(job, FAILED, error=f"graph {job.graph_hash} is missing from the store")
            return
        running = start_solver(self._ctx, job, document, self.settings)
        process = running.process
        with self._lock:
            self._running[job.id] = running
        try:
            self.store.set_worker(job.id, process.pid)
        except Exception as e:  # the solve runs on; its pid is only shown while it runs
            if self.health.failed(e) is None:
                raise
        log.info("job %s started in process %s", job.id, process.pid)

    def _kill_cancelled_elsewhere(self) -> None:
        """A job cancelled in the store (say, through another instance), or no longer this
        instance's, loses its process."""
        now = time.monotonic()
        if now - self._last_status_check < STATUS_CHECK_INTERVAL_S:
            return
        self._last_status_check = now
        with self._lock:
            ids = list(self._running)
        for job_id, (status, owner) in self.store.owners(ids).items():
            if status != RUNNING or owner != self.instance_id:
                with self._lock:
                    r = self._running.get(job_id)
                if r is not None:
                    kill_now(r)

    def _poll(self) -> None:
        self._kill_cancelled_elsewhere()
        with self._lock:
            running = list(self._running.values())
        waitables: list[Any] = [self._wake_r]
        for r in running:
            waitables += [r.results, r.process.sentinel]
        ready = wait(waitables, timeout=IDLE_POLL_S)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        now = time.monotonic()
        for r in running:
            drain(r)
            if r.outcome is not None or not r.process.is_alive():
                self._complete(r)
            elif now > r.deadline:
                self._forget(r)
                kill(r)
                r.reaped.set()
                self._finish(
                    r.job,
                    FAILED,
                    error=f"killed: still running {self.settings.kill_grace_s:g} s after its "
                    f"time limit of {r.job.time_limit_s:g} s",
                    seconds=now - r.started,
                )
            elif r.pending_progress and now - r.last_progress_write >= PROGRESS_WRITE_INTERVAL_S:
                self.store.set_progress(r.job.id, *r.pending_progress)
                r.last_progress_write, r.pending_progress = now, None

    def _complete(self, r: RunningJob) -> None:
        r.process.join(timeout=5)
        drain(r)
        self._forget(r)
        seconds = time.monotonic() - r.started
        status, plan, report, error = job_outcome(r)
        self._finish(r.job, status, plan=plan, report=report, error=error, seconds=seconds)
        r.results.close()
        r.lifeline.close()
        r.reaped.set()

    def _finish(
        self,
        job: Job,
        status: str,
        *,
        plan: str | None = None,
        report: dict[str, Any] | None = None,
        error: str | None = None,
        seconds: float | None = None,
    ) -> None:
        proven = report is not None and proven_answer(status, report)
        instance_id = self.instance_id

        def write() -> None:
            if not self.store.finish(
                job.id, status, plan=plan, report=report, error=error, solve_seconds=seconds,
                instance_id=instance_id, proven=proven,
            ):
                return
            self.metrics.solves.labels(status=status).inc()
            if seconds is not None:
                self.metrics.solve_seconds.observe(seconds)
            log.info("job %s %s", job.id, status)
            if self.on_finished is not None:
                try:
                    self.on_finished(job.id)
                except Exception:  # a cache warm-up must never stop the dispatcher
                    log.exception("on_finished hook failed for job %s", job.id)

        self._held.write_or_keep(write)

    def _forget(self, r: RunningJob) -> None:
        with self._lock:
            self._running.pop(r.job.id, None)
