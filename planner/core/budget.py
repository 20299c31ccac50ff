"""Memory budgets: one grammar for the CLI, the REST API, the runtime agent and the trainer
callbacks. Every form means one thing, whoever reads it:

| written                                   | means                                             |
|-------------------------------------------|---------------------------------------------------|
| an integer: `1`, `500`, `12000000000`     | bytes (Python int, JSON integer, digits in a      |
|                                           | string); `1` is one byte                          |
| `0.8`, `.25`, `1.0`, `8e-1`               | a fraction of the graph's store-all peak, in      |
|                                           | (0, 1] (Python float, JSON number with a point or |
|                                           | an exponent, the same in a string)                |
| `80%`, `150%`                             | a percentage of the store-all peak (any size)     |
| `11.3GiB`, `900MB`, `64B`                 | bytes with a unit (B, KB, MB, GB, TB decimal;     |
|                                           | KiB … TiB binary)                                 |

A number written with a point or an exponent above 1 (`1.5`, `1e9`, the float `4e9`) is
refused with the forms that say it: `150%` for 1.5 × the peak, `1000000000` or `1GB` for bytes.
So `budget=1` is one byte and `budget=1.0` is the whole store-all peak; a byte count computed
as a float (`0.9 * total_memory`) must be made an int. A budget over `MAX_BUDGET_BYTES` (1 EiB)
is refused, so no store or solver sees an absurd integer, and so is one under a byte
(`1e-300GB`) or a fraction under `MIN_FRACTION` (`1e-300`). A tiny byte budget (`1`) is legal:
the planner answers that no plan fits, with the smallest budget that works.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from planner.core.errors import InputError

__all__ = [
    "BUDGET_GRAMMAR", "MAX_BUDGET_BYTES", "MIN_FRACTION", "BudgetSpec", "format_bytes",
    "parse_budget", "parse_budget_spec",
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
MAX_BUDGET_BYTES = 2**60  # 1 EiB: far above any device, far below int64
MIN_FRACTION = 1e-6  # of the store-all peak: far below any model's least memory
MAX_MULTIPLE = 2**20  # a percentage: at most 2**20 × the store-all peak
MAX_TEXT = 100  # characters: no budget is longer
BUDGET_GRAMMAR = (
    "80% (of the store-all peak), 0.8 (a fraction in (0, 1], written with a point), "
    "11.3GiB / 900MB / 64B (bytes with a unit), or an integer: bytes (12000000000; 1 is one "
    "byte)"
)
_PATTERN = re.compile(
    r"^\s*([+-]?)((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*|%)\s*$"
)


@dataclass(frozen=True)
class BudgetSpec:
    """A parsed budget: either a fraction of the store-all peak or a number of bytes."""

    text: str  # as written (a number: its repr)
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
            raise InputError(f"{self.text!r}: a fraction needs a graph to take it of",
                             field=name)
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


def parse_budget_spec(value: object, name: str = "budget") -> BudgetSpec:
    """Parse a budget without a graph (see the module docstring): an int is bytes, a float a
    fraction of the store-all peak, a string the grammar. InputError whose field is `name`
    (`budget`, `device_memory`, `host_memory`), one line with the fix."""
    if isinstance(value, bool) or not isinstance(value, str | numbers.Real):
        raise InputError(f"{_shown(value)}: expected an integer (bytes), a fraction such as "
                         "0.8 or a string such as '80%' or '12GiB'", field=name)
    if isinstance(value, numbers.Integral):
        return _bytes(int(value), name)
    if not isinstance(value, str):  # a float: a fraction, whatever its value
        real = float(value)
        if not math.isfinite(real):
            raise InputError(f"{real}: must be a finite number; use {BUDGET_GRAMMAR}",
                             field=name)
        return _fraction(repr(real), repr(real), Decimal(repr(real)), repr(real), name)
    text = value.strip()
    shown = repr(text) if len(text) <= MAX_TEXT else f"{text[:20]!r}… ({len(text)} characters)"
    m = _PATTERN.match(text) if len(text) <= MAX_TEXT else None
    if not m:
        raise InputError(f"{shown}: cannot parse; use {BUDGET_GRAMMAR}", field=name)
    sign, digits, unit_text = m.groups()
    try:
        number = Decimal(digits)
    except InvalidOperation:  # pragma: no cover - the pattern only lets decimals through
        raise InputError(f"{shown}: cannot parse; use {BUDGET_GRAMMAR}", field=name) from None
    if sign == "-" or number == 0:
        raise InputError(f"{shown}: must be more than 0", field=name)
    unit = unit_text.lower()
    if unit == "%":
        # float(text) / 100, as before: published budgets keep their exact byte counts.
        fraction = float(digits) / 100
        return _checked(BudgetSpec(text, fraction=fraction), number / 100, name, shown)
    if unit:
        if unit not in _UNITS:
            raise InputError(
                f"{shown}: unknown unit {unit_text!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or "
                "TiB",
                field=name,
            )
        total = number * _UNITS[unit]
        if unit == "b" and total != total.to_integral_value():
            raise InputError(f"{shown}: a byte count must be a whole number", field=name)
        return _checked(BudgetSpec(text, bytes=_ceil(total)), total, name, shown)
    if digits.isdigit():  # an integer: bytes
        return _checked(BudgetSpec(text, bytes=int(number)), number, name, shown)
    return _fraction(text, shown, number, digits, name)


def parse_budget(
    value: object, reference_peak_bytes: int | None = None, name: str = "budget"
) -> int:
    """Budget in bytes (see the module docstring). A fraction or percentage is taken of the
    reference peak (the store-all peak), rounded up as in the published comparisons."""
    return parse_budget_spec(value, name).resolve(reference_peak_bytes, name)


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 256 else (
        f"an integer of {value.bit_length()} bits")
    return text if len(text) <= MAX_TEXT else f"{text[:20]}… ({len(text)} characters)"


def _bytes(value: int, name: str) -> BudgetSpec:
    """An integer: bytes, from 1 up to MAX_BUDGET_BYTES."""
    if value <= 0:
        raise InputError(f"{_shown(value)}: must be more than 0 (an integer is bytes)",
                         field=name)
    if value > MAX_BUDGET_BYTES:
        raise InputError(f"{_shown(value)}: too large; the largest budget is "
                         f"{MAX_BUDGET_BYTES} bytes (1 EiB)", field=name)
    return BudgetSpec(str(value), bytes=value)


def _fraction(text: str, shown: str, number: Decimal, digits: str, name: str) -> BudgetSpec:
    """A number with a point or an exponent: a fraction of the store-all peak in (0, 1]."""
    if number <= 0:
        raise InputError(f"{shown}: must be more than 0", field=name)
    if number <= 1:
        return _checked(BudgetSpec(text, fraction=float(digits)), number, name, shown)
    rule = "a number with a point or an exponent is a fraction of the store-all peak, at most 1"
    if number > MAX_BUDGET_BYTES:
        raise InputError(f"{shown}: too large; the largest budget is {MAX_BUDGET_BYTES} bytes "
                         f"(1 EiB), and {rule}", field=name)
    times = f"{format((number * 100).normalize(), 'f')}% for {digits} × the peak"
    if number != number.to_integral_value():
        fix = (f"{times}, or " if number <= MAX_MULTIPLE else "") + (
            f"bytes with a unit ({digits}GB, {digits}GiB)")
    else:
        whole = int(number)
        unit = next((f"{whole // size}{u}" for u, size in (("TB", 10**12), ("GB", 10**9),
                     ("MB", 10**6), ("KB", 10**3)) if whole % size == 0), None)
        fix = f"{whole} (an integer: bytes)" + (f" or {unit}" if unit else "") + (
            f", or {times}" if number <= MAX_MULTIPLE else "")
    raise InputError(f"{shown}: {rule}; write {fix}", field=name)


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _checked(spec: BudgetSpec, amount: Decimal, name: str, shown: str) -> BudgetSpec:
    """Refuse budgets over 1 EiB (bytes) or over 2**20 × the store-all peak (fractions)."""
    if spec.bytes is not None and amount > MAX_BUDGET_BYTES:
        raise InputError(
            f"{shown}: too large; the largest budget is {MAX_BUDGET_BYTES} bytes (1 EiB)",
            field=name,
        )
    if spec.fraction is not None and amount > MAX_MULTIPLE:
        raise InputError(
            f"{shown}: too large; at most 2**20 × the store-all peak", field=name
        )
    # '1e-300GB' was read as 1 byte: a budget that means nothing.
    if spec.bytes is not None and amount < 1:
        raise InputError(f"{shown}: under 1 byte; give bytes such as 12GiB or a "
                         "fraction of the store-all peak such as 0.8", field=name)
    if spec.fraction is not None and amount < MIN_FRACTION:
        raise InputError(
            f"{shown}: a fraction of the store-all peak under {MIN_FRACTION:g} (0.0001%) "
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
