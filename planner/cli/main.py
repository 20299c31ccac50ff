"""Entry point of planner-cli. Bad input exits 2 with one line, never a traceback."""

from __future__ import annotations

import importlib
import sys

import typer

from planner.errors import InputError, NoPlanFits

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_PLAN = 0, 2, 3

# Each module defines register(app); heavy imports stay inside the commands.
COMMAND_MODULES = (
    "planner.cli.graph_cmds",
    "planner.cli.solve_cmds",
)

app = typer.Typer(
    name="planner-cli",
    help="Memory planner for training: plans that fit a memory budget at the least extra compute.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    try:
        app(standalone_mode=False)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
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
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(EXIT_BAD_INPUT)
        raise


if __name__ == "__main__":
    main()
