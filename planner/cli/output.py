"""Shared output helpers: rich tables for people, JSON for machines, human units.

On a terminal rich draws for the terminal's width. Piped or redirected (`| grep`, a file, a CI
log) the output is read whole or by tools, so `console` then renders at PIPE_WIDTH columns: rich
tables size their columns to their content (no table here comes near that width), so each row
stays one line and no cell is cut to `infeas…`. The same tables for both, rather than a second
TSV form, so what a user pastes from a log is what they saw on the terminal; `--json` is the
machine form. Progress (spinners, periodic lines) goes to stderr (`progress_console`), so stdout
carries only the answer."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.core.budget import format_bytes

PIPE_WIDTH = 1000  # columns when stdout is not a terminal: wide enough that nothing wraps


def _stdout_console() -> Console:
    terminal = Console(highlight=False)
    return terminal if terminal.is_terminal else Console(highlight=False, width=PIPE_WIDTH)


console = _stdout_console()
progress_console = Console(stderr=True, highlight=False)


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=1, default=str))


def key_value_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def bytes_text(n: int | None) -> str:
    """'1.50 MiB (1572864 B)': the unit a person reads and the exact count, without
    separators so that it can be searched for and pasted into --budget."""
    if n is None:
        return "-"
    return f"{int(n)} B" if abs(n) < 1024 else f"{format_bytes(n)} ({int(n)} B)"


def percent_text(value: float | None, *, signed: bool = True, digits: int = 2) -> str:
    """'+3.55 %' from 3.5532994923857872 (a value already in percent)."""
    if value is None:
        return "-"
    return f"{value:+.{digits}f} %" if signed else f"{value:.{digits}f} %"


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
