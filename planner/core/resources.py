"""resources.json: the machine a plan is for (schema version 1), with presets.

The graph describes the workload; `Resources` describes the devices, the host memory available
for offloaded tensors, the links between them and, for pipelines, micro-batches and schedule.
A bare byte budget stays valid: `Resources.for_budget(b)` is one device of b bytes, no host tier.

Documents may name a preset and override fields: `{"preset": "h100-pcie-gen5",
"host_memory_bytes": 274877906944}`; a link field may name a link preset (`"h2d": "pcie-gen4-x16"`).
Both are expanded on validation, so a dumped Resources is always the explicit form.
See docs/resources.md for the presets and their sources.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.core.budget import format_bytes
from planner.core.errors import InputError, describe_validation_error
from planner.core.json_files import read_json

RESOURCES_SCHEMA_VERSION: Literal["1"] = "1"
GiB = 2**30
GB = 10**9

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"]


class Link(BaseModel):
    """One direction of a link: bandwidth and a fixed latency per transfer."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    bandwidth_bytes_per_s: float = Field(
        gt=0, description="Sustained bandwidth in bytes per second, one direction."
    )
    latency_s: float = Field(
        default=0.0, ge=0, description="Fixed cost of one transfer in seconds (setup, launch)."
    )

    def transfer_ms(self, nbytes: int) -> float:
        """Milliseconds to move `nbytes` over this link."""
        return nbytes / self.bandwidth_bytes_per_s * 1e3 + self.latency_s * 1e3

    def __str__(self) -> str:
        return f"{self.bandwidth_bytes_per_s / GB:g} GB/s + {self.latency_s * 1e6:g} us"


def _link(gb_per_s: float, latency_us: float) -> Link:
    return Link(bandwidth_bytes_per_s=gb_per_s * GB, latency_s=latency_us / 1e6)


# Effective per-direction figures (pinned host memory, large copies), not raw signalling rates:
# PCIe Gen4 x16 signals 31.5 GB/s, cudaMemcpy sustains about 25; Gen5 x16 63 GB/s, about 50.
# NVLink 4 (H100 SXM) 900 GB/s in total, 450 each way; NVLink 3 (A100 SXM) 600 / 300;
# NVLink-C2C (Grace Hopper) 900 GB/s in total, 450 each way.
LINK_PRESETS: dict[str, Link] = {
    "pcie-gen4-x16": _link(25, 10),
    "pcie-gen5-x16": _link(50, 10),
    "nvlink3": _link(300, 5),
    "nvlink4": _link(450, 5),
    "nvlink-c2c": _link(450, 5),
}
# Short forms for combined names such as "h100-pcie-gen5" or "a100-80g-gen4".
_LINK_ALIASES = {
    "gen4": "pcie-gen4-x16",
    "gen5": "pcie-gen5-x16",
    "pcie-gen4": "pcie-gen4-x16",
    "pcie-gen5": "pcie-gen5-x16",
    "c2c": "nvlink-c2c",
}


class _Device:
    def __init__(
        self, memory_bytes: int, host_link: str, device_link: str, label: str
    ) -> None:
        self.memory_bytes = memory_bytes
        self.host_link = host_link
        self.device_link = device_link  # "host": the host link's kind (PCIe parts)
        self.label = label


# Datasheet memory; links as the part is usually built (SXM boards on NVLink, PCIe cards over
# PCIe). Host memory is the server's, not the GPU's: presets leave it unset.
_DEVICES: dict[str, _Device] = {
    "h100-sxm": _Device(80 * GiB, "pcie-gen5-x16", "nvlink4", "NVIDIA H100 SXM5 80GB"),
    "h100-pcie": _Device(80 * GiB, "pcie-gen5-x16", "host", "NVIDIA H100 PCIe 80GB"),
    "h200": _Device(141 * GB, "pcie-gen5-x16", "nvlink4", "NVIDIA H200 SXM 141GB"),
    "a100-40g": _Device(40 * GiB, "pcie-gen4-x16", "nvlink3", "NVIDIA A100 SXM4 40GB"),
    "a100-80g": _Device(80 * GiB, "pcie-gen4-x16", "nvlink3", "NVIDIA A100 SXM4 80GB"),
    "gh200": _Device(96 * GB, "nvlink-c2c", "nvlink4", "NVIDIA GH200 96GB (Grace Hopper)"),
}
_DEVICE_ALIASES = {"h100-sxm-80g": "h100-sxm", "h100-pcie-80g": "h100-pcie", "h200-141g": "h200"}


