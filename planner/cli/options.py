"""Options shared by several commands: the machine a plan is for (`--resources`), the memory
budget (`--budget`, one grammar with the REST API), the solver's time limit (`--time-limit`,
validated once by `planner.core.limits`) and the method's options (`--option KEY=VALUE`, typed
from the method's spec by `planner.engine.options`); and the CLI's words for the request's
fields (`planner.engine.request`): an error about field `budget` says `--budget` here, one about
`options.slots` says `--option slots`."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner.engine.request_fields import cli_words, request_field

if TYPE_CHECKING:
    from planner.core.errors import InputError
    from planner.core.resources import Resources

# Request field -> the flag that gives it (InputError.renamed looks up the field's first part):
# the plan request's fields from the one table (planner.engine.request_fields), then those of
# the commands that take more (partition, trace).
CLI_FIELDS = {
    **cli_words(),
    "devices": "--devices",
    "device_memory": "--device-memory",
    "microbatches": "--microbatches",
    "schedule": "--schedule",
    "chunks": "--chunks",
    "split": "--split",
    "zero_stage": "--zero",
    "dp": "--dp",
    "optimizer": "--optimizer",
    "precision": "--precision",
    "config_overrides": "--config",  # trace: a Hugging Face model's config fields
}
OPTION_FLAG = request_field("options").flag or "--option"


def in_cli_words(err: InputError) -> InputError:
    """`err` with its request field said as the flag that gives it (`budget` -> `--budget`,
    `options.slots` -> `--option slots`)."""
    if err.field is not None and err.field.startswith("options."):
        from planner.core.errors import InputError

        return InputError(err.detail, field=f"{OPTION_FLAG} {err.field.removeprefix('options.')}")
    return err.renamed(CLI_FIELDS)


ResourcesOpt = Annotated[
    str | None,
    typer.Option(
        "--resources",
        "-r",
        help=request_field("resources").help.replace("document", "file"),
    ),
]

BUDGET_HELP = request_field("budget").help
METHOD_HELP = request_field("method").help
ThreadsOpt = Annotated[int, typer.Option("--threads", min=1, help=request_field("threads").help)]
SeedOpt = Annotated[int, typer.Option("--seed", help=request_field("seed").help)]


def _checked_time_limit(value: float | None) -> float | None:
    """Click callback: finite, > 0, at most a day; InputError (exit 2, one line) otherwise."""
    if value is None:
        return None
    from planner.core.limits import check_time_limit

    return check_time_limit(value, "time_limit")


def _time_limit_option(help_text: str) -> typer.models.OptionInfo:
    return typer.Option("--time-limit", help=help_text, callback=_checked_time_limit)


TIME_LIMIT_HELP = request_field("time_limit").help
TimeLimitOpt = Annotated[float, _time_limit_option(TIME_LIMIT_HELP)]
TimeLimitPerBudgetOpt = Annotated[
    float, _time_limit_option("Seconds per budget (finite, > 0, at most 86400)")
]
OptionalTimeLimitOpt = Annotated[
    float | None, _time_limit_option(TIME_LIMIT_HELP + "; default: the server's")
]
# The request's default when not given (planner.engine.request.default_time_limit_s).
RequestTimeLimitOpt = Annotated[
    float | None, _time_limit_option(
        request_field("time_limit").text())
]


OptionsOpt = Annotated[
    list[str] | None,
    typer.Option(
        OPTION_FLAG, "-O", metavar="KEY=VALUE",
        help=request_field("options").help + ". Repeatable: e.g. --option space=compiled, "
        "--option slots=100, --option hint=false, --option max_computations=null",
    ),
]


def method_options(items: list[str] | None, method: str,
                   flags: Mapping[str, tuple[str, object]] | None = None) -> dict[str, Any]:
    """`--option KEY=VALUE` items as `method`'s options, typed from its spec
    (planner.engine.options.options_from_text); `flags`: option -> (flag, value) for options a
    flag of their own gives (`{"backend": ("--backend", "highs")}`), taken when the value is not
    None. InputError naming `--option KEY` (in_cli_words): a malformed item, an unknown key
    (with the method's options), a bad value (with the values it takes), a key given twice."""
    from planner.core.errors import InputError
    from planner.engine.options import options_from_text, with_option_fields

    pairs: list[tuple[str, str]] = []
    for item in items or []:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"{item!r}: expected KEY=VALUE, e.g. {OPTION_FLAG} space=compiled "
                             "(each method's options: planner-cli methods)", field=OPTION_FLAG)
        pairs.append((key, text))
    return with_option_fields(options_from_text(method, pairs), flags or {},
                              OPTION_FLAG + " {key}=...")


def resources_input(value: str | None) -> Path | str | None:
    """What `--resources` names: a resources.json file when one exists (or the value ends in
    .json), else a preset name."""
    if value is None:
        return None
    if value.endswith(".json") or Path(value).is_file():
        return Path(value)
    return value


def resolve_resources(value: str | None) -> Resources | None:
    """The machine `--resources` names (planner.engine.request.resolve_resources)."""
    from planner.engine.request import resolve_resources as resolve

    return resolve(resources_input(value))


# `trace`: sizing the model (planner.cli.trace_cmd.FactoryCall).
FactoryArgsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--arg", metavar="KEY=VALUE",
        help="A keyword argument of the factory, repeatable; the value is a Python literal "
        "(12, 0.1, (8, 16), True), else a string. E.g. planner.zoo:gpt --arg layers=12 "
        "--arg dim=768",
    ),
]
ConfigOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--config", metavar="KEY=VALUE",
        help="A field of the Hugging Face config (any field of the model type's AutoConfig), "
        "repeatable: for hf:MODEL_TYPE, or a factory taking config_overrides "
        "(planner.zoo:hf_gpt2). E.g. hf:gpt2 --config n_layer=12 --config n_embd=768",
    ),
]
BatchSizeOpt = Annotated[
    int | None,
    typer.Option(
        min=1, help="Sequences per step: hf:MODEL_TYPE (default 1), else the factory's "
        "batch_size. E.g. hf:gpt2 --batch-size 8",
    ),
]
SeqLenOpt = Annotated[
    int | None,
    typer.Option(
        min=1, help="Tokens per sequence: hf:MODEL_TYPE (default 128), else the factory's "
        "seq_len or context. E.g. hf:gpt2 --seq-len 1024",
    ),
]


def parse_assignments(items: list[str], flag: str) -> dict[str, Any]:
    """['layers=12', 'act=gelu'] -> {'layers': 12, 'act': 'gelu'}: each value a Python literal
    (ast.literal_eval: 12, 0.1, (8, 16), None, True), else the text as a string."""
    from planner.core.errors import InputError

    parsed: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise InputError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} layers=12")
        if key in parsed:
            raise InputError(f"{flag} {key}: given twice")
        try:
            parsed[key] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed[key] = text.strip()
    return parsed
