"""Per-op costs: measured by running the joint graph op by op, or estimated by a roofline.

Measurement runs the captured joint graph on real tensors with an fx Interpreter: warm-up
runs, then repeated runs timing every op (CUDA events on a GPU, a steady clock on CPU) and the
median per op. `real_step_ms` times an eager training step the same way, for fidelity checks.

clock "wall" is `time.perf_counter` (steady). clock "cpu" is `time.thread_time`: the CPU time of
the calling thread, which on a shared, loaded machine leaves out time spent descheduled; it is
only meaningful with one intra-op thread (`torch.set_num_threads(1)`), since CPU autograd runs
the backward on the calling thread but intra-op workers are other threads.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from planner.tracing.capture import JointCapture, compute_loss
from planner.tracing.profiles import DeviceProfile
from planner.tracing.records import OpRecord


def estimate_record_ms(record: OpRecord, profile: DeviceProfile) -> float:
    if record.trivial:
        return 0.0
    return profile.roofline_ms(record.flops, record.bytes_moved, record.dtype or "float32")


def joint_arguments(cap: JointCapture, model: nn.Module, inputs: tuple[Any, ...]) -> list[Any]:
    """Real values for the joint graph's placeholders: parameters, buffers, inputs, tangents."""
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    flat_inputs = [x for x in inputs]
    args: list[Any] = []
    for node in cap.gm.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name in cap.tangent_nodes:
            val = node.meta["val"]
            args.append(torch.ones(val.shape, dtype=val.dtype, device=_device(model, inputs)))
            continue
        kind, name = cap.primal_kinds[node.name], cap.primal_names[node.name]
        if kind == "parameter":
            args.append(params[name])
        elif kind == "buffer":
            args.append(buffers[name])
        else:
            args.append(_input_by_name(name, flat_inputs))
    return args


def _input_by_name(name: str, inputs: list[Any]) -> Any:
    digits = [p for p in name.split(".") if p.isdigit()]
    if digits and int(digits[0]) < len(inputs):
        return inputs[int(digits[0])]
    raise ValueError(f"cannot match joint-graph input {name!r} to the given inputs")


def _device(model: nn.Module, inputs: tuple[Any, ...]) -> torch.device:
    for t in list(model.parameters()) + [x for x in inputs if isinstance(x, torch.Tensor)]:
        return t.device
    return torch.device("cpu")


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def clock_fn(clock: str) -> Callable[[], float]:
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r}: use 'wall' or 'cpu'")
    return CLOCKS[clock]


