"""Measured memory and time of training steps, for tests, benchmarks and the agent.

Memory comes from `planner.tracing.memory` (exact live-storage accounting on CPU, the
allocator's peak on CUDA). One thing is added here: the same peak with gradient storages left
out. The simulator treats a gradient like any other node output (a plan may free it once it is
produced, as if handed to the optimizer), while in a real step `.grad` keeps it until
`zero_grad`; `activation_peak_bytes` is the figure comparable with the plan's prediction minus
fixed memory, `peak_bytes` the tracker's whole count.

On CPU the allocator's own records (planner.tracing.allocator_events) are read over the same
step: `allocator_peak_bytes`. The tracker counts storages that dispatched ops return, so it
reads lower where memory is allocated out of its sight: an op's internal workspace
(convolution_backward's columns on a ResNet, 278,528 B), Python scalars that autograd saves as
0-dim tensors (`att / math.sqrt(d)`: 8 B per attention), checkpoint's saved RNG state (5,056 B
per checkpointed call). `measured_peak_bytes` is the larger of both: compare plans with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from planner.tracing.allocator_events import allocator_events
from planner.tracing.memory import StorageTracker, measure_step_memory


@dataclass(frozen=True)
class StepMeasurement:
    peak_bytes: int  # everything the step allocated, at its most (gradients included)
    activation_peak_bytes: int  # the same without the gradient storages (CPU; = peak on CUDA)
    gradient_bytes: int  # storage of the parameters' .grad after the step
    duration_ms: float
    loss: float
    device: str
    # the step's peak by the allocator's own records (planner.tracing.allocator_events): sees
    # what the tracker cannot (an op's temporaries, tensors made outside dispatch); = peak on CUDA
    allocator_peak_bytes: int = 0

    @property
    def measured_peak_bytes(self) -> int:
        """The step's peak by whichever count saw more (see the module docstring)."""
        return max(self.peak_bytes, self.allocator_peak_bytes)


class _EventTracker(StorageTracker):
    """A StorageTracker that also logs (storage instance, ±bytes) per op, for replays.

    Storage instances get their own ids: a data pointer is reused once its storage dies.
    """

    def __init__(self) -> None:
        super().__init__(keep_timeline=False)
        self.events: list[list[tuple[int, int]]] = [[]]
        self.instance: dict[int, int] = {}  # data pointer -> id of the live storage there
        self._next_id = 0

    def sweep(self) -> None:
        dead = [k for k, (ref, _) in self.storages.items() if ref.expired()]
        for k in dead:
            nbytes = self.storages.pop(k)[1]
            self.live_bytes -= nbytes
            self.events[-1].append((self.instance.pop(k), -nbytes))

    def add(self, t: torch.Tensor) -> None:
        key = t.untyped_storage().data_ptr()
        before = self.storages.get(key)
        super().add(t)
        after = self.storages.get(key)
        if after is None or after is before:
            return
        if before is not None:  # an expired storage at the same address, replaced
            self.events[-1].append((self.instance[key], -before[1]))
        self._next_id += 1
        self.instance[key] = self._next_id
        self.events[-1].append((self._next_id, after[1]))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.events.append([])  # a sample point: live bytes right after this op
        return out

    def peak_without(self, data_ptrs: set[int]) -> int:
        """Peak of live bytes leaving out the storages now live at `data_ptrs`."""
        excluded = {self.instance[k] for k in data_ptrs if k in self.instance}
        live = peak = 0
        for batch in self.events:
            live += sum(delta for uid, delta in batch if uid not in excluded)
            peak = max(peak, live)
        return peak


class TrackerRelay(TorchDispatchMode):
    """A mode compiled into a graph (torch.compile) that forwards ops to the active tracker.

    TorchDynamo runs frames eagerly while a dispatch mode is active, so compiled steps are
    measured by passing this relay to `measure_step`: the mode stays off at frame entry and the
    compiled graphs (which enter the relay) report to the tracker. Ops outside the compiled
    graphs (gradient accumulation, the loss's seed gradient) are not seen.
    """

    def __init__(self) -> None:
        super().__init__()
        self.target: StorageTracker | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.target is None:
            return func(*args, **(kwargs or {}))
        return self.target.__torch_dispatch__(func, types, args, kwargs)


def measure_step(
    step: Callable[[], Any],
    model: nn.Module,
    device: str | torch.device = "cpu",
    relay: TrackerRelay | None = None,
) -> StepMeasurement:
    """Run `step()` (forward + backward, returning the loss) once with gradients cleared."""
    device = torch.device(device)
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        started = time.perf_counter()
        mem = measure_step_memory(step, device)
        duration_ms = (time.perf_counter() - started) * 1e3
        grads = _gradient_storages(model)
        return StepMeasurement(
            mem.peak_bytes, mem.peak_bytes, sum(grads.values()), duration_ms,
            _scalar(mem.result), str(device), allocator_peak_bytes=mem.peak_bytes,
        )
    tracker = _EventTracker()
    started = time.perf_counter()
    with allocator_events("cpu") as allocator:
        if relay is not None:
            relay.target = tracker
            try:
                result = step()
            finally:
                relay.target = None
        else:
            with tracker:
                result = step()
    duration_ms = (time.perf_counter() - started) * 1e3
    tracker.sweep()
    grads = _gradient_storages(model)
    return StepMeasurement(
        peak_bytes=tracker.peak_bytes,
        activation_peak_bytes=tracker.peak_without(set(grads)),
        gradient_bytes=sum(grads.values()),
        duration_ms=duration_ms,
        loss=_scalar(result),
        device="cpu",
        allocator_peak_bytes=allocator.peak_bytes,
    )


def _gradient_storages(model: nn.Module) -> dict[int, int]:
    out = {}
    for p in model.parameters():
        if p.grad is not None:
            s = p.grad.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach())
    return float(value) if isinstance(value, int | float) else float("nan")


def time_steps(
    step: Callable[[], Any], *, warmup: int = 1, repeats: int = 3, cuda: bool = False,
    reduce: Callable[[list[float]], float] = statistics.median,
) -> float:
    """Milliseconds of `step()`, median (or `reduce`) over repeats; no memory tracking."""
    times = []
    for i in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1e3)
    return reduce(times)


def training_step(
    module: nn.Module, inputs: tuple[Any, ...], loss_fn: Any = None
) -> Callable[[], Any]:
    """forward + loss + backward of `module(*inputs)` as a callable returning the loss."""
    from planner.tracing.capture import compute_loss

    def step() -> Any:
        loss = compute_loss(module(*inputs), loss_fn)
        loss.backward()
        return loss.detach()

    return step
