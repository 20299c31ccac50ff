"""What runs inside a solver process: one job, start to finish.

The process is forked from a multiprocessing forkserver (clean, single-threaded, with planner
preloaded), gets the graph as JSON text (never a pickle from a request), and reports over a pipe:
("loaded", seconds since the dispatcher started it) once the graph is read, ("progress",
objective, bound) now and then, then ("result", plan_json, report) or ("error", message). The
solver gets the job's whole time limit; the process start and graph load are reported beside
it. SIGUSR1 ends the solve early with its best plan so far (the dispatcher's fair time). A
lifeline pipe whose other end only the server holds ends the process when the server dies, so
a kill -9 of the server leaves no solver running on.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

PROGRESS_INTERVAL_S = 0.5


def _watch_lifeline(lifeline: Connection) -> None:
    try:
        lifeline.recv()  # the server never sends: this returns only by EOF
    except (EOFError, OSError):
        pass
    os._exit(70)


class _Reporter:
    """The pipe back to the server: progress at most once per interval (a report that comes too
    soon is kept and sent by a flusher thread, so the last improvement before a long quiet spell
    is not lost), then one answer, after which nothing more is sent."""

    def __init__(self, results: Connection) -> None:
        self.results = results
        self.lock = threading.Lock()
        self.solved = threading.Event()  # set, under the lock, as the answer goes out
        self.pending: list[tuple[float | None, float | None]] = []  # the latest unsent report
        self.last_sent = 0.0

    def start_flusher(self) -> None:
        threading.Thread(target=self._flush, daemon=True).start()

    def progress(self, objective: float | None, bound: float | None) -> None:
        with self.lock:
            self.pending[:] = [(objective, bound)]
        if time.monotonic() - self.last_sent >= PROGRESS_INTERVAL_S:
            self._send_pending()

    def send(self, message: tuple[Any, ...]) -> None:
        """A message before the answer (e.g. "loaded")."""
        with self.lock:
            if not self.solved.is_set():
                self.results.send(message)

    def answer(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.solved.set()
            self.results.send(message)

    def _flush(self) -> None:
        while not self.solved.wait(PROGRESS_INTERVAL_S):
            self._send_pending()

    def _send_pending(self) -> None:
        with self.lock:
            report = self.pending.pop() if self.pending else None
        if report is None:
            return
        self.last_sent = time.monotonic()
        with self.lock:
            if not self.solved.is_set():  # nothing after the answer
                self.results.send(("progress", *report))


def run_job(
    spec: dict[str, Any],
    graph_json: str,
    results: Connection,
    lifeline: Connection,
    extra_methods: dict[str, str],
) -> None:
    entered = time.monotonic()
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    nice = int(spec.get("nice", 0))
    if nice > 0:
        try:  # CPU-bound solves yield to the API process, which must stay responsive
            os.nice(nice)
        except OSError:
            pass
    reporter = _Reporter(results)
    try:
        from planner.core.errors import InputError
        from planner.core.graph import Graph, paused_gc
        from planner.engine.registry import register_method
        from planner.engine.request import stored_request

        for name, target in extra_methods.items():
            register_method(name, target)
        with paused_gc():  # validated when it was stored; this is the parse
            graph = Graph.model_validate_json(graph_json)
        # This process lives for one solve: the graph's objects stay until it ends, so later
        # collections need not walk them again and again (a large graph has millions).
        gc.freeze()
        request = stored_request(graph, spec)  # resolved at submission: nothing is parsed again
        # The job's limit is the solver's own time: starting this process and reading the
        # graph (the dispatcher's clock, CLOCK_MONOTONIC like ours) are counted beside it and
        # shown, and the dispatcher's kill deadline restarts from here ("loaded").
        began = float(spec.get("started_monotonic", entered))
        loaded = time.monotonic()
        reporter.send(("loaded", loaded - began))
        reporter.start_flusher()
        stop = threading.Event()  # set by SIGUSR1: the dispatcher shares the workers
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: stop.set())
        try:
            plan = request.solve(progress=reporter.progress, stop=stop)
        except InputError as e:
            reporter.answer(("error", str(e)))
            return
        report = plan_report(plan, graph)
        report["startup_seconds"] = {"process_start": round(entered - began, 3),
                                     "graph_load": round(loaded - entered, 3)}
        plan_json = plan.model_dump_json()
        cap = spec.get("max_plan_bytes")
        if cap is not None and len(plan_json) > int(cap):  # every method's plan is bounded
            reporter.answer(("error", f"plan: {len(plan_json)} bytes ({len(plan.actions)} "
                             f"actions), over this server's limit of max_plan_bytes={cap}; a "
                             "larger budget or another method makes a smaller plan"))
            return
        reporter.answer(("result", plan_json, report))
        from planner.engine.deadline import abandoned_methods

        if abandoned_methods():  # the answer is out (send returns once it is written): a method
            os._exit(0)  # left running must not hold the process in the interpreter's exit
    except Exception as e:  # a solver bug: report it as the job's failure reason
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
        reporter.answer(("error", f"solver error: {type(e).__name__}: {e}{where}"))


def plan_report(plan: Any, graph: Any) -> dict[str, Any]:
    """The engine's plan summary (same fields as `planner-cli solve --json`)."""
    from planner.engine.reports import plan_summary

    return plan_summary(plan, graph)
