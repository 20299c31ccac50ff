"""Parse memory budgets: bytes (`123456`), units (`11.3GiB`, `900MB`), fractions (`0.8`, `80%`)."""

from __future__ import annotations

import math
import re

from planner.errors import InputError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*|%)\s*$")


def parse_budget(text: str | int | float, reference_peak_bytes: int | None = None) -> int:
    """Budget in bytes. A bare number ≤ 1 (or a percentage) is a fraction of the reference peak
    (the store-all peak), rounded up as in the published comparisons."""
    raw = str(text)
    m = _PATTERN.match(raw)
    if not m:
        raise InputError(
            f"budget {raw!r}: cannot parse; use bytes (123456), units (11.3GiB, 900MB) "
            "or a fraction of the store-all peak (0.8, 80%)"
        )
    value = float(m.group(1))
    unit = m.group(2).lower()
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"budget {raw!r}: must be a positive number")
    if unit == "%" or (unit == "" and value <= 1.0):
        fraction = value / 100 if unit == "%" else value
        if reference_peak_bytes is None:
            raise InputError(f"budget {raw!r}: a fraction needs a graph to take it of")
        return math.ceil(fraction * reference_peak_bytes)
    if unit not in _UNITS:
        raise InputError(
            f"budget {raw!r}: unknown unit {m.group(2)!r}; use B, KB, MB, GB, KiB, MiB, GiB, TiB"
        )
    return math.ceil(value * _UNITS[unit])


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
