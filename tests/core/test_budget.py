"""Budget parsing: bytes, units, fractions and percentages of the store-all peak, errors.

The grammar is unambiguous (planner/core/budget.py): an integer is bytes (1 is one byte), a
number with a point a fraction of the store-all peak up to 1 (1.0 is all of it); a number with a
point above 1 is refused with the forms that say what was meant."""

from __future__ import annotations

import pytest

from planner.core.budget import format_bytes, parse_budget
from planner.core.errors import InputError

PEAK = 13_484_795_520  # fcn8's store-all peak: the published budgets are fractions of it


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123456", 123456),
        (123456, 123456),
        ("1000", 1000),
        ("1", 1),  # an integer is bytes, however small
        (1, 1),
        ("500", 500),
        (999, 999),
        ("2B", 2),
        ("900MB", 900 * 10**6),
        ("900 mb", 900 * 10**6),
        ("11.3GiB", 12_133_282_612),  # ceil(11.3 * 2**30)
        ("1KiB", 1024),
        ("1kb", 1000),
        ("64B", 64),
        ("2TiB", 2 * 2**40),
        ("1TB", 10**12),
        ("1.5GB", 1_500_000_000),
        ("  4 GiB ", 4 * 2**30),
    ],
)
def test_absolute_budgets(text: str | int, expected: int) -> None:
    assert parse_budget(text, PEAK) == expected
    assert parse_budget(text) == expected  # absolute budgets need no reference peak


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.9", 12_136_315_968),  # ceil(0.9 * peak), as published (11.3 GiB)
        ("0.8", 10_787_836_416),  # ceil(0.8 * peak), as published (10.05 GiB)
        ("1.0", PEAK),
        (1.0, PEAK),
        ("1.", PEAK),
        ("8e-1", 10_787_836_416),
        (0.5, PEAK // 2),
        ("80%", 10_787_836_416),
        ("100 %", PEAK),
        ("150%", 20_227_193_280),
        (".25", PEAK // 4),
    ],
)
def test_fractions_of_the_store_all_peak(text: str | float, expected: int) -> None:
    assert parse_budget(text, PEAK) == expected


def test_fractions_round_up() -> None:
    assert parse_budget("0.5", 3) == 2
    assert parse_budget("33%", 10) == 4  # 3.3 -> 4


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "cannot parse"),
        ("lots", "cannot parse"),
        ("-5", "more than 0"),
        ("1.2.3GiB", "cannot parse"),
        ("nan", "cannot parse"),
        ("10 GiB of memory", "cannot parse"),
        ("5XB", "unknown unit 'XB'"),
        ("0", "more than 0"),
        ("0%", "more than 0"),
        ("0GiB", "more than 0"),
        ("1e999", "at most 1"),
        ("1" + "0" * 19, "too large"),
        ("1.5", "150%"),
        ("2.0", "200%"),
        ("1e9", "1000000000 (an integer: bytes) or 1GB"),
        ("1.5B", "whole number"),
    ],
)
def test_bad_budgets_are_input_errors(text: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_budget(text, PEAK)
    msg = str(info.value)
    assert fragment in msg
    assert repr(text) in msg
    assert "\n" not in msg


def test_a_fraction_needs_a_reference() -> None:
    with pytest.raises(InputError, match="fraction needs a graph"):
        parse_budget("0.8")
    with pytest.raises(InputError, match="fraction needs a graph"):
        parse_budget("50%")


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (PEAK, "12.56 GiB"),
        (3 * 2**40, "3.00 TiB"),
        (5 * 2**50, "5120.00 TiB"),
    ],
)
def test_format_bytes(n: int | None, text: str) -> None:
    assert format_bytes(n) == text