class Resources(BaseModel):
    """The resources.json document: devices, host tier, links and pipeline settings."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_extra=lambda s: _schema_extra(s)
    )

    schema_version: Literal["1"] = RESOURCES_SCHEMA_VERSION
    device_count: int = Field(default=1, ge=1, description="Devices (pipeline ranks) to use.")
    device_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Memory of each device in bytes; null: unbounded here (the budget is given "
        "elsewhere, e.g. --budget).",
    )
    device_name: str = Field(default="", description="Readable device name, e.g. the preset's.")
    host_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Host memory (pinned) for offloaded tensors; null or 0: no host tier.",
    )
    h2d: Link | None = Field(
        default=None,
        description="Host-to-device link (prefetch). Given alone, d2h is taken to be the same.",
    )
    d2h: Link | None = Field(
        default=None,
        description="Device-to-host link (offload). Given alone, h2d is taken to be the same.",
    )
    device_link: Link | None = Field(
        default=None, description="Device-to-device link (pipeline send/recv), one direction."
    )
    microbatches: int = Field(default=1, ge=1, description="Micro-batches per step (pipelines).")
    pipeline_schedule: PipelineSchedule | None = Field(
        default=None,
        description="Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-h2.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        """Expand {"preset": name, ...overrides} and link preset names; mirror one-way links."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "preset" in data:
            name = data.pop("preset")
            if not isinstance(name, str):
                raise ValueError(f"preset: expected a preset name, got {name!r}")
            try:
                base = resources_preset(name).model_dump()
            except InputError as e:  # inside a document: its field is said by the caller
                raise ValueError(e.detail) from None
            data = {**base, **data}
        for key in ("h2d", "d2h", "device_link"):
            if isinstance(data.get(key), str):
                data[key] = _link_preset(data[key], key)
        return data

    @model_validator(mode="after")
    def _check(self) -> Resources:
        # One direction given, the other omitted: links are symmetric (PCIe, NVLink).
        if self.d2h is None and self.h2d is not None and "d2h" not in self.model_fields_set:
            object.__setattr__(self, "d2h", self.h2d)
        if self.h2d is None and self.d2h is not None and "h2d" not in self.model_fields_set:
            object.__setattr__(self, "h2d", self.d2h)
        if self.host_memory_bytes and (self.h2d is None or self.d2h is None):
            raise ValueError(
                "host_memory_bytes: a host tier needs h2d and d2h links (give a link or a preset, "
                "e.g. \"h2d\": \"pcie-gen5-x16\")"
            )
        return self

    # -- derived views ----------------------------------------------------------------------
    @property
    def has_host_tier(self) -> bool:
        return bool(self.host_memory_bytes)

    def require_device_memory_bytes(self, where: str = "resources") -> int:
        """Device memory, or an InputError where a plan needs one and none was named."""
        if self.device_memory_bytes is None:
            raise InputError(
                f"no device memory: set device_memory_bytes, a device preset "
                f"({', '.join(_DEVICES)}) or a budget", field=where,
            )
        return self.device_memory_bytes

    @classmethod
    def for_budget(cls, budget_bytes: int) -> Resources:
        """One device of `budget_bytes`, no host tier: what a bare budget means."""
        return cls(device_memory_bytes=budget_bytes)

    def __str__(self) -> str:
        dev = self.device_name or "device"
        mem = "unbounded" if self.device_memory_bytes is None else _bytes(self.device_memory_bytes)
        parts = [f"{self.device_count} x {dev} ({mem})"]
        if self.has_host_tier:
            parts.append(f"host {_bytes(self.host_memory_bytes or 0)}")
        if self.h2d is not None:
            parts.append(f"h2d {self.h2d}, d2h {self.d2h}")
        if self.device_link is not None:
            parts.append(f"device link {self.device_link}")
        if self.pipeline_schedule is not None or self.microbatches > 1:
            parts.append(f"{self.microbatches} micro-batches, {self.pipeline_schedule or '-'}")
        return "; ".join(parts)


