"""The request's fields, one table for every entry point.

Each field of a plan request (`planner.engine.request.resolve_request`) is written once here:
its name (errors name it: `InputError.field`), the CLI's flag, the REST body's key, the Python
keyword of the agent (`planner.runtime.plan_for`) and the trainer callbacks, its default and its
help. The CLI's options (`planner.cli.options`), the REST schema's descriptions
(`planner.api.schemas`) and the agent's error wording read them from here, so a field is
spelled, defaulted and explained one way; each entry point only says where it differs (the
service caps the time limit, `sweep` takes `--budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.budget import BUDGET_GRAMMAR
from planner.core.limits import (
    DEFAULT_PIPELINE_TIME_LIMIT_S,
    DEFAULT_TIME_LIMIT_S,
    MAX_TIME_LIMIT_S,
)

__all__ = ["REQUEST_FIELDS", "RequestField", "agent_words", "cli_words", "request_field"]


@dataclass(frozen=True)
class RequestField:
    """One field of a plan request and how each entry point writes it (None: it has none)."""

    name: str  # as resolve_request and its errors name it
    flag: str | None  # the CLI's
    json_key: str | None  # the REST request body's
    keyword: str | None  # plan_for's and the trainer callbacks'
    default: str  # in words: what an entry point that is not given the field does
    help: str  # one sentence, the same in --help and the OpenAPI document

    def text(self) -> str:
        """Help and default as one line (the CLI's help, the schema's description)."""
        return f"{self.help}; default: {self.default}"


REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "budget", "--budget", "budget", "budget",
        "the device memory of the resources",
        f"Device memory for the plan: {BUDGET_GRAMMAR}; a number with a point above 1 (1.5, "
        "1e9) is refused",
    ),
    RequestField(
        "method", "--method", "method", "method", "auto",
        "The planning method: `planner-cli methods`, GET /v1/methods",
    ),
    RequestField(
        "options", "--option", "options", "options", "none (each option's own default)",
        "The method's options, typed as its spec says (`planner-cli methods` lists each "
        "method's options and values); an unknown key or a bad value is refused before solving",
    ),
    RequestField(  # plan_for plans for the device it runs on
        "resources", "--resources", "resources", None, "none: a bare budget",
        "The machine: a preset name (h100-pcie-gen5, a100-80g, ...) or a resources.json "
        "document (`planner-cli schema resources`); without a budget its device memory is the "
        "budget",
    ),
    RequestField(
        "host_memory", "--host-memory", None, None, "the resources' host memory",
        "Host memory for offloaded tensors, e.g. 256GiB (bytes only; sets host_memory_bytes of "
        "the resources)",
    ),
    RequestField(
        "time_limit", "--time-limit", "time_limit", "time_limit_s",
        f"{DEFAULT_TIME_LIMIT_S:g} s (a pipeline method: {DEFAULT_PIPELINE_TIME_LIMIT_S:g} s)",
        f"Seconds for the solver (finite, more than 0, at most {MAX_TIME_LIMIT_S:g})",
    ),
    RequestField(
        "threads", "--threads", None, None, "2 (the service: its solver_threads)",
        "Threads of the solver",
    ),
    RequestField("seed", "--seed", None, None, "0", "Seed of the methods that search at random"),
)
_BY_NAME = {f.name: f for f in REQUEST_FIELDS}


def request_field(name: str) -> RequestField:
    return _BY_NAME[name]


def cli_words() -> dict[str, str]:
    """Request field -> the CLI flag that gives it."""
    return {f.name: f.flag for f in REQUEST_FIELDS if f.flag is not None}


def agent_words() -> dict[str, str]:
    """Request field -> the agent's keyword, where the two differ (`time_limit_s`)."""
    return {f.name: f.keyword for f in REQUEST_FIELDS
            if f.keyword is not None and f.keyword != f.name}
