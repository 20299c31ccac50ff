"""Shared output helpers: rich tables for people, JSON for machines."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False)


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=1, default=str))


def key_value_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, str(value))
    return table