def _bytes(n: int) -> str:
    return format_bytes(n)


def _link_preset(name: str, field: str) -> Link:
    key = _LINK_ALIASES.get(name, name)
    if key not in LINK_PRESETS:
        raise ValueError(
            f"{field}: unknown link preset {name!r}; use one of {', '.join(LINK_PRESETS)}"
        )
    return LINK_PRESETS[key]


def _device_resources(device: str, host_link: str | None) -> Resources:
    d = _DEVICES[device]
    host = LINK_PRESETS[host_link or d.host_link]
    peer = host if d.device_link == "host" else LINK_PRESETS[d.device_link]
    return Resources(
        device_memory_bytes=d.memory_bytes, device_name=device, h2d=host, d2h=host,
        device_link=peer,
    )


def resources_preset(name: str) -> Resources:
    """A device preset ("h100-sxm"), optionally with a host link ("h100-pcie-gen5",
    "a100-80g-gen4", "h100-sxm-pcie-gen4-x16"). InputError listing valid names otherwise."""
    key = _DEVICE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in _DEVICES:
        return _device_resources(key, None)
    for device in sorted(_DEVICES, key=len, reverse=True):
        if key.startswith(device + "-"):
            suffix = key[len(device) + 1 :]
            link = _LINK_ALIASES.get(suffix, suffix)
            if link in LINK_PRESETS:
                res = _device_resources(device, link)
                return res.model_copy(update={"device_name": key})
    raise InputError(
        f"preset {name!r}: unknown; use a device ({', '.join(_DEVICES)}), optionally "
        f"with a host link suffix ({', '.join(sorted(_LINK_ALIASES))} or a link preset "
        f"{', '.join(LINK_PRESETS)}), e.g. h100-pcie-gen5", field="resources",
    )


def preset_names() -> list[str]:
    """Every device preset, and each with each short PCIe / C2C link suffix."""
    out = list(_DEVICES)
    out += [f"{d}-{s}" for d in _DEVICES for s in ("gen4", "gen5", "c2c")]
    return out


# name -> Resources for each device preset (its natural links); combined names via resources_preset
PRESETS: dict[str, Resources] = {name: _device_resources(name, None) for name in _DEVICES}


def resources_from_dict(data: Any, where: str = "resources") -> Resources:
    """A resources.json document (or a bare preset name) as Resources; InputError naming the
    field otherwise."""
    if isinstance(data, str):
        try:
            return resources_preset(data)
        except InputError as e:
            raise InputError(e.detail, field=where) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object (resources.json) or a preset name", field=where)
    try:
        return Resources.model_validate(data)
    except ValidationError as e:  # an unknown preset inside the document lands here too
        raise InputError(describe_validation_error(e, data), field=where) from None


def load_resources(path: str | Path) -> Resources:
    """A resources.json file; it must name its device (a preset, device_memory_bytes or
    device_name): a file describing a machine without one is a mistake, not a bare budget."""
    resources = resources_from_dict(read_json(path), where=str(path))
    if resources.device_memory_bytes is None and not resources.device_name:
        raise InputError(
            f"{path}: names no device: give a preset (e.g. \"preset\": \"h100-pcie-gen5\"; "
            f"devices: {', '.join(_DEVICES)}), device_memory_bytes or device_name"
        )
    return resources


def _schema_extra(schema: dict[str, Any]) -> None:
    """Document the input shorthands the validator expands (a preset, link preset names)."""
    props = schema.setdefault("properties", {})
    props["preset"] = {
        "type": "string",
        "description": "Start from this preset (e.g. 'h100-pcie-gen5'); the other fields "
        f"override it. Devices: {', '.join(_DEVICES)}; link suffixes: -gen4, -gen5, -c2c.",
    }
    for key in ("h2d", "d2h", "device_link"):
        if key in props and "anyOf" in props[key]:
            props[key]["anyOf"].append({"type": "string", "enum": sorted(LINK_PRESETS)})
