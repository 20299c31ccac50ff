"""What every benchmark table states about the machine it ran on."""

from __future__ import annotations

import os
import platform
from importlib.metadata import version
from pathlib import Path


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


def write_doc(path: Path, title: str, preamble: list[str], table: list[str],
              notes: list[str]) -> None:
    """A benchmark's markdown page: title, the machine, preamble lines, the table, notes."""
    path.write_text("\n".join([f"# {title}", "", f"Machine: {machine()}.", *preamble, "",
                               *table, "", *notes]) + "\n")
