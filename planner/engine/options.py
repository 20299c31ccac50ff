"""Checking a request's method options, derived from the methods' specs.

Each built-in method declares its options as a dataclass next to its function
(planner.solvers.spec); the service checks them at submission (a bad option is a 422 then,
not a failed job a minute later) and the CLI before solving. Plugin methods (registered
"module:function") define their own and are not checked.

Options written as text (the CLI's `--option KEY=VALUE`) are typed here from the method's spec
(`options_from_text`): `true`/`false` for a boolean, digits for an integer, the text for a
string or a choice, `null` where null is a value of its own; a plugin's values are read as JSON
(`12`, `true`, `"x"`), else kept as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from planner.core.errors import InputError
from planner.engine.registry import method_spec, method_specs
from planner.solvers.spec import OptionSpec

__all__ = ["METHOD_OPTIONS", "OptionSpec", "check_options", "describe_options",
           "option_from_text", "options_from_text", "with_option_fields"]


def _method_options() -> dict[str, tuple[OptionSpec, ...]]:
    return {spec.name: spec.option_specs() for spec in method_specs() if spec.option_specs()}


# method -> its options, for the built-in methods that take any (derived from the specs).
METHOD_OPTIONS: dict[str, tuple[OptionSpec, ...]] = _method_options()


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


TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
NULL_WORDS = ("null", "none")


def option_from_text(spec: OptionSpec, text: str, where: str) -> object:
    """`text` as the value option `spec` takes (checked: range, choices), or InputError with
    field `where` saying what it expected."""
    word = text.strip()
    if spec.nullable and word.lower() in NULL_WORDS:
        return None
    value: object
    if spec.kind == "bool":
        if word.lower() in TRUE_WORDS:
            value = True
        elif word.lower() in FALSE_WORDS:
            value = False
        else:
            raise InputError(f"{text!r} is not a boolean; {spec.expected()}", field=where)
    elif spec.kind == "int":
        try:
            value = int(word.replace("_", ""))
        except ValueError:
            raise InputError(f"{text!r} is not an integer; {spec.expected()}",
                             field=where) from None
    else:
        value = word
    spec.check(value, where)
    return value


def options_from_text(method: str, items: Iterable[tuple[str, str]],
                      where: str = "options") -> dict[str, Any]:
    """(key, text) pairs as `method`'s options, each typed from its spec; InputError (field
    "options.<key>") naming an unknown key with the method's options, a bad value with the
    values it takes, or a key given twice. A plugin's (or an unknown method's, refused later
    by the method check) values are read as JSON, else kept as text."""
    spec = method_spec(method)
    specs = {} if spec is None else {s.name: s for s in spec.option_specs()}
    out: dict[str, Any] = {}
    for key, text in items:
        field = f"{where}.{key}"
        if key in out:
            raise InputError("given twice", field=field)
        if spec is None:
            try:
                out[key] = json.loads(text)
            except ValueError:
                out[key] = text
            continue
        option = specs.get(key)
        if option is None:
            spec.check_options({key: None}, where)  # "method 'x' has no option 'k' (...)"
        assert option is not None
        out[key] = option_from_text(option, text, field)
    return out


def with_option_fields(options: Mapping[str, Any], fields: Mapping[str, tuple[str, object]],
                       option_name: str) -> dict[str, Any]:
    """`options` plus the options an entry point gives a field or flag of its own (option ->
    (its name, value); None: not given), so that every entry point merges them one way:
    InputError naming `options.<key>` when one is given both ways. `option_name` says how the
    caller writes an option in that entry point's words (`--option {key}=...`,
    `options.{key}`)."""
    merged = dict(options)
    for key, (name, value) in fields.items():
        if value is None:
            continue
        if key in merged:
            raise InputError(f"given twice, as {name} and as {option_name.format(key=key)}; "
                             "give one", field=f"options.{key}")
        merged[key] = value
    return merged
