"""Kept for scripts written against it: the helpers are in benchmarks/results.py."""

from __future__ import annotations

try:  # a script run as a file has benchmarks/ on sys.path
    from results import machine, write_doc
except ImportError:  # pragma: no cover - imported as benchmarks._common
    from benchmarks.results import machine, write_doc

__all__ = ["machine", "write_doc"]
