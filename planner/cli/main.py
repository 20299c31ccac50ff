"""Entry point of planner-cli. Bad input exits 2 with one line, never a traceback; the request
field at fault is said as the flag that gives it (`budget` -> `--budget`)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated, Any

import typer

from planner.core.errors import InputError, NoPlanFits

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_PLAN = 0, 2, 3

# Each module defines register(app); heavy imports stay inside the commands.
COMMAND_MODULES = (
    "planner.cli.graph_cmds",
    "planner.cli.solve_cmds",
    "planner.cli.trace_cmd",
    "planner.cli.remat_cmds",
    "planner.cli.service_cmds",
    "planner.cli.pipeline_cmds",
)

# Piped or redirected, --help is plain text at full width (one line an option, no boxes cut at
# 80 columns), for grep and for logs; on a terminal typer's rich panels.
PIPED_HELP_WIDTH = 1000
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
# Libraries that log every HTTP request at INFO (the service client's polls): warnings only.
QUIET_LOGGERS = ("httpx", "httpcore")

app = typer.Typer(
    name="planner-cli",
    help="Memory planner for training: plans that fit a memory budget at the least extra compute."
    "\n\nLong commands show progress on stderr: a live line on a terminal, else a line every "
    "PLANNER_PROGRESS_EVERY_S seconds (default 5); stdout keeps the answer (--json for tools).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings=CONTEXT_SETTINGS,
)
for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"planner-cli {version('planner')}"
    except PackageNotFoundError:  # a source tree that was never installed
        return "planner-cli (not installed: no version)"


def _print_version(value: bool) -> None:
    if value:
        print(version_text())
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """The options before a command (--version)."""


def quiet_http_logs() -> None:
    """httpx logs each request at INFO: a client polling a job would fill a log with them."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _plain_help_when_piped() -> None:
    if not sys.stdout.isatty():
        app.rich_markup_mode = None
        CONTEXT_SETTINGS.update(max_content_width=PIPED_HELP_WIDTH,
                                terminal_width=PIPED_HELP_WIDTH)


def main() -> None:
    """Run the CLI; a process that abandoned a method at its time limit (its thread may still
    be inside a solver) exits at once instead of waiting for that thread."""
    code = 0
    try:
        _main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    # Only a command that ran a method can have abandoned one; the others (methods, info,
    # --help) need not import the engine's deadline module (and the graph code under it).
    deadline = sys.modules.get("planner.engine.deadline")
    if deadline is not None and deadline.abandoned_methods():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _main() -> None:
    quiet_http_logs()
    _plain_help_when_piped()
    try:
        code = app(standalone_mode=False)
    except InputError as e:
        from planner.cli.options import in_cli_words

        print(f"error: {in_cli_words(e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except NoPlanFits as e:
        print(f"no plan fits: {e}", file=sys.stderr)
        sys.exit(EXIT_NO_PLAN)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # usage errors (missing option, bad value, unknown command)
        if not isinstance(e, _usage_error_types()):
            raise
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())  # `planner-cli` alone: the help, as no_args_is_help promises
            sys.exit(EXIT_OK)
        format_message = getattr(e, "format_message", None)
        message = format_message() if callable(format_message) else str(e)
        # typer checks choices with pydantic, whose messages start "Value error, ".
        message = str(message).replace("Value error, ", "")
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        print(f"error: {' '.join(str(message).split())}{hint}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    # Without standalone mode click returns a command's `typer.Exit(code)` instead of exiting.
    if isinstance(code, int) and not isinstance(code, bool) and code:
        sys.exit(code)


def _usage_error_types() -> tuple[type[Exception], ...]:
    """Typer >= 0.2x raises its own copy of click's exceptions; older ones raise click's."""
    types: list[type[Exception]] = []
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        types.append(vendored)
    try:
        import click
    except ImportError:  # pragma: no cover - click is optional with recent typer
        pass
    else:
        types.append(click.ClickException)
    return tuple(types)


if __name__ == "__main__":
    main()
