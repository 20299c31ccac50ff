"""The registry of planning methods: an explicit table of the solvers' entry points.

Built-in methods are imported here by name, so the layer rule (engine imports solvers) is
visible to import-linter. Plugins (the service's `extra_methods` setting) are given as
"module:function" and resolved when first asked for; they sit outside the project's layers.
"""

from __future__ import annotations

import importlib

from planner.core.errors import InputError
from planner.solvers import baseline_methods
from planner.solvers.chain import methods as chain_methods
from planner.solvers.offload import methods as offload_methods
from planner.solvers.remat import methods as remat_methods
from planner.solvers.request import MethodFn, MethodResult, SolveRequest

__all__ = ["MethodFn", "MethodResult", "SolveRequest", "load_method", "method_names",
           "register_method", "BUILTIN_METHODS"]

# name -> function taking a SolveRequest and returning a MethodResult.
BUILTIN_METHODS: dict[str, MethodFn] = {
    "store-all": baseline_methods.store_all,
    "recompute-all": baseline_methods.recompute_all,
    "chen-sqrt": baseline_methods.chen_sqrt,
    "chen-greedy": baseline_methods.chen_greedy,
    "best-baseline": baseline_methods.best_baseline,
    "milp": remat_methods.milp,
    "lp-rounding": remat_methods.lp_rounding,
    "cpsat-intervals": remat_methods.cpsat_intervals,
    "auto": remat_methods.auto,
    "rotor": chain_methods.rotor,
    "revolve": chain_methods.revolve,
    "chain-chen-sqrt": chain_methods.chain_chen_sqrt,
    "offload-all": offload_methods.offload_all,
    "offload-greedy": offload_methods.offload_greedy,
    "offload-beaumont": offload_methods.offload_beaumont,
    "offload-remat": offload_methods.offload_remat,
    "offload-milp": offload_methods.offload_milp,
    "pofo": offload_methods.pofo,
}

# Plugins: name -> "module:function", registered at run time (e.g. from service settings).
_PLUGINS: dict[str, str] = {}


def register_method(name: str, target: str) -> None:
    """Register a plugin method by import path ("package.module:function")."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise InputError(f"method {name!r}: target {target!r} must look like 'module:function'")
    _PLUGINS[name] = target


def method_names() -> list[str]:
    return sorted({*BUILTIN_METHODS, *_PLUGINS})


def load_method(name: str) -> MethodFn:
    if name in _PLUGINS:
        module_name, _, attr = _PLUGINS[name].partition(":")
        try:
            fn: MethodFn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise InputError(f"method {name!r}: cannot load {_PLUGINS[name]!r}: {e}") from None
        return fn
    if name not in BUILTIN_METHODS:
        raise InputError(f"unknown method {name!r}; choose one of: {', '.join(method_names())}")
    return BUILTIN_METHODS[name]


def method_target(name: str) -> str:
    """Where a method lives, as 'module:function' (for `planner-cli methods`)."""
    if name in _PLUGINS:
        return _PLUGINS[name]
    fn = BUILTIN_METHODS[name]
    return f"{fn.__module__}:{fn.__qualname__}"
