"""How a benchmark reports: one way for every script under benchmarks/.

A benchmark prints its tables to stdout as it goes; asked to (`--write`, `--write-docs`,
`--out`), it also writes them into its docs page and/or a JSON file, with these helpers:

- `machine()`: what every table states about the machine it ran on;
- `write_page(path, text)`: a page the script writes whole, as it formats it;
  `write_doc(path, title, preamble, table, notes)`: one in the common form (title, the machine,
  preamble lines, the table, notes);
- `write_sections(path, {"summary": [...], "measured": [...]})`: a page that also holds
  hand-written prose: each named section lies between `<!-- NAME -->` and `<!-- /NAME -->` and is
  replaced, the text outside the markers stays. A result page opens with its summary
  (docs/README.md), so a script whose summary is separate from its rows writes it as the
  `summary` section, near the top of the page. A section the page lacks is appended; a missing
  page is created with `title`. An old page's `<!-- NAME -->` without its closing marker runs to
  the end of the page;
- `write_json(path, data)`: results as JSON (indent 1; what JSON lacks written as `str`);
  `append_json_line(path, record)`: one record more in a JSON-lines file, written as it comes
  (a long run that stops keeps what it measured and can resume).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any


def machine() -> str:
    """Cores, CPU model, Python, OR-Tools and OS: enough to tell two tables' machines apart."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
            f"OR-Tools {version('ortools')}, {platform.system()} {platform.release()}")


def write_page(path: Path, text: str | Sequence[str]) -> None:
    """A page the script writes whole: `text` as it is, or lines joined (with a last newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if isinstance(text, str) else "\n".join(text) + "\n")


def write_doc(path: Path, title: str, preamble: list[str], table: list[str],
              notes: list[str]) -> None:
    """A benchmark's markdown page: title, the machine, preamble lines, the table, notes."""
    write_page(path, [f"# {title}", "", f"Machine: {machine()}.", *preamble, "", *table, "",
                      *notes])


def _lines(text: str | Sequence[str]) -> str:
    return (text if isinstance(text, str) else "\n".join(text)).strip("\n")


def write_sections(path: Path, sections: Mapping[str, str | Sequence[str]],
                   title: str = "") -> None:
    """Replace each named section of the page at `path` (see the module's docstring)."""
    page = path.read_text() if path.exists() else (f"# {title}\n" if title else "")
    for name, text in sections.items():
        start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        body = f"{start}\n\n{_lines(text)}\n\n{end}"
        if start not in page:
            page = (page.rstrip("\n") + "\n\n" if page.strip() else "") + body + "\n"
            continue
        before, _, rest = page.partition(start)
        after = rest.partition(end)[2] if end in rest else "\n"
        page = before + body + after
    path.write_text(page if page.endswith("\n") else page + "\n")


def write_json(path: Path, data: Any) -> None:
    """Results as JSON, for scripts that read them back or for a run's record."""
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def append_json_line(path: Path, record: Any) -> None:
    """One record more at the end of a JSON-lines file."""
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
