"""/v1/methods: the planning methods this server runs, each as its spec says (what it does, the
plans it returns, its options with their types, defaults and help); plugins by target. And
/v1/resources/presets: the machines a request may name by preset (`"resources": "h100-sxm"`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from planner.api.caps import option_cap
from planner.api.deps import AUTH_ERRORS, error_responses

router = APIRouter(prefix="/v1")


class MethodOption(BaseModel):
    name: str
    type: str = Field(description="bool, int or choice")
    default: Any = None
    help: str = ""
    choices: list[str] = Field(default_factory=list)
    minimum: int | None = None
    maximum: int | None = None
    nullable: bool = Field(default=False, description="null is a value of its own")


class MethodInfo(BaseModel):
    name: str
    summary: str = ""
    plan_kinds: list[str] = Field(default_factory=list,
                                  description="remat, offload, remat+offload, pipeline, fsdp")
    needs_host_tier: bool = False
    claims_bounds: bool = Field(default=False, description="reports a proven lower bound")
    options: list[MethodOption] = Field(default_factory=list)
    plugin: str | None = Field(default=None, description="a plugin's module:function")


@router.get("/methods", response_model=list[MethodInfo], responses=error_responses(*AUTH_ERRORS),
            summary="The planning methods, each with its options")
def list_methods() -> list[dict[str, Any]]:
    from planner.engine.registry import describe_methods

    methods: list[dict[str, Any]] = describe_methods()
    for method in methods:  # each option's maximum as this server takes it (caps.OPTION_CAPS)
        for option in method.get("options") or ():
            option["maximum"] = option_cap(option["name"], option["type"], option["maximum"])
    return methods


class ResourcePreset(BaseModel):
    name: str = Field(description="Give it as resources (or resources.preset, with overrides "
                      "such as host_memory_bytes).")
    device_memory_bytes: int
    summary: str = Field(description="The machine in one line: memory and links.")
    resources: dict[str, Any] = Field(description="The resources.json it expands to; host memory "
                                      "is the server's, not the device's: presets leave it unset.")


@router.get("/resources/presets", response_model=list[ResourcePreset],
            responses=error_responses(*AUTH_ERRORS), summary="The machines named by preset")
def list_resource_presets() -> list[ResourcePreset]:
    from planner.core.resources import preset_names, resources_preset

    presets = []
    for name in preset_names():
        machine = resources_preset(name)
        presets.append(ResourcePreset(
            name=name, device_memory_bytes=machine.device_memory_bytes or 0,
            summary=str(machine), resources=machine.model_dump(mode="json")))
    return presets
