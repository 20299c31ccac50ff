"""Checking a request's method options, derived from the methods' specs.

Each built-in method declares its options as a dataclass next to its function
(planner.solvers.spec); the service checks them at submission (a bad option is a 422 then,
not a failed job a minute later) and the CLI before solving. Plugin methods (registered
"module:function") define their own and are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.engine.registry import method_spec, method_specs
from planner.solvers.spec import OptionSpec

__all__ = ["METHOD_OPTIONS", "OptionSpec", "check_options", "describe_options"]


def _method_options() -> dict[str, tuple[OptionSpec, ...]]:
    return {spec.name: spec.option_specs() for spec in method_specs() if spec.option_specs()}


# method -> its options, for the built-in methods that take any (derived from the specs).
METHOD_OPTIONS: dict[str, tuple[OptionSpec, ...]] = _method_options()


def builtin_method(method: str) -> bool:
    return method_spec(method) is not None


def check_options(method: str, options: Mapping[str, object], where: str = "options") -> None:
    """InputError (field "options.<key>") naming the first unknown key or bad value of
    `options` for built-in `method`; plugin methods take whatever they take."""
    spec = method_spec(method)
    if spec is not None:
        spec.check_options(options, where)


def describe_options(method: str) -> dict[str, str]:
    """name -> 'values; description (default …)' for `method` (empty for a method without
    options or a plugin)."""
    spec = method_spec(method)
    return {} if spec is None else spec.option_help()
