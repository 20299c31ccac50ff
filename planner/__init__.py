"""Planner: memory plans for neural-network training. `planner.trace` loads torch lazily."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "trace":  # torch is imported only when tracing is used
        from planner.tracing.api import trace

        return trace
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
