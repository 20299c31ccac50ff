"""Host buffers for offloaded storages: a pool reused by size, with host-byte accounting.

On CUDA the buffers are pinned (page-locked), so that device-to-host and host-to-device copies
run asynchronously on their copy streams; pinning is slow (a `cudaHostAlloc` per buffer), hence
the pool: a buffer released by a drop is handed to the next offload of the same size, across
steps. On CPU (CI) the buffers are ordinary tensors allocated outside any active
TorchDispatchMode, so a step's storage tracker (`planner.runtime.measure`) sees them as what they
are:
host memory, not device memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from planner.tracing.allocator_events import host_memory


@dataclass(frozen=True)
class HostPoolStats:
    in_use_bytes: int  # held by host copies now
    peak_in_use_bytes: int  # most held at once since the last reset (the simulator's host peak)
    allocated_bytes: int  # buffers the pool owns (in use or free)
    allocations: int  # buffers created since the pool was made (a reused one is not counted)


class HostPool:
    """Flat uint8 host buffers keyed by byte size.

    A buffer comes back with the events of the copies that still use it (`give(buf, after)`):
    the pool's accounting follows the plan's order (a drop releases at once, as the simulator
    releases a host copy at its `D`), and whoever takes the buffer next makes its copy stream
    wait for those events before writing it (`take` returns them)."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._free: dict[int, list[tuple[torch.Tensor, tuple[Any, ...]]]] = {}
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0
        self.allocated_bytes = 0
        self.allocations = 0

    def take(self, nbytes: int) -> tuple[torch.Tensor, tuple[Any, ...]]:
        """A buffer of exactly `nbytes` bytes (reused when one of that size is free) and the
        events of copies still using it, to wait for before writing it."""
        bucket = self._free.get(nbytes)
        if bucket:
            buf, after = bucket.pop()
        else:
            # host memory: invisible to device trackers and to the allocator-event count
            with _disable_current_modes(), host_memory():
                buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pinned)
            after = ()
            self.allocated_bytes += nbytes
            self.allocations += 1
        self.in_use_bytes += nbytes
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
        return buf, after

    def give(self, buf: torch.Tensor, after: tuple[Any, ...] = ()) -> None:
        """Return a buffer; `after`: events of copies that may still use it."""
        nbytes = int(buf.numel())
        self.in_use_bytes -= nbytes
        self._free.setdefault(nbytes, []).append((buf, after))

    def reset_peak(self) -> None:
        self.peak_in_use_bytes = self.in_use_bytes

    def stats(self) -> HostPoolStats:
        return HostPoolStats(
            self.in_use_bytes, self.peak_in_use_bytes, self.allocated_bytes, self.allocations
        )

    def clear(self) -> None:
        """Release the free buffers (those in use stay with their copies)."""
        for bucket in self._free.values():
            self.allocated_bytes -= sum(int(b.numel()) for b, _ in bucket)
        self._free.clear()
