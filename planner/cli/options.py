"""Options shared by several commands: the machine a plan is for (`--resources`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from planner.resources import Resources

ResourcesOpt = Annotated[
    str | None,
    typer.Option(
        "--resources",
        "-r",
        help="The machine: a preset (h100-pcie-gen5, a100-80g, ...) or a resources.json file",
    ),
]


def resolve_resources(value: str | None) -> Resources | None:
    """A resources.json path when one exists (or the value ends in .json), else a preset name."""
    if value is None:
        return None
    from planner.resources import load_resources, resources_preset

    if value.endswith(".json") or Path(value).is_file():
        return load_resources(value)
    return resources_preset(value)
