"""A planning method's spec, declared next to its function: its name, entry point, options,
the plan kinds it returns, whether it needs a host tier and whether it claims bounds.

The spec is the one place these are said: the registry (planner.engine.registry), the option
check at every entry point (planner.engine.options), `planner-cli methods`, `/v1/methods` and
the offload pre-check (planner.engine.offload_checks) derive from it.

Options are a frozen dataclass type whose fields are the options: the field's type is the JSON
type (bool, int, str, str with choices; `| None` makes null a value of its own), its default the
default, and `option(...)` puts the help text, minimum and choices in the field's metadata:

    @dataclass(frozen=True)
    class PofoOptions:
        slots: int = option(200, "memory discretisation", minimum=1)
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, TypeVar

from planner.core.errors import InputError
from planner.solvers.request import MethodFn

__all__ = ["MethodSpec", "NoOptions", "OptionSpec", "option", "option_specs", "read_options"]

T = TypeVar("T")
OptionKind = Literal["bool", "int", "choice", "str"]
PLAN_KINDS = ("remat", "offload", "remat+offload", "pipeline", "fsdp")


def option(default: Any, help: str, *, minimum: int | None = None,  # noqa: A002
           maximum: int | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field declaring one method option (see the module docstring)."""
    return dataclasses.field(default=default, metadata={
        "help": help, "minimum": minimum, "maximum": maximum, "choices": choices})


@dataclass(frozen=True)
class NoOptions:
    """A method that takes no options."""


