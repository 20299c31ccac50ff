"""What runs inside a solver process: one job, start to finish.

The process is forked from a multiprocessing forkserver (clean, single-threaded, with planner
preloaded), gets the graph as JSON text (never a pickle from a request), and reports over a pipe:
("progress", objective, bound) now and then, then ("result", plan_json, report) or
("error", message). A lifeline pipe whose other end only the server holds ends the process when
the server dies, so a kill -9 of the server leaves no solver running on.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

PROGRESS_INTERVAL_S = 0.5
MIN_SOLVE_S = 0.1  # what a method gets when loading the graph took the whole limit


def _watch_lifeline(lifeline: Connection) -> None:
    try:
        lifeline.recv()  # the server never sends: this returns only by EOF
    except (EOFError, OSError):
        pass
    os._exit(70)


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
    send_lock = threading.Lock()
    solved = threading.Event()  # set, under send_lock, as the answer goes out
    try:
        from planner.core.errors import InputError
        from planner.core.graph import Graph, paused_gc
        from planner.engine.registry import register_method
        from planner.engine.solve import solve

        for name, target in extra_methods.items():
            register_method(name, target)
        from planner.core.resources import Resources

        with paused_gc():  # validated when it was stored; this is the parse
            graph = Graph.model_validate_json(graph_json)
        # This process lives for one solve: the graph's objects stay until it ends, so later
        # collections need not walk them again and again (a large graph has millions).
        gc.freeze()
        resources = spec.get("resources")
        last_sent = 0.0

        pending: list[tuple[float | None, float | None]] = []  # the latest unsent report

        def send_progress(report: tuple[float | None, float | None]) -> None:
            nonlocal last_sent
            last_sent = time.monotonic()
            with send_lock:
                if not solved.is_set():  # nothing after the answer
                    results.send(("progress", *report))

        def progress(objective: float | None, bound: float | None) -> None:
            # At most one report per interval; a report that comes too soon is kept and sent by
            # the flusher, so the last improvement before a long quiet spell is not lost.
            with send_lock:
                pending[:] = [(objective, bound)]
            if time.monotonic() - last_sent >= PROGRESS_INTERVAL_S:
                with send_lock:
                    report = pending.pop() if pending else None
                if report is not None:
                    send_progress(report)

        def flush_progress() -> None:
            while not solved.wait(PROGRESS_INTERVAL_S):
                with send_lock:
                    report = pending.pop() if pending else None
                if report is not None:
                    send_progress(report)

        threading.Thread(target=flush_progress, daemon=True).start()

        # The job's limit counts from its start (the dispatcher's clock, CLOCK_MONOTONIC like
        # ours): starting this process and reading the graph come out of it.
        began = float(spec.get("started_monotonic", entered))
        time_limit_s = max(MIN_SOLVE_S, float(spec["time_limit_s"]) - (time.monotonic() - began))
        try:
            plan = solve(
                graph,
                int(spec["budget_bytes"]),
                str(spec["method"]),
                time_limit_s=time_limit_s,
                threads=int(spec.get("threads", 1)),
                seed=int(spec.get("seed", 0)),
                options=dict(spec.get("options") or {}),
                progress=progress,
                resources=None if resources is None else Resources.model_validate(resources),
            )
        except InputError as e:
            with send_lock:
                solved.set()
                results.send(("error", str(e)))
            return
        report = plan_report(plan, graph)
        with send_lock:
            solved.set()
            results.send(("result", plan.model_dump_json(), report))
        from planner.engine.deadline import abandoned_methods

        if abandoned_methods():  # the answer is out (send returns once it is written): a method
            os._exit(0)  # left running must not hold the process in the interpreter's exit
    except Exception as e:  # a solver bug: report it as the job's failure reason
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
        with send_lock:
            solved.set()
            results.send(("error", f"solver error: {type(e).__name__}: {e}{where}"))


def plan_report(plan: Any, graph: Any) -> dict[str, Any]:
    """The engine's plan summary (same fields as `planner-cli solve --json`)."""
    from planner.engine.reports import plan_summary

    return plan_summary(plan, graph)
