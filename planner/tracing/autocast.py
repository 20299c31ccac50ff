"""Mixed precision under `torch.autocast`: which setting a step is traced with, and checks.

A step traced under autocast (`trace(..., autocast="bf16")`, or `trace` called inside the
user's own `with torch.autocast(...)` block: the same graph) holds every cast explicitly in its
joint graph (`aten._to_copy` nodes, weights stay fp32), so node sizes are the real mixed sizes.
The setting is recorded in `graph.metadata.extra["autocast"]` ("bf16", "fp16" or None).

Replaying such a graph must not be autocast a second time: the runtime runs it with autocast
off, so a planned module gives the same step inside or outside an autocast block of the traced
dtype; inside a block of another dtype (or any autocast block, for a graph traced without
autocast) it refuses with one line (`check_call_autocast`), since the plan computes in the
precision it was traced with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from planner.core.errors import InputError

# setting name -> torch dtype
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {dtype: name for name, dtype in AUTOCAST_DTYPES.items()}


def device_type_of(model: Any, inputs: tuple[Any, ...] = ()) -> str:
    """The device type the step runs on: the first parameter's, else the first input's."""
    params = getattr(model, "parameters", None)
    for p in params() if callable(params) else ():
        return str(p.device.type)
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return str(x.device.type)
    return "cpu"


def ambient_autocast(device_type: str) -> str | None:
    """The setting of the caller's enclosing autocast block for `device_type`, None if off."""
    if not torch.amp.is_autocast_available(device_type):
        return None
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def resolve_autocast(requested: str | None, device_type: str) -> str | None:
    """The setting to trace with: `requested`, else the enclosing autocast block's.

    One line when `requested` is not a setting, or differs from an enclosing block."""
    if requested is not None and requested not in AUTOCAST_DTYPES:
        raise InputError(
            f"--autocast {requested}: use {' or '.join(AUTOCAST_DTYPES)} (or leave it out)"
        )
    ambient = ambient_autocast(device_type)
    if ambient is not None and ambient not in AUTOCAST_DTYPES:
        raise InputError(
            f"autocast: the enclosing torch.autocast block uses {ambient}; "
            f"tracing supports {' and '.join(AUTOCAST_DTYPES)}"
        )
    if requested is not None and ambient is not None and requested != ambient:
        raise InputError(
            f"--autocast {requested}: called inside a torch.autocast({ambient}) block; "
            "trace with the setting the training step runs under"
        )
    return requested if requested is not None else ambient


@contextlib.contextmanager
def autocast_on(setting: str | None, device_type: str) -> Iterator[None]:
    """`torch.autocast(device_type, dtype)` for `setting` (nothing for None); one line when the
    device cannot autocast to that dtype (torch would only warn and run in fp32)."""
    if setting is None:
        yield
        return
    dtype = AUTOCAST_DTYPES[setting]
    if not torch.amp.is_autocast_available(device_type):
        raise InputError(f"--autocast {setting}: no autocast on {device_type}")
    try:
        context = torch.autocast(device_type=device_type, dtype=dtype)
        context.__enter__()
    except RuntimeError as e:  # e.g. a CUDA device without bfloat16
        raise InputError(
            f"--autocast {setting}: {device_type} cannot autocast to {dtype}: {e}"
        ) from None
    try:
        if not torch.is_autocast_enabled(device_type):
            raise InputError(
                f"--autocast {setting}: this torch does not autocast to {dtype} on "
                f"{device_type}"
            )
        yield
    finally:
        context.__exit__(None, None, None)


def autocast_off(device_type: str) -> Any:
    """Autocast disabled for `device_type` (a traced graph already holds its casts)."""
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def recorded_autocast(graph: Any) -> str | None:
    """The autocast setting a graph was traced with (None: without autocast)."""
    metadata = getattr(graph, "metadata", None)
    extra = getattr(metadata, "extra", None) or {}
    value = extra.get("autocast")
    return value if isinstance(value, str) and value else None


def check_call_autocast(recorded: str | None, device_type: str) -> None:
    """Refuse a planned step called inside an autocast block of another precision than the
    one it was traced with (outside any block is fine: the graph holds its casts)."""
    ambient = ambient_autocast(device_type)
    if ambient is None or ambient == recorded:
        return
    traced = f"under autocast {recorded}" if recorded else "without autocast"
    hint = (
        f"call it outside the block or in torch.autocast({recorded})" if recorded
        else f"trace with autocast='{ambient}' (or inside the block) and solve again"
    )
    raise InputError(
        f"autocast: the plan's step was traced {traced}, but runs inside a "
        f"torch.autocast({ambient}) block: {hint}"
    )


def retrace_settings(model: Any, inputs: tuple[Any, ...], graph: Any = None) -> list[str | None]:
    """Autocast settings to re-trace a plan's model with, the likeliest first.

    With the plan's `graph`: its recorded setting (refused now, not at the first step, when the
    caller's autocast block contradicts it). Inside an autocast block: the block's (a trace
    there can only be that). Else without autocast, then each setting: the plan's graph hash
    tells which one it was traced with."""
    device_type = device_type_of(model, inputs)
    if graph is not None:
        recorded = recorded_autocast(graph)
        check_call_autocast(recorded, device_type)
        return [recorded]
    ambient = ambient_autocast(device_type)
    if ambient is not None:
        return [ambient]
    return [None, *AUTOCAST_DTYPES]
