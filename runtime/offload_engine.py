"""The copies of one planned step: `O` offload, `P` prefetch, `D` drop, as the event simulator
times them (planner/sim/copy_streams.py).

On CUDA: one copy stream per direction. `O v` records an event on the compute stream (v's
producer ran before it) and the device-to-host stream waits for it before copying v's storages
into pinned pool buffers; the device storages are held until that copy's event has completed,
so a plan's `F v` right after `O v` cannot hand v's memory back to the allocator while the copy
still reads it. `P v` allocates the device buffer on the compute stream, makes the
host-to-device stream wait for the compute stream (and for v's offload), copies, and calls
`record_stream` on the buffer: freed before use, it is not reused while the copy still writes
it (cross-stream allocator races corrupt values silently, PyTorch #106360). The first compute
reading v waits for the copy's event (`ready`). `D v` returns the host buffers to the pool once
the offload and every prefetch of them have completed.

On CPU the same calls copy synchronously into the host pool: the values, the device-memory
accounting and the host-byte accounting of the plan are exercised without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from planner.runtime.offload_pack import GroupLayout, Packed, pack, unpack
from planner.runtime.offload_pool import HostPool


@dataclass(frozen=True)
class TransferStats:
    """What one step moved: bytes each way, copies, host memory held."""

    d2h_bytes: int
    h2d_bytes: int
    offloads: int
    prefetches: int
    host_peak_bytes: int  # most bytes of host copies held at once in the step
    host_pool_bytes: int  # buffers the pool owns (reused across steps)
    device: str

    def __str__(self) -> str:
        return (
            f"{self.offloads} offloads ({self.d2h_bytes} B d2h), {self.prefetches} prefetches "
            f"({self.h2d_bytes} B h2d), host peak {self.host_peak_bytes} B on {self.device}"
        )


@dataclass
class _HostCopy:
    packed: Packed
    buffers: list[torch.Tensor]  # host side, one per storage
    written: Any = None  # CUDA event: the d2h copy is complete
    readers: list[Any] = field(default_factory=list)  # CUDA events of prefetches from it


class CopyStreams:
    """Per program and device: the copy streams and the host pool (kept across steps)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pool = HostPool(pinned=self.cuda)
        self.d2h: Any = torch.cuda.Stream(device) if self.cuda else None
        self.h2d: Any = torch.cuda.Stream(device) if self.cuda else None


