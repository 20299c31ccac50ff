"""How long commands show that they are working: `solve` and `demo` (the best plan's overhead
and the proven bound as they improve), `min-budget`, `sweep`, `submit --wait`, `trace`.

On a terminal (stderr) a live status line with the elapsed time against the time limit (rich).
Otherwise (a pipe, a log) plain lines on stderr, none in the first PLANNER_PROGRESS_EVERY_S
seconds (default 5): a command done by then prints nothing there (its error, if any, stays the
one line on stderr). After that, one line per change (at most one a second) and one every
PLANNER_PROGRESS_EVERY_S seconds while nothing changes, so a log shows that a long command is
alive; the last state is said at the end when any line was printed. Everything goes to
stderr: stdout (a table, `--json`) stays machine-readable."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from planner.cli.output import progress_console
from planner.engine.progress import DEFAULT_EVERY_S, progress_every_s
from planner.engine.progress import EVERY_ENV as EVERY_ENV  # the setting's name, for callers

PLAIN_INTERVAL_S = 1.0  # at most one line a second for changes
HEARTBEAT_S = DEFAULT_EVERY_S  # a line at least this often while nothing changes
LIVE_REFRESH_S = 0.25  # the terminal's elapsed-time tick


def heartbeat_s() -> float:
    """Seconds between plain progress lines while nothing changes (PLANNER_PROGRESS_EVERY_S)."""
    return progress_every_s()


def describe(objective: float | None, bound: float | None, base_cost: float) -> str:
    """'best +0.136 % · bound +0.120 %' (overheads over running every node once)."""

    def pct(value: float | None) -> str:
        if value is None or base_cost <= 0:
            return "-"
        return f"{100 * (value - base_cost) / base_cost:+.3f} %"

    return f"best {pct(objective)} · bound {pct(bound)}"


def elapsed_text(elapsed_s: float, limit_s: float | None) -> str:
    """'12.0 s of 30 s' (or '12.0 s' without a limit)."""
    return f"{elapsed_s:.1f} s" + ("" if limit_s is None else f" of {limit_s:g} s")


class StatusLine:
    """One command's status: `update(detail)` from any thread; shown by `work_status`."""

    def __init__(self, label: str, limit_s: float | None, detail: str,
                 emit: Callable[[str], None] | None, every_s: float) -> None:
        self.label, self.limit_s, self.detail = label, limit_s, detail
        self.started = time.monotonic()
        self._emit, self._every_s = emit, every_s
        self._lock = threading.Lock()
        self._printed_at = -math.inf  # no line yet
        self._printed_detail: str | None = None

    def text(self) -> str:
        elapsed = time.monotonic() - self.started
        return f"{self.label}: {elapsed_text(elapsed, self.limit_s)} · {self.detail}"

    def update(self, detail: str, *, announce: bool = True, phase: bool = False) -> None:
        """New detail; plain output prints it now when it changed (at most once a second; a new
        `phase` of the work at once, so that a log shows each phase a long command went
        through)."""
        with self._lock:
            self.detail = detail
        if announce:
            interval = 0.0 if phase else PLAIN_INTERVAL_S
            self._print(lambda now: self._printed_detail != self.detail
                        and now - self._printed_at >= interval
                        and now - self.started >= self._every_s)

    def heartbeat(self) -> None:
        self._print(lambda now: now - max(self._printed_at, self.started) >= self._every_s)

    def last_word(self) -> None:
        """The final state where lines were printed and it was not the last: a log ends
        with it."""
        self._print(lambda now: self._printed_at > -math.inf
                    and self._printed_detail != self.detail)

    def _print(self, due: Callable[[float], bool]) -> None:
        if self._emit is None:
            return
        with self._lock:
            now = time.monotonic()
            if not due(now):
                return
            self._printed_at, self._printed_detail = now, self.detail
            line = self.text()
        self._emit(line)


def _plain_line(text: str) -> None:
    progress_console.file.write(text + "\n")
    progress_console.file.flush()


@contextmanager
def work_status(label: str, *, quiet: bool = False, limit_s: float | None = None,
                detail: str = "working", every_s: float | None = None
                ) -> Iterator[StatusLine]:
    """A StatusLine and its display for the duration of the block (nothing when quiet);
    `every_s`: the plain lines' heartbeat (default: heartbeat_s())."""
    live = not quiet and progress_console.is_terminal
    emit = None if quiet or live else _plain_line
    every_s = heartbeat_s() if every_s is None else every_s
    status = StatusLine(label, limit_s, detail, emit, every_s)
    stop = threading.Event()
    if live:
        with progress_console.status(status.text(), spinner="dots") as spinner:
            live_ticker = _start_ticker(stop, LIVE_REFRESH_S,
                                        lambda: spinner.update(status.text()))
            try:
                yield status
            finally:
                stop.set()
                live_ticker.join()
        return
    ticker = _start_ticker(stop, min(every_s, 1.0), status.heartbeat) if emit else None
    try:
        yield status
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
    status.last_word()  # not after an error: the error's own line is the last word


def _start_ticker(stop: threading.Event, period_s: float, tick: Callable[[], Any]
                  ) -> threading.Thread:
    def run() -> None:
        while not stop.wait(period_s):
            tick()

    thread = threading.Thread(target=run, name="planner-cli-progress", daemon=True)
    thread.start()
    return thread


@contextmanager
def solve_progress(
    base_cost: float, *, quiet: bool, label: str = "solving", time_limit_s: float | None = None
) -> Iterator[Callable[[float | None, float | None], None] | None]:
    """A progress callback for `engine.solve` (None when quiet), and its display: the elapsed
    time against the time limit, the best plan's overhead and the bound."""
    if quiet:
        yield None
        return
    with work_status(label, limit_s=time_limit_s, detail="no plan yet") as status:

        def report(objective: float | None, bound: float | None) -> None:
            status.update(describe(objective, bound, base_cost))

        yield report