@dataclass(frozen=True)
class OptionSpec:
    """One option as the entry points see it: its JSON type, allowed values, default and help."""

    name: str
    kind: OptionKind
    description: str
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    nullable: bool = False  # null is a value of its own (e.g. "no cap"), not "the default"
    maximum: int | None = None

    def check(self, value: object, where: str) -> None:
        """InputError with field `where` when `value` is not one this option takes."""
        if value is None:
            if self.nullable:
                return
            raise InputError(f"null is not allowed; {self.expected()}", field=where)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise InputError(f"{value!r} is not a boolean; {self.expected()}", field=where)
        elif self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{value!r} is not an integer; {self.expected()}", field=where)
            if self.minimum is not None and value < self.minimum:
                raise InputError(f"{value} is below {self.minimum}; {self.expected()}",
                                 field=where)
            if self.maximum is not None and value > self.maximum:
                raise InputError(f"{value} is above {self.maximum}; {self.expected()}",
                                 field=where)
        elif self.kind == "str":
            if not isinstance(value, str):
                raise InputError(f"{value!r} is not a string; {self.expected()}", field=where)
        elif value not in self.choices:
            raise InputError(f"{value!r} is not one of {', '.join(self.choices)}", field=where)

    def values(self) -> str:
        """The accepted values in words: 'true or false', 'an integer ≥ 1 or null', ..."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "int":
            text = "an integer" + (f" ≥ {self.minimum}" if self.minimum is not None else "")
            text += f" ≤ {self.maximum}" if self.maximum is not None else ""
        elif self.kind == "str":
            text = "a string"
        else:
            text = f"one of {', '.join(self.choices)}"
        return text + (" or null" if self.nullable else "")

    def expected(self) -> str:
        return f"expected {self.values()}"

    def help(self) -> str:
        """'values; what it does (default …)': one line for help texts and API docs."""
        return f"{self.values()}; {self.description} (default {json.dumps(self.default)})"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "default": self.default,
                "help": self.description, "choices": list(self.choices),
                "minimum": self.minimum, "maximum": self.maximum, "nullable": self.nullable}


def read_options(options_type: type[T], options: Mapping[str, object]) -> T:
    """`options_type` with the given values over its defaults, unchecked: what a method reads
    (entry points check first, with `MethodSpec.check_options`; methods keep their own checks
    of what Python callers pass). Keys the type does not declare are left out."""
    names = {f.name for f in dataclasses.fields(options_type)}  # type: ignore[arg-type]
    return options_type(**{k: v for k, v in options.items() if k in names})


@cache
def option_specs(options_type: type) -> tuple[OptionSpec, ...]:
    """The options an options dataclass declares, in field order; TypeError for a field whose
    type is not an option type (bool, int, str with choices, each optionally `| None`)."""
    hints = typing.get_type_hints(options_type)
    out = []
    for f in dataclasses.fields(options_type):
        kind, nullable = _kind(hints[f.name], f.metadata.get("choices", ()), f.name)
        out.append(OptionSpec(
            name=f.name, kind=kind, description=f.metadata.get("help", ""),
            default=f.default if f.default is not dataclasses.MISSING else None,
            choices=tuple(f.metadata.get("choices", ())), minimum=f.metadata.get("minimum"),
            maximum=f.metadata.get("maximum"), nullable=nullable,
        ))
    return tuple(out)


def _kind(hint: Any, choices: tuple[str, ...], name: str) -> tuple[OptionKind, bool]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or \
        typing.get_origin(hint) is typing.Union else (hint,)
    nullable = type(None) in args
    base = [a for a in args if a is not type(None)]
    if base == [bool]:
        return "bool", nullable
    if base == [int]:
        return "int", nullable
    if base == [str]:
        return ("choice" if choices else "str"), nullable
    raise TypeError(f"option {name}: type {hint!r} is not an option type (bool, int, str, "
                    "optionally | None)")


@dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """A planning method: what the registry, the option checks, `planner-cli methods`,
    `/v1/methods` and the offload pre-check know of it."""

    name: str
    run: MethodFn  # SolveRequest -> MethodResult
    options: type = NoOptions  # a frozen dataclass; its fields are the options
    plan_kinds: tuple[str, ...] = ("remat",)
    needs_host_tier: bool = False  # offloads: refused on a machine without host memory
    claims_bounds: bool = False  # reports lower bounds beyond "every node computed once"
    summary: str = ""  # one line

    def __post_init__(self) -> None:
        unknown = [k for k in self.plan_kinds if k not in PLAN_KINDS]
        if not self.plan_kinds or unknown:
            raise TypeError(f"method {self.name}: plan kinds {self.plan_kinds} (use "
                            f"{', '.join(PLAN_KINDS)})")
        option_specs(self.options)  # a field that is not an option fails here, at import

    @property
    def target(self) -> str:
        """Where the method lives, as 'module:function'."""
        return f"{self.run.__module__}:{self.run.__qualname__}"

    @property
    def pipeline(self) -> bool:
        """A pipeline partitioner (plans of kind pipeline only)."""
        return self.plan_kinds == ("pipeline",)

    @property
    def fsdp(self) -> bool:
        """An FSDP planner (plans of kind fsdp only: one rank's settings, no actions)."""
        return self.plan_kinds == ("fsdp",)

    def option_specs(self) -> tuple[OptionSpec, ...]:
        return option_specs(self.options)

    def check_options(self, options: Mapping[str, object], where: str = "options") -> None:
        """InputError naming the first unknown key or bad value of `options`
        (field "options.<key>")."""
        specs = {s.name: s for s in self.option_specs()}
        for key, value in options.items():
            spec = specs.get(key)
            if spec is None:
                accepted = f"its options: {', '.join(specs)}" if specs else "it takes none"
                raise InputError(f"method {self.name!r} has no option {key!r} ({accepted})",
                                 field=f"{where}.{key}")
            spec.check(value, f"{where}.{key}")

    def parse_options(self, options: Mapping[str, object], where: str = "options") -> Any:
        """The checked options as an instance of the options dataclass, defaults filled in."""
        self.check_options(options, where)
        return self.options(**options)

    def read_options(self, options: Mapping[str, object]) -> Any:
        """The options dataclass with the given values over the defaults, unchecked (what a
        method reads; entry points check first, and methods keep their own checks of what
        Python callers pass). Keys the method does not declare are left out."""
        return read_options(self.options, options)

    def option_help(self) -> dict[str, str]:
        """name -> 'values; help (default …)' for each option."""
        return {s.name: s.help() for s in self.option_specs()}

    def describe(self) -> dict[str, Any]:
        """The spec as JSON (for `planner-cli methods --json` and `/v1/methods`)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "plan_kinds": list(self.plan_kinds),
            "needs_host_tier": self.needs_host_tier,
            "claims_bounds": self.claims_bounds,
            "options": [s.describe() for s in self.option_specs()],
        }