class _Timer:
    """Steady clock on CPU; on a GPU, the time of an op's kernels. Each op is timed from an idle
    device that first sleeps long enough for the CPU to queue the op behind it, so the CUDA
    events see the kernels back to back and not the fx interpreter's launch gaps (tens of µs an
    op, far more than the plan's generated code leaves). Measured on an H200
    (benchmarks/gpu/cost_probe.py): planned GPT steps run at 0.95-0.99 of the kernels' sum, where
    events around the interpreter's calls gave 0.85-0.97 and kernels-or-dispatch, whichever is
    longer, 0.81-0.91. A step bound by Python dispatch (small bf16 or convolution models) runs
    slower than its kernels: there the prediction is low (see docs/gpu_fidelity.md)."""

    def __init__(self, device: torch.device, clock: str = "wall") -> None:
        self.cuda = device.type == "cuda"
        self.now = clock_fn(clock)
        self.overhead_ms = 0.0 if self.cuda else self._clock_overhead_ms()
        self.pending: list[tuple[str, Any, Any, float]] = []
        self.times: dict[str, float] = {}
        self.dispatch_ms: dict[str, float] = {}  # last CPU dispatch time per op: its lead
        self.sleep_cycles_per_ms = self._sleep_cycles_per_ms() if self.cuda else 0.0

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        if self.cuda:
            return self._run_cuda(key, fn)
        t0 = self.now()
        out = fn()
        elapsed = max(0.0, (self.now() - t0) * 1e3 - self.overhead_ms)
        self.times[key] = self.times.get(key, 0.0) + elapsed
        return out

    def _run_cuda(self, key: str, fn: Callable[[], Any]) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        lead_ms = min(max(_LEAD_MS, 2.0 * self.dispatch_ms.get(key, _LEAD_MS)), _LEAD_MAX_MS)
        torch.cuda._sleep(int(lead_ms * self.sleep_cycles_per_ms))
        start.record()
        t0 = time.perf_counter()
        out = fn()
        dispatch_ms = (time.perf_counter() - t0) * 1e3
        end.record()
        self.dispatch_ms[key] = dispatch_ms
        self.pending.append((key, start, end, dispatch_ms))
        return out

    @staticmethod
    def _sleep_cycles_per_ms() -> float:
        """The device's clock as torch.cuda._sleep counts it (the last of three tries: warm)."""
        cycles = 2_000_000
        for _ in range(3):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            elapsed_ms = start.elapsed_time(end)
        return cycles / max(elapsed_ms, 1e-3)

    def _clock_overhead_ms(self) -> float:
        """What timing an empty call costs, subtracted from every op's time."""
        samples = []
        for _ in range(200):
            t0 = self.now()
            (lambda: None)()
            samples.append((self.now() - t0) * 1e3)
        return statistics.median(samples)

    def collect(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            for key, start, end, _dispatch_ms in self.pending:
                self.times[key] = self.times.get(key, 0.0) + start.elapsed_time(end)
            self.pending.clear()
        out, self.times = self.times, {}
        return out


# How long the device sleeps before an op at least (ms): covers queuing the op's kernels.
# An op that waits for the device itself (a .item()) would double its lead every run: capped.
_LEAD_MS, _LEAD_MAX_MS = 0.05, 1.0


class _TimingInterpreter(torch.fx.Interpreter):
    """Times the op call itself, not the interpreter's fetching of its arguments."""

    def __init__(self, gm: torch.fx.GraphModule, timer: _Timer, values: dict[str, Any] | None):
        super().__init__(gm, garbage_collect_values=True)
        self.timer = timer
        self.values = values  # fx name -> output, when the caller wants them
        self.running = ""

    def run_node(self, n: torch.fx.Node) -> Any:
        self.running = n.name
        out = super().run_node(n)
        if self.values is not None and n.op == "call_function":
            self.values[n.name] = out
        return out

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        # Fake tensors' strides can differ from the real kernel's (native_dropout_backward of
        # a transposed gradient: contiguous in the trace, transposed on CPU), so a `view` valid
        # in the trace can fail here; `reshape` is that view whenever one exists (as the
        # runtime runs it).
        if target in _VIEW_OPS:
            target = torch.ops.aten.reshape.default
        return self.timer.run(self.running, lambda: target(*args, **kwargs))


_VIEW_OPS = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


def run_joint(cap: JointCapture, args: list[Any], keep_values: bool = False) -> dict[str, Any]:
    """Run the joint graph once on real tensors; the fx outputs by name when asked."""
    values: dict[str, Any] | None = {} if keep_values else None
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    timer = _Timer(device)
    with torch.no_grad():
        _TimingInterpreter(cap.gm, timer, values).run(*args, enable_io_processing=False)
    timer.collect()
    return values or {}


def measure_fx_ms(
    cap: JointCapture,
    args: list[Any],
    *,
    warmup: int = 1,
    repeats: int = 5,
    progress: Callable[[int, int], None] | None = None,
    clock: str = "wall",
) -> dict[str, float]:
    """Median milliseconds of every call node of the joint graph over `repeats` runs."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    timer = _Timer(device, clock)
    samples: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(warmup + repeats):
            _TimingInterpreter(cap.gm, timer, None).run(*args, enable_io_processing=False)
            times = timer.collect()
            if i >= warmup:
                for k, v in times.items():
                    samples.setdefault(k, []).append(v)
            if progress is not None:
                progress(i + 1, warmup + repeats)
    return {k: statistics.median(v) for k, v in samples.items()}


class _WorkspaceInterpreter(torch.fx.Interpreter):
    """Runs the joint graph once on CUDA, noting each op's transient allocations."""

    def __init__(self, gm: torch.fx.GraphModule, device: torch.device) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.device = device
        self.running = ""
        self.workspace_bytes: dict[str, int] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        self.running = n.name
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in _VIEW_OPS:
            target = torch.ops.aten.reshape.default
        torch.cuda.reset_peak_memory_stats(self.device)  # the peak restarts at what is live
        out = target(*args, **kwargs)
        # what the op allocated and released before returning: the kernel's own buffers
        # (attention and loss backward, reductions), invisible as outputs
        transient = (torch.cuda.max_memory_allocated(self.device)
                     - torch.cuda.memory_allocated(self.device))
        if transient > 0:
            self.workspace_bytes[self.running] = transient
        return out


def measure_fx_workspace_bytes(cap: JointCapture, args: list[Any]) -> dict[str, int]:
    """Per call node of the joint graph, the bytes it allocates and frees while it runs (CUDA:
    the caching allocator's peak above what is live after the op). On CPU, the convolutions' and
    batch norms' (im2col columns and the like, which the allocator's own records of a step
    count), measured in one profiler session on tensors of their inputs' sizes
    (planner.tracing.cpu_workspace; `args` are not run): other CPU ops allocate at most a
    wrapped scalar beside their outputs."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    if device.type != "cuda":
        from planner.tracing.cpu_workspace import measure_cpu_workspace_bytes

        return measure_cpu_workspace_bytes(cap.gm)
    interpreter = _WorkspaceInterpreter(cap.gm, device)
    with torch.no_grad():
        interpreter.run(*args, enable_io_processing=False)
    torch.cuda.reset_peak_memory_stats(device)
    return interpreter.workspace_bytes


def real_step_ms(
    model: nn.Module,
    inputs: tuple[Any, ...],
    loss_fn: Any = None,
    *,
    warmup: int = 1,
    repeats: int = 5,
    clock: str = "wall",
) -> float:
    """Median milliseconds of an eager forward + loss + backward step (gradients cleared)."""
    device = _device(model, inputs)
    now = time.perf_counter if device.type == "cuda" else clock_fn(clock)
    times: list[float] = []
    for i in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = now()
        compute_loss(model(*inputs), loss_fn).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append((now() - t0) * 1e3)
    model.zero_grad(set_to_none=True)
    return statistics.median(times)
