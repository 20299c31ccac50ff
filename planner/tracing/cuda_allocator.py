"""The CUDA caching allocator setting under which a plan's predicted peak is what the device
counts.

The simulator charges each tensor its size rounded to 512 B, as the allocator rounds requests.
By default the allocator reuses a cached block of up to 1 MiB more than a large request without
splitting it, and counts the whole block as allocated: every tensor over 1 MiB may carry up to
1 MiB unsplit (the first GPU runs measured 0.1-2 % over the prediction that way). With
expandable segments it splits whenever 512 B or more remain, so allocated bytes are the rounded
sizes the plan counts. `trace` and `apply` turn the setting on for a CUDA model unless the user
configured the allocator, and warn once when the user's configuration leaves it off.
"""

from __future__ import annotations

import os
import warnings

EXACT_SETTING = "expandable_segments:True"
_ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_state = {"done": False}


class AllocatorWarning(UserWarning):
    """The CUDA allocator's configuration lets the measured peak exceed the plan's."""


def user_allocator_conf() -> str | None:
    """The allocator configuration the user set in the environment, if any."""
    for name in _ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def splits_exactly(conf: str | None) -> bool:
    """Whether an allocator configuration string turns expandable segments on."""
    options = dict(
        part.split(":", 1) for part in (conf or "").replace(" ", "").split(",") if ":" in part
    )
    return options.get("expandable_segments", "").lower() == "true"


def use_exact_allocator() -> bool:
    """Expandable segments on (once per process): True when they are in force."""
    conf = user_allocator_conf()
    if conf is not None:
        if not splits_exactly(conf) and not _state["done"]:
            warnings.warn(
                f"CUDA allocator configured as {conf!r} without expandable segments: a reused "
                "block keeps up to 1 MiB unsplit, so the measured peak may exceed the plan's by "
                f"up to 1 MiB per live tensor over 1 MiB; add {EXACT_SETTING} to {_ENV_VARS[0]}",
                AllocatorWarning, stacklevel=3)
        _state["done"] = True
        return splits_exactly(conf)
    if not _state["done"]:
        import torch

        try:
            torch.cuda.memory._set_allocator_settings(EXACT_SETTING)
        except (RuntimeError, AttributeError) as e:  # an allocator without the option
            warnings.warn(f"CUDA allocator: cannot turn on expandable segments ({e}); the "
                          "measured peak may exceed the plan's by up to 1 MiB per large tensor",
                          AllocatorWarning, stacklevel=3)
            _state["done"] = True
            return False
        _state["done"] = True
    return True
