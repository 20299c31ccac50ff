"""The registry of planning methods, derived from the specs each method declares next to its
function (planner.solvers.spec).

Built-in methods are imported here by module, so the layer rule (engine imports solvers) is
visible to import-linter; a new method is a function and its `MethodSpec` in one of these
modules' `SPECS`. Plugins (the service's `extra_methods` setting) are given as
"module:function" and resolved when first asked for; they sit outside the project's layers and
have no spec (their options are not checked).
"""

from __future__ import annotations

import importlib

from planner.core.errors import InputError
from planner.solvers import auto_method, baseline_methods, handwritten
from planner.solvers.chain import methods as chain_methods
from planner.solvers.fsdp import methods as fsdp_methods
from planner.solvers.offload import methods as offload_methods
from planner.solvers.pipeline import methods as pipeline_methods
from planner.solvers.remat import methods as remat_methods
from planner.solvers.remat import sac as sac_method
from planner.solvers.request import MethodFn, MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec

__all__ = ["BUILTIN_METHODS", "MethodFn", "MethodResult", "SolveRequest", "describe_methods",
           "load_method", "method_names", "method_spec", "method_specs", "method_target",
           "register_method"]

_SPECS: dict[str, MethodSpec] = {
    spec.name: spec
    for module in (baseline_methods, handwritten, auto_method, remat_methods, chain_methods,
                   offload_methods, pipeline_methods, sac_method, fsdp_methods)
    for spec in module.SPECS
}

# name -> function taking a SolveRequest and returning a MethodResult.
BUILTIN_METHODS: dict[str, MethodFn] = {name: spec.run for name, spec in _SPECS.items()}

# Plugins: name -> "module:function", registered at run time (e.g. from service settings).
_PLUGINS: dict[str, str] = {}


def method_specs() -> list[MethodSpec]:
    """Every built-in method's spec, in declaration order."""
    return list(_SPECS.values())


def method_spec(name: str) -> MethodSpec | None:
    """The spec of built-in method `name`; None for a plugin or an unknown name."""
    return None if name in _PLUGINS else _SPECS.get(name)


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
    return _SPECS[name].target


def describe_methods() -> list[dict[str, object]]:
    """Every method as JSON, by name: a built-in's spec (`MethodSpec.describe`), a plugin's
    target ({"name", "plugin": "module:function"}); what `planner-cli methods --json` prints
    and `/v1/methods` serves."""
    return [spec.describe() if (spec := method_spec(name)) is not None
            else {"name": name, "plugin": method_target(name)}
            for name in method_names()]
