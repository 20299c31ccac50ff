"""The options each built-in method reads from `SolveRequest.options`, and their check.

One table for the service (a bad option is a 422 at submission, not a failed job a minute
later) and the CLI. It mirrors what the methods in `planner.solvers.remat.methods`,
`planner.solvers.chain.methods` and `planner.solvers.baseline_methods` read; a method missing here
takes no
options. Plugin methods (registered "module:function") define their own and are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from planner.core.errors import InputError
from planner.solvers.chain.rotor import DEFAULT_SLOTS
from planner.solvers.remat.backends import LP_BACKENDS, MIP_BACKENDS

__all__ = ["METHOD_OPTIONS", "OptionSpec", "check_options", "describe_options"]

OptionKind = Literal["bool", "int", "choice"]


@dataclass(frozen=True)
class OptionSpec:
    """One option: its JSON type, allowed values, and what it does."""

    name: str
    kind: OptionKind
    description: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    nullable: bool = False  # null is a value of its own (e.g. "no cap"), not "the default"

    def check(self, value: object, where: str) -> None:
        if value is None:
            if self.nullable:
                return
            raise InputError(f"{where}: null is not allowed; {self.expected()}")
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise InputError(f"{where}: {value!r} is not a boolean; {self.expected()}")
        elif self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{where}: {value!r} is not an integer; {self.expected()}")
            if self.minimum is not None and value < self.minimum:
                raise InputError(f"{where}: {value} is below {self.minimum}; {self.expected()}")
        elif value not in self.choices:
            raise InputError(f"{where}: {value!r} is not one of {', '.join(self.choices)}")

    def values(self) -> str:
        """The accepted values in words: 'true or false', 'an integer ≥ 1 or null', ..."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "int":
            text = "an integer" + (f" ≥ {self.minimum}" if self.minimum is not None else "")
        else:
            text = f"one of {', '.join(self.choices)}"
        return text + (" or null" if self.nullable else "")

    def expected(self) -> str:
        return f"expected {self.values()}"


_HINT = OptionSpec("hint", "bool", "start from the best baseline's plan (default true)")

METHOD_OPTIONS: dict[str, tuple[OptionSpec, ...]] = {
    "milp": (
        OptionSpec("backend", "choice", "MILP solver (default cpsat)", choices=MIP_BACKENDS),
        _HINT,
    ),
    "lp-rounding": (
        OptionSpec("backend", "choice", "LP solver (default highs-lp)", choices=LP_BACKENDS),
    ),
    "cpsat-intervals": (
        OptionSpec("max_computations", "int", "cap on each node's computations (no bound is "
                   "claimed then); null: no cap", minimum=1, nullable=True),
        _HINT,
    ),
    "rotor": (
        OptionSpec("slots", "int", f"memory discretisation (default {DEFAULT_SLOTS})",
                   minimum=1),
        OptionSpec("refine", "int", "extra DP runs that win back rounding loss (default 2)",
                   minimum=0),
        OptionSpec("saving", "bool", "on a linearised graph, let each segment's full-saving "
                   "forward keep less and its backward recompute the rest, chosen per "
                   "segment (default false: plain Rotor; auto uses it)"),
    ),
    "offload-all": (
        OptionSpec("min_bytes", "int", "offload only tensors of at least this many bytes "
                   "(default 1024, torchtune's)", minimum=0),
    ),
    "offload-milp": (
        OptionSpec("backend", "choice", "solver (default scip; cpsat: on integer grids)",
                   choices=("scip", "highs", "cbc", "cpsat")),
        OptionSpec("max_nodes", "int", "largest graph the model is built for (default 400)",
                   minimum=1),
    ),
    "pofo": (
        OptionSpec("slots", "int", "memory discretisation (default 200)", minimum=1),
    ),
}


def builtin_method(method: str) -> bool:
    from planner.engine.registry import BUILTIN_METHODS

    return method in BUILTIN_METHODS


def check_options(method: str, options: Mapping[str, object], where: str = "options") -> None:
    """InputError naming the first unknown key or bad value of `options` for built-in
    `method`; plugin methods take whatever they take."""
    if not builtin_method(method):
        return
    specs = {spec.name: spec for spec in METHOD_OPTIONS.get(method, ())}
    for key, value in options.items():
        spec = specs.get(key)
        if spec is None:
            accepted = f"its options: {', '.join(specs)}" if specs else "it takes none"
            raise InputError(f"{where}.{key}: method {method!r} has no option {key!r} ({accepted})")
        spec.check(value, f"{where}.{key}")


def describe_options(method: str) -> dict[str, str]:
    """name -> 'values; description' for `method` (empty for a method without options)."""
    return {s.name: f"{s.values()}; {s.description}" for s in METHOD_OPTIONS.get(method, ())}
