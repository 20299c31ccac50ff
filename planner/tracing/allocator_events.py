"""The allocator's own count of a step's memory: an independent check on `StorageTracker`.

CPU: torch.profiler's allocator memory events (`profile_memory=True`): one record per
allocation and free of c10's CPU allocator on every thread the profiler follows (the caller's,
autograd's), op temporaries and storages no dispatched op returns included. Summed in time
order they give the bytes the block allocated and still holds after every allocation, so the
peak is exact to the byte. The raw records are read (the profiler's event tree), not
FunctionEvents, which fold the allocations inside an op into the op. A free of memory
allocated before the block has no record (the profiler does not know its size; c10 warns
once): like the live-storage tracker, the count leaves out what existed before. On CPU an
offloaded tensor's host copy is the same allocator's memory: allocations made inside
`host_memory()` (planner.runtime.unit_offload) and their frees are left out, as the tracker
leaves them out.

CUDA: the caching allocator's `max_memory_allocated` above `memory_allocated` at the start
(a block freed with streams pending counts until the allocator frees it).

    with allocator_events() as events:
        step()
    events.peak_bytes                       # or measure_allocator_peak(step).peak_bytes
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _EventType

__all__ = ["HOST_SCOPE", "AllocatorEvents", "AllocatorPeak", "allocator_events", "host_memory",
           "measure_allocator_peak", "peak_of_deltas"]

HOST_SCOPE = "planner::host_memory"  # the profiler range `host_memory()` opens


@dataclass(frozen=True)
class AllocatorPeak:
    peak_bytes: int  # the most bytes live at once above what was live at the start (>= 0)
    end_bytes: int  # still live at the end above the start (CUDA: < 0 if older memory was freed)
    device: str = "cpu"
    events: int = 0  # allocator records read (CPU; 0 on CUDA)
    result: Any = None  # what the measured callable returned (measure_allocator_peak)


class AllocatorEvents:
    """What `allocator_events()` yields: `peak` is set when the block exits."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak: AllocatorPeak | None = None

    @property
    def peak_bytes(self) -> int:
        if self.peak is None:
            raise RuntimeError("allocator_events: read the peak after the with block")
        return self.peak.peak_bytes

    @property
    def end_bytes(self) -> int:
        if self.peak is None:
            raise RuntimeError("allocator_events: read the end bytes after the with block")
        return self.peak.end_bytes


def peak_of_deltas(deltas_bytes: Iterable[int]) -> tuple[int, int]:
    """(peak, end) of the running sum of allocation deltas (+ allocate, - free), peak >= 0."""
    live = peak = 0
    for delta in deltas_bytes:
        live += delta
        peak = max(peak, live)
    return peak, live


@contextlib.contextmanager
def host_memory() -> Iterator[None]:
    """Allocations inside are host memory (an offloaded tensor's copy): on CPU, where device
    and host are one allocator, `allocator_events` leaves them and their frees out."""
    with torch.profiler.record_function(HOST_SCOPE):
        yield


@contextlib.contextmanager
def allocator_events(device: str | torch.device = "cpu") -> Iterator[AllocatorEvents]:
    """Count the allocator's live bytes over the block (see the module docstring)."""
    dev = torch.device(device)
    events = AllocatorEvents(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        yield events
        torch.cuda.synchronize(dev)
        events.peak = AllocatorPeak(torch.cuda.max_memory_allocated(dev) - base,
                                    torch.cuda.memory_allocated(dev) - base, str(dev))
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield events
    records = _cpu_allocations(prof.profiler.kineto_results.experimental_event_tree())
    peak, end = peak_of_deltas(delta for _, delta in records)
    events.peak = AllocatorPeak(peak, end, "cpu", events=len(records))


def _cpu_allocations(roots: list[Any]) -> list[tuple[int, int]]:
    """(time ns, +bytes allocated / -bytes freed) of the CPU allocator, in time order, host
    memory (`host_memory()` scopes, then the frees of what they allocated) left out."""
    found: list[tuple[int, int, int, bool]] = []  # (time, ptr, delta, inside a host scope)
    stack = [(e, False) for e in roots]
    while stack:
        event, host = stack.pop()
        kind, fields = event.typed
        if kind == _EventType.Allocation:
            if fields.device.type == "cpu":  # pinned or device memory: not this count
                found.append((event.start_time_ns, fields.ptr, fields.alloc_size, host))
            continue
        host = host or event.name == HOST_SCOPE
        stack.extend((child, host) for child in event.children)
    found.sort(key=lambda r: r[0])
    host_ptrs: set[int] = set()
    own_ptrs: set[int] = set()  # allocated inside the block, not as host memory, still live
    out = []
    for time_ns, ptr, delta, host in found:
        if host and delta > 0:
            host_ptrs.add(ptr)
        elif delta < 0 and ptr in host_ptrs:
            host_ptrs.discard(ptr)
        elif delta > 0:
            own_ptrs.add(ptr)
            out.append((time_ns, delta))
        elif ptr in own_ptrs:
            own_ptrs.discard(ptr)
            out.append((time_ns, delta))
        # else: a free of memory allocated before the block. The profiler knows its size
        # when an earlier profiled block allocated it (a tensor kept across blocks and freed,
        # or collected, inside this one): left out, as the docstring says, not subtracted.
    return out


def measure_allocator_peak(fn: Callable[[], Any],
                           device: str | torch.device = "cpu") -> AllocatorPeak:
    """Run `fn()` and return the allocator's peak above the start, with what fn returned."""
    with allocator_events(device) as events:
        result = fn()
    assert events.peak is not None
    p = events.peak
    return AllocatorPeak(p.peak_bytes, p.end_bytes, p.device, p.events, result)
