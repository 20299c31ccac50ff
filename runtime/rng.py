"""RNG replay: a random op recomputed by a plan draws exactly the numbers of its first run.

The generator state is recorded right before a random op's first execution; a recomputation
runs inside `fork_rng` with that state restored, so the global stream the rest of the step
(and the next step) sees is untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from planner.tracing.allocator_events import host_memory


class RngStates:
    """Per random op (keyed by name): the generator state before its first execution."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._states: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._states

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        """First call: record the state, run. Later calls: replay from the recorded state."""
        recorded = self._states.get(key)
        if recorded is None:
            # generator states are host tensors (on CUDA too: not device memory); on a CPU
            # run they are kept out of the device count like offloaded copies (5,056 B each)
            with _disable_current_modes(), host_memory():
                cuda_state = torch.cuda.get_rng_state(self.device) if self.cuda else None
                self._states[key] = (torch.get_rng_state(), cuda_state)
            return fn()
        cpu_state, cuda_state = recorded
        devices = [self.device] if self.cuda else []
        fork = torch.random.fork_rng(devices=devices, device_type="cuda" if self.cuda else "cpu")
        with _disable_current_modes(), host_memory():  # fork_rng's copies: host tensors too
            fork.__enter__()
        try:
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, self.device)
            return fn()
        finally:
            with _disable_current_modes(), host_memory():
                fork.__exit__(None, None, None)

    def clear(self) -> None:
        self._states.clear()
