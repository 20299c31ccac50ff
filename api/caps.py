"""Caps on what one request may ask for: devices, micro-batches, data-parallel degree, sweep
length and byte counts far above any real machine are refused at submission (422 naming the
field), before a solver, the simulator or the store sees them. Body fields state them in the
OpenAPI schema (Field(le=...)); the resources document's fields are checked after it is
parsed (a preset with overrides, numbers as strings).

Why these numbers: the largest training jobs run on tens of thousands of GPUs and a pipeline
step has at most a few thousand micro-batches, while the pipeline schedule (and its plan.json)
grows with devices x micro-batches: 60,000 micro-batches made plans of hundreds of MB.

Method options that size a solver's tables (OPTION_CAPS) are capped here too, whatever the
method's own spec allows: Rotor's DP holds (segments + 1)^2 x (slots + 1) entries twice (324 MB
at its defaults of 200 and 500), so `"slots": 10**12` was a solver process that died of memory.
"""

from __future__ import annotations

from typing import Any

from planner.core.budget import MAX_BUDGET_BYTES
from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.resources import Resources

MAX_DEVICES = 65_536
MAX_MICROBATCHES = 4_096
MAX_DATA_PARALLEL = 65_536
MAX_SWEEP_BUDGETS = 64
MAX_BYTES = MAX_BUDGET_BYTES  # 2**60 (1 EiB): device memory, host memory, budgets

# resources.json fields -> their cap.
RESOURCE_CAPS: dict[str, int] = {
    "device_count": MAX_DEVICES,
    "microbatches": MAX_MICROBATCHES,
    "device_memory_bytes": MAX_BYTES,
    "host_memory_bytes": MAX_BYTES,
}
# Integer options (of any built-in method that takes them) -> this server's cap: about 4x and
# 2x the defaults (rotor's 500 slots, 200 segments; offload's 200 slots), so the worst table
# stays near 5 GB; refine's binary search needs 3 runs, 16 is plenty.
OPTION_CAPS: dict[str, int] = {"slots": 2_000, "segments": 400, "refine": 16}


def option_cap(name: str, kind: str, own_maximum: int | None) -> int | None:
    """The largest value this server takes for an option: its own maximum, or OPTION_CAPS'."""
    cap = OPTION_CAPS.get(name) if kind == "int" else None
    if cap is None or own_maximum is None:
        return own_maximum if cap is None else cap
    return min(cap, own_maximum)


def check_option_caps(method: str, options: dict[str, Any], where: str = "options") -> None:
    """InputError naming the first option of built-in `method` over this server's cap (a
    plugin's options are its own business)."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    for option in spec.option_specs() if spec is not None else ():
        cap = option_cap(option.name, option.kind, option.maximum)
        value = options.get(option.name)
        if (cap is not None and isinstance(value, int | float) and not isinstance(value, bool)
                and value > cap):
            raise InputError(f"{value} is over this server's cap of {cap} (the solver's tables "
                             "grow with it); give at most that", field=f"{where}.{option.name}")


def check_resource_caps(resources: Resources | None, where: str = "resources") -> None:
    """InputError naming the first field of `resources` over its cap
    (`resources.device_count`, which the partitions route says as its own `devices`)."""
    if resources is None:
        return
    for name, cap in RESOURCE_CAPS.items():
        value = getattr(resources, name)
        if value is not None and value > cap:
            raise InputError(f"{value} is over this server's cap of {cap}; no real machine "
                             "is that large", field=f"{where}.{name}")


def check_graph_caps(graph: Graph, where: str = "graph") -> None:
    """InputError when the graph's model state names a data-parallel degree over the cap."""
    state = graph.model_state
    if state is not None and state.data_parallel_degree > MAX_DATA_PARALLEL:
        raise InputError(f"{state.data_parallel_degree} is over this server's cap of "
                         f"{MAX_DATA_PARALLEL}", field=f"{where}.model_state.data_parallel_degree")
