"""How `planner-cli solve` and `demo` show a solve as it runs: the best plan's overhead and the
proven bound, as they improve. On a terminal a live status line (rich); otherwise one plain
line per change on stderr, at most one a second, so `--json` on stdout stays clean."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from planner.cli.output import console

PLAIN_INTERVAL_S = 1.0


def describe(objective: float | None, bound: float | None, base_cost: float) -> str:
    """'best +0.136 % · bound +0.120 %' (overheads over running every node once)."""

    def pct(value: float | None) -> str:
        if value is None or base_cost <= 0:
            return "-"
        return f"{100 * (value - base_cost) / base_cost:+.3f} %"

    return f"best {pct(objective)} · bound {pct(bound)}"


@contextmanager
def solve_progress(
    base_cost: float, *, quiet: bool, label: str = "solving"
) -> Iterator[Callable[[float | None, float | None], None] | None]:
    """A progress callback for `engine.solve` (None when quiet), and its display."""
    if quiet:
        yield None
        return
    if console.is_terminal:
        with console.status(label, spinner="dots") as status:

            def live(objective: float | None, bound: float | None) -> None:
                status.update(f"{label}: {describe(objective, bound, base_cost)}")

            yield live
        return
    last: dict[str, Any] = {"at": 0.0, "text": ""}

    def plain(objective: float | None, bound: float | None) -> None:
        text = describe(objective, bound, base_cost)
        now = time.monotonic()
        if text != last["text"] and now - last["at"] >= PLAIN_INTERVAL_S:
            print(f"{label}: {text}", file=sys.stderr, flush=True)
            last.update(at=now, text=text)

    yield plain
