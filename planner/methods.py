"""The registry of planning methods, loaded lazily by name.

`planner` sits above `solvers` in the layering, so methods are named by import path and
imported only when asked for: the CLI and the service reach every solver without `planner`
importing `solvers` at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.errors import InputError
from planner.graph import Graph
from planner.plan import Action, PlanStatus


@dataclass(frozen=True)
class SolveRequest:
    graph: Graph
    budget_bytes: int
    time_limit_s: float = 60.0
    threads: int = 2
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    # Called with (best objective, best bound) as a solve progresses; may be None.
    progress: Callable[[float | None, float | None], None] | None = None


@dataclass(frozen=True)
class MethodResult:
    """What a method hands back; `solve()` turns it into a checked Plan."""

    actions: list[Action] | None  # None: no plan found
    status: PlanStatus  # optimal only when the method proved it
    backend: str = "none"
    objective: float | None = None
    lower_bound: float | None = None
    smallest_feasible_bytes: int | None = None  # what the method knows of the least budget
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


MethodFn = Callable[[SolveRequest], MethodResult]

# name -> "module:function"; each function takes a SolveRequest and returns a MethodResult.
METHODS: dict[str, str] = {
    "store-all": "planner.baseline_methods:store_all",
    "recompute-all": "planner.baseline_methods:recompute_all",
    "chen-sqrt": "planner.baseline_methods:chen_sqrt",
    "chen-greedy": "planner.baseline_methods:chen_greedy",
    "best-baseline": "planner.baseline_methods:best_baseline",
    "milp": "solvers.remat.methods:milp",
    "lp-rounding": "solvers.remat.methods:lp_rounding",
    "cpsat-intervals": "solvers.remat.methods:cpsat_intervals",
    "auto": "solvers.remat.methods:auto",
    "rotor": "solvers.chain.methods:rotor",
    "revolve": "solvers.chain.methods:revolve",
    "chain-chen-sqrt": "solvers.chain.methods:chain_chen_sqrt",
}


def register_method(name: str, target: str) -> None:
    METHODS[name] = target


def method_names() -> list[str]:
    return sorted(METHODS)


def load_method(name: str) -> MethodFn:
    if name not in METHODS:
        raise InputError(f"unknown method {name!r}; choose one of: {', '.join(method_names())}")
    module_name, _, attr = METHODS[name].partition(":")
    module = importlib.import_module(module_name)
    fn: MethodFn = getattr(module, attr)
    return fn
