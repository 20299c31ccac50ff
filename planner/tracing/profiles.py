"""Device profiles: peak FLOP/s per dtype and memory bandwidth, as JSON data files.

Built-in profiles live in planner/device_profiles/*.json; a user passes a name or a path to
their own file with the same fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from planner.core.errors import InputError


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: dict[str, float]  # dtype -> FLOP/s
    memory_bandwidth_bytes_per_s: float
    flops_efficiency: float = 0.7  # fraction of peak a good kernel reaches
    bandwidth_efficiency: float = 0.8
    op_overhead_ms: float = 0.0  # launch / dispatch cost per op
    memory_bytes: int | None = None
    description: str = ""

    def flops_per_s(self, dtype: str) -> float:
        rate = self.peak_flops.get(dtype) or self.peak_flops.get("float32")
        return (rate or max(self.peak_flops.values())) * self.flops_efficiency

    @property
    def bytes_per_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s * self.bandwidth_efficiency

    def roofline_ms(self, flops: float, bytes_moved: float, dtype: str = "float32") -> float:
        """max(compute time, memory time) plus the per-op overhead, in milliseconds."""
        compute_s = flops / self.flops_per_s(dtype) if flops else 0.0
        memory_s = bytes_moved / self.bytes_per_s if bytes_moved else 0.0
        return 1e3 * max(compute_s, memory_s) + self.op_overhead_ms


def builtin_profiles() -> list[str]:
    folder = resources.files("planner") / "device_profiles"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str) -> DeviceProfile:
    """A built-in profile by name (h100, h200, a100, cpu) or a JSON file."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise InputError(f"--device-profile {name_or_path}: no such file")
        text = path.read_text()
        where = str(path)
    else:
        folder = resources.files("planner") / "device_profiles"
        entry = folder / f"{name_or_path}.json"
        if not entry.is_file():
            known = ", ".join(builtin_profiles())
            raise InputError(
                f"--device-profile {name_or_path}: unknown profile (built-in: {known}; "
                "or give a JSON file)"
            )
        text = entry.read_text()
        where = name_or_path
    try:
        data = json.loads(text)
        return DeviceProfile(
            name=str(data.get("name", where)),
            peak_flops={str(k): float(v) for k, v in data["peak_flops"].items()},
            memory_bandwidth_bytes_per_s=float(data["memory_bandwidth_bytes_per_s"]),
            flops_efficiency=float(data.get("flops_efficiency", 0.7)),
            bandwidth_efficiency=float(data.get("bandwidth_efficiency", 0.8)),
            op_overhead_ms=float(data.get("op_overhead_ms", 0.0)),
            memory_bytes=data.get("memory_bytes"),
            description=str(data.get("description", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(
            f"{where}: not a device profile ({e!s}); needs peak_flops {{dtype: FLOP/s}} and "
            "memory_bandwidth_bytes_per_s"
        ) from e
