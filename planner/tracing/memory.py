"""Exact accounting of live tensor storage during a step (CPU), or the allocator's peak (CUDA).

`measure_step_memory(fn)` runs `fn()` under a TorchDispatchMode that sees every aten op,
forward and backward (the autograd engine carries the mode to its threads). Each new output
storage is recorded by data pointer with a weak reference; before each op, storages whose
last tensor died are dropped. Live bytes are sampled right after each op's outputs exist (as
the simulator counts a node's output while it runs). Storages that existed before `fn` ran
(parameters, inputs) are not counted: the result is what the step itself allocates.

Not seen (planner.tracing.allocator_events counts them; measured on CPU, issue 47): an op's
internal workspace (convolution_backward's columns: 278,528 B on zoo.resnet), tensors made
outside dispatch, such as the 0-dim tensor autograd saves for `x / float` (8 B; a dispatch
mode gets the Python number) and torch.utils.checkpoint's saved RNG state (5,056 B per call,
held until its backward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class StepMemory:
    peak_bytes: int  # most bytes live at once, allocated by the step
    end_bytes: int  # still live when fn returned (e.g. gradients, the loss)
    timeline: tuple[tuple[str, int], ...]  # (op, live bytes after it), in execution order
    device: str = "cpu"
    result: Any = None  # what fn returned

    @property
    def peak_index(self) -> int:
        return max(range(len(self.timeline)), key=lambda i: self.timeline[i][1], default=-1)


class StorageTracker(TorchDispatchMode):
    """Tracks storages created under the mode; `live_bytes` is exact at op boundaries."""

    def __init__(self, keep_timeline: bool = True) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.keep_timeline = keep_timeline
        self.timeline: list[tuple[str, int]] = []

    def sweep(self) -> None:
        dead = [k for k, (ref, _) in self.storages.items() if ref.expired()]
        for k in dead:
            self.live_bytes -= self.storages.pop(k)[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.sweep()
        out = func(*args, **(kwargs or {}))
        if not _aliases_input(func):
            inputs = {
                a.untyped_storage().data_ptr()
                for a in tree_flatten((args, kwargs))[0]
                if isinstance(a, torch.Tensor) and not a.is_meta
            }
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    if t.untyped_storage().data_ptr() not in inputs:  # fresh allocation
                        self.add(t)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if self.keep_timeline:
            self.timeline.append((str(func.overloadpacket.__name__), self.live_bytes))
        return out

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        nbytes = storage.nbytes()
        if key == 0 or nbytes == 0:
            return
        known = self.storages.get(key)
        if known is not None and not known[0].expired():
            return  # a view or an in-place result of a storage already counted
        if known is not None:
            self.live_bytes -= known[1]
        self.storages[key] = (StorageWeakRef(storage), nbytes)
        self.live_bytes += nbytes


def _aliases_input(func: Any) -> bool:
    """Views and in-place ops return storage that already existed (maybe before the step)."""
    return any(r.alias_info is not None for r in func._schema.returns)


def measure_step_memory(fn: Callable[[], Any], device: str | torch.device = "cpu") -> StepMemory:
    """Peak and timeline of storage bytes allocated while `fn()` runs (see module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        end = torch.cuda.memory_allocated(device) - base
        return StepMemory(peak, end, (), device=str(device), result=result)
    tracker = StorageTracker()
    with tracker:
        result = fn()
    tracker.sweep()
    return StepMemory(
        tracker.peak_bytes, tracker.live_bytes, tuple(tracker.timeline), device="cpu", result=result
    )


def measure_training_step(
    model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: Any = None
) -> StepMemory:
    """Memory of forward + loss + backward, gradients cleared first (set to None). On CPU the
    peak is the larger of the tracker's and, over a second step, the allocator's own count
    (planner.tracing.allocator_events: it also sees ops' internal workspace, e.g. a
    convolution's, which the trace records on CPU too)."""
    from planner.tracing.allocator_events import measure_allocator_peak
    from planner.tracing.capture import compute_loss

    model.zero_grad(set_to_none=True)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))

    def step() -> float:
        loss = compute_loss(model(*inputs), loss_fn)
        loss.backward()
        return float(loss.detach())

    try:
        tracked = measure_step_memory(step, device)
        if device.type == "cuda":
            return tracked
        model.zero_grad(set_to_none=True)
        counted = measure_allocator_peak(step).peak_bytes
        return replace(tracked, peak_bytes=max(tracked.peak_bytes, counted))
    finally:
        model.zero_grad(set_to_none=True)


def saved_tensor_bytes(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: Any = None) -> int:
    """Bytes autograd saves for backward in one forward (each storage once, leaves excluded)."""
    from planner.tracing.capture import compute_loss

    seen: dict[int, int] = {}
    leaves = {p.untyped_storage().data_ptr() for p in model.parameters()}
    leaves |= {
        x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)
    }
    leaves |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in leaves:
            seen[s.data_ptr()] = s.nbytes()
        keep.append(t)  # keep storages alive so data pointers stay unique
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compute_loss(model(*inputs), loss_fn)
    keep.clear()
    del loss
    return sum(seen.values())
