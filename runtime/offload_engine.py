"""The copies of one planned step: `O` offload, `P` prefetch, `F` release, `D` drop, with the
memory rules of the event simulator (planner.sim.copy_streams).

The release discipline is program order. The CUDA caching allocator counts and reuses memory
in the order the CPU allocates and frees, however far the CPU runs ahead of the GPU; so device
storages are released exactly at the plan's `F`, on the compute stream, after the compute
stream has waited (on the GPU, not the CPU) for any copy still reading or writing them. No
release depends on when the CPU notices a copy's completion, and none uses `record_stream`
(whose deferred frees stay allocated in stream order): a slow copy can delay the compute
stream, which the simulator times, but never move a release past the plan's point.
Planners put `F` where the copy is done (planner.sim.free_placement), so the wait is free.

On CUDA: one copy stream per direction. `O v` makes the device-to-host stream wait for the
compute stream (v's producer ran before) and copies v's storages into pinned pool buffers; the
storages stay referenced here until `release(v)` at the plan's `F v`. `P v` allocates the device
buffer on the compute stream at issue, makes the host-to-device stream wait for the compute
stream and for v's offload, and copies; the first compute reading v waits for that copy
(`ready`). `D v` hands the host buffers back to the pool at once, with the events of the copies
still using them: the next offload into a buffer makes its copy stream wait for those.

On CPU the same calls copy synchronously into the host pool: values, device-memory accounting
and host-byte accounting of the plan are exercised without a GPU. `CopyStreams` is the one
place that touches streams and events, so a test can replace it (a copy that completes late).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.runtime.offload_pack import GroupLayout, Packed, pack, unpack
from planner.runtime.offload_pool import HostPool

CopyPairs = Sequence[tuple[torch.Tensor, torch.Tensor]]  # (destination, source) per storage


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
    written: Any = None  # event: the d2h copy is complete (None on CPU)
    readers: list[Any] = field(default_factory=list)  # events of prefetches from it


class CopyStreams:
    """Per program and device: the copy streams, their events and the host pool (kept across
    steps). On CPU every copy is synchronous and every event None."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pool = HostPool(pinned=self.cuda)
        self.d2h: Any = torch.cuda.Stream(device) if self.cuda else None
        self.h2d: Any = torch.cuda.Stream(device) if self.cuda else None

    def compute_mark(self) -> Any:
        """An event after the work issued so far on the compute stream."""
        return torch.cuda.current_stream(self.device).record_event() if self.cuda else None

    def copy_out(self, pairs: CopyPairs, after: Sequence[Any]) -> Any:
        """Device to host once every event of `after` has happened; the copy's event."""
        return self._copy(self.d2h, pairs, after)

    def copy_in(self, pairs: CopyPairs, after: Sequence[Any]) -> Any:
        """Host to device once every event of `after` has happened; the copy's event."""
        return self._copy(self.h2d, pairs, after)

    def _copy(self, stream: Any, pairs: CopyPairs, after: Sequence[Any]) -> Any:
        if not self.cuda:
            for dst, src in pairs:
                dst.copy_(src)
            return None
        for event in after:
            if event is not None:
                stream.wait_event(event)
        with torch.cuda.stream(stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            return stream.record_event()

    def compute_waits(self, event: Any) -> None:
        """The compute stream waits (on the device) for `event`."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def synchronize(self) -> None:
        """End of a step: the compute stream after both copy streams, both drained."""
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.d2h)
            compute.wait_stream(self.h2d)
            self.d2h.synchronize()
            self.h2d.synchronize()


class StepCopies:
    """The copies of one step; `finish()` waits for what is in flight and releases it."""

    def __init__(self, streams: CopyStreams, layouts: dict[int, GroupLayout]) -> None:
        self.streams = streams
        self.layouts = layouts
        self.pool = streams.pool
        self.pool.reset_peak()
        self.host: dict[int, _HostCopy] = {}
        self.unwaited: dict[int, Any] = {}  # node -> h2d event the compute stream must wait on
        # node -> (its d2h copy's event, its device storages): released at the plan's F
        self.releasing: dict[int, tuple[Any, list[torch.Tensor]]] = {}
        self.d2h_bytes = self.h2d_bytes = self.offloads = self.prefetches = 0

    # -- the plan's actions ------------------------------------------------------------------
    def offload(
        self, group: int, values: dict[str, Any], copy_also: frozenset[str] = frozenset(),
        left: frozenset[str] = frozenset(),
    ) -> None:
        s = self.streams
        packed = pack(self.layouts[group], values, copy_also, left)
        taken = [self.pool.take(int(t.numel())) for t in packed.storages]
        buffers = [buf for buf, _ in taken]
        after = [s.compute_mark(), *(e for _, events in taken for e in events)]
        if group in self.unwaited:  # offloading what a prefetch is still writing
            after.append(self.unwaited[group])
        written = s.copy_out(list(zip(buffers, packed.storages, strict=True)), after)
        # the device storages stay referenced until the plan's F: release() drops them there
        self.releasing[group] = (written, list(packed.storages))
        packed.storages = []  # the host copy must not keep the device storages alive
        self.host[group] = _HostCopy(packed, buffers, written)
        self.d2h_bytes += sum(int(b.numel()) for b in buffers)
        self.offloads += 1

    def prefetch(self, group: int, values: dict[str, Any]) -> None:
        s = self.streams
        copy = self.host[group]
        issued = s.compute_mark()
        # allocated on the compute stream at issue, as the simulator takes it
        device_buffers = [
            torch.empty(int(b.numel()), dtype=torch.uint8, device=s.device) for b in copy.buffers
        ]
        done = s.copy_in(list(zip(device_buffers, copy.buffers, strict=True)),
                         [issued, copy.written])
        if done is not None:
            copy.readers.append(done)
            self.unwaited[group] = done
        unpack(copy.packed, device_buffers, values)
        self.h2d_bytes += sum(int(b.numel()) for b in copy.buffers)
        self.prefetches += 1

    def ready(self, group: int) -> None:
        """Before the first compute reading a prefetched node: wait for its copy."""
        self.streams.compute_waits(self.unwaited.pop(group, None))

    def release(self, group: int) -> None:
        """At the plan's `F` of a node with copies, before its values are dropped: the compute
        stream waits for the copies still using its device storages, which then go."""
        self.streams.compute_waits(self.unwaited.pop(group, None))  # a prefetch never read
        written, storages = self.releasing.pop(group, (None, []))
        self.streams.compute_waits(written)
        storages.clear()

    def drop(self, group: int) -> None:
        copy = self.host.pop(group)
        events = tuple(e for e in (copy.written, *copy.readers) if e is not None)
        for buf in copy.buffers:
            self.pool.give(buf, events)

    # -- the end of the step -------------------------------------------------------------------
    def finish(self) -> TransferStats:
        """End of the step: wait for the copy streams, release every host copy still held."""
        self.streams.synchronize()
        self.releasing.clear()
        self.unwaited.clear()
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
