"""Saved tensors on the host for an offloaded unit of a pipeline stage
(planner.runtime.pipeline_units): each tensor autograd saves inside is copied to host memory
once (pinned on CUDA) and back when the backward unpacks it, as
`torch.autograd.graph.save_on_cpu` does; `HostMemory` counts the host bytes a rank holds.

Measuring on CPU, where device and host are one memory: host buffers are allocated outside any
active TorchDispatchMode (as planner.runtime.offload_pool does), so a step's storage tracker
counts them as what they are, host memory, and `HostMemory` counts them instead (in use and
peak, released when autograd frees them).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes

from planner.runtime.unit_ops import CallOutputs
from planner.tracing.allocator_events import host_memory


class HostMemory:
    """Host bytes held by one rank's offloaded saved tensors: now and the most at once."""

    def __init__(self) -> None:
        self.in_use_bytes = 0
        self.peak_bytes = 0

    def take(self, nbytes: int) -> None:
        self.in_use_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)

    def release(self, nbytes: int) -> None:
        self.in_use_bytes -= nbytes

    def reset_peak(self) -> None:
        self.peak_bytes = self.in_use_bytes


class _HostCopy:
    """One saved tensor's host copy, shared by every save of the same tensor in a unit call;
    its device copy is made once in the backward and shared while alive."""

    def __init__(self, t: torch.Tensor, host: HostMemory) -> None:
        self.device = t.device
        pinned = t.device.type == "cuda"
        # host memory: invisible to the step's device tracker and allocator count
        with _disable_current_modes(), host_memory():
            self.buffer = torch.empty(t.size(), dtype=t.dtype, pin_memory=pinned)
            self.buffer.copy_(t, non_blocking=pinned)
        nbytes = self.buffer.numel() * self.buffer.element_size()
        host.take(nbytes)
        weakref.finalize(self.buffer, host.release, nbytes)  # counted until autograd frees it
        self.unpacked: Callable[[], torch.Tensor | None] = lambda: None

    def unpack(self) -> torch.Tensor:
        out = self.unpacked()
        if out is None:
            if self.device.type == "cpu":  # a fresh "device" tensor, under the step's tracker
                out = self.buffer.clone()
            else:
                out = self.buffer.to(self.device, non_blocking=True)
            self.unpacked = weakref.ref(out)
        return out


def _unpack(packed: Any) -> torch.Tensor:
    return packed.unpack() if isinstance(packed, _HostCopy) else packed


@contextmanager
def offloaded(host: HostMemory, unit: nn.Module,
              only: CallOutputs | None = None) -> Iterator[None]:
    """Saved tensors of what runs inside go to host memory, once per tensor (the unit's
    parameters, meta and empty tensors stay: copying them frees nothing); with `only`, just
    the saved tensors on the storages it records (its named calls' outputs)."""
    kept = frozenset(p.untyped_storage().data_ptr()
                     for p in (*unit.parameters(), *unit.buffers()))
    # a saved tensor's identity -> (its storage, its copy); the address may be reused once the
    # storage is freed, so a hit counts only while that storage lives
    copies: dict[tuple[Any, ...], tuple[StorageWeakRef, _HostCopy]] = {}

    def pack(t: torch.Tensor) -> Any:
        if t.is_meta or t.layout != torch.strided or t.numel() == 0:
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr in kept or (only is not None and not only.holds(t)):
            return t
        key = (ptr, t.storage_offset(), tuple(t.size()), t.stride(), t.dtype, t._version)
        known = copies.get(key)
        if known is None or known[0].expired():
            known = copies[key] = (StorageWeakRef(t.untyped_storage()), _HostCopy(t, host))
        return known[1]

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        if only is None:
            yield
        else:
            with only:
                yield


def drop_saved(t: torch.Tensor) -> None:
    return None


def never_unpacked(packed: Any) -> torch.Tensor:
    raise RuntimeError("planner.runtime.pipeline_units: a dropped saved tensor was unpacked")
