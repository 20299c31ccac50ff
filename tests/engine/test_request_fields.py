"""The one table of request fields (planner.engine.request_fields): every entry point spells,
defaults and explains a field as the table says — the CLI's flags and help, the REST schema's
descriptions, plan_for's keywords and the error words of each."""

from __future__ import annotations

import inspect
from typing import Any

import typer.main

from planner.cli.main import app
from planner.cli.options import CLI_FIELDS, in_cli_words
from planner.core.errors import InputError
from planner.engine.request_fields import REQUEST_FIELDS, agent_words, request_field


def _params(command: str) -> dict[str, Any]:
    group: Any = typer.main.get_command(app)
    cmd = group.commands[command]
    return {opt: p for p in cmd.params for opt in getattr(p, "opts", [])}


def test_solve_takes_every_field_with_a_flag_and_the_tables_help() -> None:
    params = _params("solve")
    for field in REQUEST_FIELDS:
        if field.flag is None:
            continue
        assert field.flag in params, field.flag
        help_text = getattr(params[field.flag], "help", "") or ""
        assert help_text.startswith(field.help[:40]), (field.flag, help_text)


def test_submit_and_sweep_take_the_request_flags_they_forward() -> None:
    for command, flags in (("submit", ("--method", "--option", "--resources", "--time-limit")),
                           ("sweep", ("--method", "--option", "--resources", "--host-memory",
                                      "--time-limit"))):
        params = _params(command)
        for flag in flags:
            assert flag in params, (command, flag)


def test_cli_errors_name_the_tables_flags() -> None:
    for field in REQUEST_FIELDS:
        if field.flag is None or field.name == "options":
            continue
        assert CLI_FIELDS[field.name] == field.flag
        assert in_cli_words(InputError("bad", field=field.name)).field == field.flag
    assert in_cli_words(InputError("bad", field="options.slots")).field == "--option slots"


def test_rest_descriptions_start_with_the_tables_help() -> None:
    from planner.api.routers.partitions import PartitionRequest
    from planner.api.schemas import PlanRequest, SweepRequest

    for model in (PlanRequest, SweepRequest):
        props = model.model_json_schema()["properties"]
        for field in REQUEST_FIELDS:
            if field.json_key is None or field.json_key not in props:
                continue
            if field.name == "budget":  # REST says how JSON types read (integer = bytes)
                continue
            description = props[field.json_key].get("description", "")
            assert description.startswith(field.help), (model.__name__, field.json_key)
    assert "options" in PartitionRequest.model_json_schema()["properties"]


def test_plan_for_takes_the_tables_keywords_and_its_errors_use_them() -> None:
    from planner.runtime.agent import plan_for

    signature = inspect.signature(plan_for)
    for field in REQUEST_FIELDS:
        if field.keyword is not None:
            assert field.keyword in signature.parameters, field.keyword
    assert agent_words() == {"time_limit": "time_limit_s"}
    assert request_field("method").default == signature.parameters["method"].default