class StepCopies:
    """The copies of one step; `finish()` waits for what is in flight and releases it."""

    def __init__(self, streams: CopyStreams, layouts: dict[int, GroupLayout]) -> None:
        self.streams = streams
        self.layouts = layouts
        self.pool = streams.pool
        self.pool.reset_peak()
        self.host: dict[int, _HostCopy] = {}
        self.unwaited: dict[int, Any] = {}  # node -> h2d event the compute stream must wait on
        self.device_held: list[tuple[Any, list[torch.Tensor]]] = []  # (event, storages)
        self.host_held: list[tuple[list[Any], list[torch.Tensor]]] = []  # (events, buffers)
        self.d2h_bytes = self.h2d_bytes = self.offloads = self.prefetches = 0

    # -- the plan's actions ------------------------------------------------------------------
    def offload(
        self, group: int, values: dict[str, Any], copy_also: frozenset[str] = frozenset()
    ) -> None:
        self._poll()
        packed = pack(self.layouts[group], values, copy_also)
        buffers = [self.pool.take(int(s.numel())) for s in packed.storages]
        copy = _HostCopy(packed, buffers)
        s = self.streams
        if s.cuda:
            produced = torch.cuda.current_stream(s.device).record_event()
            s.d2h.wait_event(produced)
            if group in self.unwaited:  # offloading what a prefetch is still writing
                s.d2h.wait_event(self.unwaited[group])
            with torch.cuda.stream(s.d2h):
                for host, dev in zip(buffers, packed.storages, strict=True):
                    host.copy_(dev, non_blocking=True)
                copy.written = s.d2h.record_event()
            # the device storages stay alive until the copy has read them
            self.device_held.append((copy.written, list(packed.storages)))
        else:
            for host, dev in zip(buffers, packed.storages, strict=True):
                host.copy_(dev)
        packed.storages = []  # the host copy must not keep the device storages alive
        self.host[group] = copy
        self.d2h_bytes += sum(int(b.numel()) for b in buffers)
        self.offloads += 1

    def prefetch(self, group: int, values: dict[str, Any]) -> None:
        self._poll()
        copy = self.host[group]
        s = self.streams
        device_buffers: list[torch.Tensor] = []
        if s.cuda:
            issued = torch.cuda.current_stream(s.device).record_event()
            # allocated on the compute stream; the copy waits for the computes issued before it
            device_buffers = [torch.empty(int(b.numel()), dtype=torch.uint8, device=s.device)
                              for b in copy.buffers]
            s.h2d.wait_event(issued)
            s.h2d.wait_event(copy.written)
            with torch.cuda.stream(s.h2d):
                for dev, host in zip(device_buffers, copy.buffers, strict=True):
                    dev.copy_(host, non_blocking=True)
                done = s.h2d.record_event()
            for dev in device_buffers:
                dev.record_stream(s.h2d)
            copy.readers.append(done)
            self.unwaited[group] = done
        else:
            for host in copy.buffers:
                device_buffers.append(torch.empty(int(host.numel()), dtype=torch.uint8))
                device_buffers[-1].copy_(host)
        unpack(copy.packed, device_buffers, values)
        self.h2d_bytes += sum(int(b.numel()) for b in copy.buffers)
        self.prefetches += 1

    def ready(self, group: int) -> None:
        """Before the first compute reading a prefetched node: wait for its copy (CUDA)."""
        event = self.unwaited.pop(group, None)
        if event is not None:
            torch.cuda.current_stream(self.streams.device).wait_event(event)

    def drop(self, group: int) -> None:
        self._poll()
        copy = self.host.pop(group)
        events = [e for e in (copy.written, *copy.readers) if e is not None]
        if events:
            self.host_held.append((events, copy.buffers))
        else:
            for buf in copy.buffers:
                self.pool.give(buf)

    # -- bookkeeping -------------------------------------------------------------------------
    def poll(self) -> None:
        """Release device storages and host buffers whose copies have completed (CUDA; on CPU
        copies complete at once and nothing is held)."""
        if self.device_held or self.host_held:
            self._poll()

    def _poll(self) -> None:
        """Release device storages and host buffers whose copies have completed."""
        if self.device_held:
            self.device_held = [(e, ts) for e, ts in self.device_held if not e.query()]
        if self.host_held:
            keep = []
            for events, buffers in self.host_held:
                if all(e.query() for e in events):
                    for buf in buffers:
                        self.pool.give(buf)
                else:
                    keep.append((events, buffers))
            self.host_held = keep

    def finish(self) -> TransferStats:
        """End of the step: wait for the copy streams, release every host copy still held."""
        s = self.streams
        if s.cuda:
            compute = torch.cuda.current_stream(s.device)
            compute.wait_stream(s.d2h)
            compute.wait_stream(s.h2d)
            s.d2h.synchronize()
            s.h2d.synchronize()
        self.device_held.clear()
        self.unwaited.clear()
        for _, buffers in self.host_held:
            for buf in buffers:
                self.pool.give(buf)
        self.host_held.clear()
        for copy in self.host.values():
            for buf in copy.buffers:
                self.pool.give(buf)
        self.host.clear()
        return self.stats()

    def stats(self) -> TransferStats:
        pool = self.pool.stats()
        return TransferStats(
            self.d2h_bytes, self.h2d_bytes, self.offloads, self.prefetches,
            pool.peak_in_use_bytes, pool.allocated_bytes, str(self.streams.device),
        )
