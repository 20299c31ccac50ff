"""Memory budgets: one grammar for the CLI, the REST API and the runtime agent.

Every form means one thing, whoever reads it:

- `80%`, `150%`: a percentage of the graph's store-all peak (any positive size);
- `0.8`, `.25`, `1`, `1.0`: a bare number in (0, 1] is a fraction of the store-all peak;
- `11.3GiB`, `900MB`, `64B`: bytes with a unit (B, KB, MB, GB, TB decimal; KiB … TiB binary);
- `12000000000`, `1e9`: a bare whole number from `MIN_PLAIN_BYTES` (1000) up is bytes.

A bare number between 1 and 1000 (`1.5`, `2`, `12`, `80`) could mean a multiple of the peak,
a percentage, gigabytes or bytes: it is refused with the forms that say each. A budget over
`MAX_BUDGET_BYTES` (1 EiB) is refused too, so no store or solver sees an absurd integer, and
so is one under a byte (`1e-300GB`) or a fraction under `MIN_FRACTION` (`1e-300`, once read as
1 byte).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from planner.core.errors import InputError

__all__ = [
    "BUDGET_GRAMMAR", "MAX_BUDGET_BYTES", "MIN_FRACTION", "MIN_PLAIN_BYTES", "BudgetSpec",
    "format_bytes", "parse_budget", "parse_budget_spec",
]

_UNITS = {
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
MIN_PLAIN_BYTES = 1000  # a bare whole number below this is ambiguous (2, 12, 80, 512)
MAX_BUDGET_BYTES = 2**60  # 1 EiB: far above any device, far below int64
MIN_FRACTION = 1e-6  # of the store-all peak: far below any model's least memory
BUDGET_GRAMMAR = (
    "80% (of the store-all peak), 0.8 (a fraction in (0, 1]), 11.3GiB / 900MB / 64B "
    f"(bytes with a unit), or a plain byte count of at least {MIN_PLAIN_BYTES}"
)
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class BudgetSpec:
    """A parsed budget: either a fraction of the store-all peak or a number of bytes."""

    text: str  # as written
    fraction: float | None = None  # of the store-all peak (80% -> 0.8)
    bytes: int | None = None

    @property
    def needs_reference(self) -> bool:
        """True when the budget is relative: the graph's store-all peak is needed."""
        return self.fraction is not None

    def resolve(self, reference_peak_bytes: int | None, name: str = "budget") -> int:
        """Bytes; a fraction is rounded up, as in the published comparisons."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        if reference_peak_bytes is None:
            raise InputError(f"{self.text!r}: a fraction needs a graph to take it of", field=name)
        value = math.ceil(self.fraction * reference_peak_bytes)
        if value > MAX_BUDGET_BYTES:
            raise InputError(
                f"{self.text!r}: {value} bytes, over the largest budget of "
                f"{MAX_BUDGET_BYTES} bytes (1 EiB)",
                field=name,
            )
        return max(value, 1)

    def __str__(self) -> str:
        if self.bytes is not None:
            return f"{self.bytes} bytes"
        return f"{self.fraction:g} × store-all peak"


def parse_budget_spec(value: str | int | float, name: str = "budget") -> BudgetSpec:
    """Parse a budget without a graph (see the module docstring); InputError whose field is
    `name` (`budget`, `host_memory`) with the fix for anything ambiguous or out of range."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InputError(f"{value!r}: expected a number or a string such as '80%'", field=name)
    raw = value if isinstance(value, str) else repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{raw!r}: must be a finite number; use {BUDGET_GRAMMAR}", field=name)
    m = _PATTERN.match(raw)
    if not m:
        raise InputError(f"{raw!r}: cannot parse; use {BUDGET_GRAMMAR}", field=name)
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:  # pragma: no cover - the pattern only lets decimals through
        raise InputError(f"{raw!r}: cannot parse; use {BUDGET_GRAMMAR}", field=name) from None
    unit = m.group(2).lower()
    if number <= 0:
        raise InputError(f"{raw!r}: must be more than 0", field=name)
    if unit == "%":
        # float(text) / 100, as before: published budgets keep their exact byte counts.
        fraction = float(m.group(1)) / 100
        return _checked(BudgetSpec(raw, fraction=fraction), number / 100, name)
    if unit:
        if unit not in _UNITS:
            raise InputError(
                f"{raw!r}: unknown unit {m.group(2)!r}; use B, KB, MB, GB, TB, KiB, MiB, "
                "GiB or TiB",
                field=name,
            )
        total = number * _UNITS[unit]
        if unit == "b" and total != total.to_integral_value():
            raise InputError(f"{raw!r}: a byte count must be a whole number", field=name)
        return _checked(BudgetSpec(raw, bytes=_ceil(total)), total, name)
    if number <= 1:
        return _checked(BudgetSpec(raw, fraction=float(m.group(1))), number, name)
    whole = number == number.to_integral_value()
    if whole and number >= MIN_PLAIN_BYTES:
        return _checked(BudgetSpec(raw, bytes=_ceil(number)), number, name)
    text = m.group(1)
    times = format((number * 100).normalize(), "f")
    in_bytes = f", or {text}B" if whole else ""
    raise InputError(
        f"{raw!r}: ambiguous: a bare number is a fraction of the store-all peak up to 1 "
        f"and bytes from {MIN_PLAIN_BYTES} up; write {text}% (percent of the store-all peak), "
        f"{times}% ({text} × it), {text}GB / {text}GiB{in_bytes}",
        field=name,
    )


def parse_budget(
    value: str | int | float, reference_peak_bytes: int | None = None, name: str = "budget"
) -> int:
    """Budget in bytes (see the module docstring). A fraction or percentage is taken of the
    reference peak (the store-all peak), rounded up as in the published comparisons."""
    return parse_budget_spec(value, name).resolve(reference_peak_bytes, name)


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _checked(spec: BudgetSpec, amount: Decimal, name: str) -> BudgetSpec:
    """Refuse budgets over 1 EiB (bytes) or over 2**20 × the store-all peak (fractions)."""
    if spec.bytes is not None and amount > MAX_BUDGET_BYTES:
        raise InputError(
            f"{spec.text!r}: too large; the largest budget is {MAX_BUDGET_BYTES} bytes "
            "(1 EiB)",
            field=name,
        )
    if spec.fraction is not None and amount > 2**20:
        raise InputError(
            f"{spec.text!r}: too large; at most 2**20 × the store-all peak", field=name
        )
    # '1e-300' (or '1e-300GB') was read as 1 byte: a budget that means nothing.
    if spec.bytes is not None and amount < 1:
        raise InputError(f"{spec.text!r}: under 1 byte; give bytes such as 12GiB or a "
                         "fraction of the store-all peak such as 0.8", field=name)
    if spec.fraction is not None and amount < MIN_FRACTION:
        raise InputError(
            f"{spec.text!r}: a fraction of the store-all peak under {MIN_FRACTION:g} (0.0001%) "
            "fits no model; give one such as 0.8 or 80%, or bytes such as 12GiB", field=name)
    return spec


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
