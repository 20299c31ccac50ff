"""planner-cli in this process (the pipeline commands registered): exit code, stdout, stderr."""

from __future__ import annotations

import sys

import pytest

from planner.cli import main as cli_main
from planner.cli import pipeline_cmds


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    if not any(c.name == "partition" for c in cli_main.app.registered_commands):
        pipeline_cmds.register(cli_main.app)
    old = sys.argv
    sys.argv = ["planner-cli", *map(str, args)]
    try:
        cli_main.main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err
