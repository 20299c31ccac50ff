"""Where a plan's measured memory leaves the simulator's: the --timeline diagnostic.

The plan's step runs once more with a probe after every compute and free action: the generated
code of each segment (planner.runtime.op_codegen, planner.runtime.offload_program) gets one call
`probe(action_index)` after each action's statements, by wrapping the compiler's emitter; the
runtime itself is unchanged, and the probe exists only in this copy of the program. A sample
covers the window of actions since the previous one: the most memory allocated in it when that
rose above the level the window started from (a compute, counted while it runs), else the level
at its end (a free, counted after it). On CUDA from `torch.cuda.max_memory_allocated()` and
`memory_allocated()` above the step's start, the peak reset at each sample: the allocator's view
in program order (with `sync` the CPU waits for the GPU at each probe, which also lets the
offload engine see its copies done sooner); on CPU the live bytes of exact storage accounting.
Each window is compared with the most the simulator holds over the same actions
(`SimulationResult.timeline`, and `memory_trace` for plans with host copies) less the bytes
resident before the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from planner.tracing.memory import StorageTracker

END = "end (after the plan's last action)"


class _WindowTracker(StorageTracker):
    """Exact storage accounting (CPU) that also keeps the most live bytes since the last read."""

    def __init__(self) -> None:
        super().__init__(keep_timeline=False)
        self.window_start = self.window_peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.window_peak = max(self.window_peak, self.live_bytes)
        return out

    def read(self) -> int:
        self.sweep()  # storages whose last reference the plan's free just dropped
        value = _window_value(self.window_start, self.window_peak, self.live_bytes)
        self.window_start = self.window_peak = self.live_bytes
        return value


def _window_value(start: int, peak: int, now: int) -> int:
    """A window's bytes: its peak when memory rose above the level it started from (a compute:
    the simulator counts it while it runs), else the level at its end (a free: the simulator
    counts what is left after it)."""
    return peak if peak > start else now


class Probe:
    """Called by the instrumented code after each action: records (action index, bytes)."""

    def __init__(self, device: str, sync: bool = False) -> None:
        self.device, self.sync = device, sync
        self.samples: list[tuple[int, int]] = []
        self.active = False
        self._tracker: _WindowTracker | None = None
        self._base = self._start = 0  # allocated at the step's start / the window's start

    def __call__(self, index: int) -> None:
        if self.active:
            self.samples.append((index, self._read()))

    def _read(self) -> int:
        if self._tracker is not None:
            return self._tracker.read()
        if self.sync:
            torch.cuda.synchronize()
        now = torch.cuda.memory_allocated()
        value = _window_value(self._start, torch.cuda.max_memory_allocated(), now)
        torch.cuda.reset_peak_memory_stats()  # the next window's peak starts from `now`
        self._start = now
        return int(value - self._base)

    @contextlib.contextmanager
    def recording(self, end_index: int) -> Iterator[None]:
        """Samples during the block, and one at its end (index `end_index`)."""
        self.samples = []
        if self.device == "cuda":
            torch.cuda.synchronize()
            self._base = self._start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self._tracker = None
            scope: Any = contextlib.nullcontext()
        else:
            self._tracker = _WindowTracker()
            scope = self._tracker
        self.active = True
        try:
            with scope:
                yield
                self(end_index)
        finally:
            self.active = False
            self._tracker = None


def _instrument(emitter: Any, probe: Probe) -> None:
    """After each compute and free statement group, a call of `probe(index)`."""
    compute, free = emitter.compute, emitter.free

    def probed_compute(group: int, index: int) -> None:
        compute(group, index)
        emitter.lines.append(f"{emitter.const(probe)}({index})")

    def probed_free(group: int, index: int) -> None:
        free(group, index)
        emitter.lines.append(f"{emitter.const(probe)}({index})")

    setattr(emitter, "compute", probed_compute)  # noqa: B010 - an instance's own copy
    setattr(emitter, "free", probed_free)  # noqa: B010


def probed_program(program: Any, trace: Any, actions: Sequence[Any], probe: Probe) -> Any:
    """A copy of `program` (JointProgram or OffloadProgram) whose code calls `probe`."""
    base = type(program)

    def _compiler(self: Any) -> Any:
        compiler = base._compiler(self)
        _instrument(compiler.emitter, probe)
        return compiler

    probed = type(f"Probed{base.__name__}", (base,), {"_compiler": _compiler})
    return probed(trace, actions, program.resources)


def simulated_step_bytes(simulation: Any, fixed_bytes: int) -> list[int]:
    """Per action: the most the simulator holds during it, less the bytes resident before the
    step (the timeline's point, or any event of the action in an event simulation)."""
    out = [p.live_bytes for p in simulation.timeline]
    for point in getattr(simulation, "memory_trace", ()):
        out[point.action_index] = max(out[point.action_index], point.device_bytes)
    return [b - fixed_bytes for b in out]


def first_excess(samples: Sequence[tuple[int, int]], simulated: Sequence[int],
                 action_texts: Sequence[str], tolerance_bytes: int) -> dict[str, Any]:
    """Compare each sample with the simulator's most over its window of actions (those after
    the previous sample, up to its own): the first window over by more than `tolerance_bytes`
    and the worst one. A sample at index len(simulated) is the step's end."""
    first: dict[str, Any] = {}
    worst: dict[str, Any] = {"worst_excess_bytes": None}
    previous = -1
    for index, measured in samples:
        window = simulated[previous + 1:index + 1] if index < len(simulated) else simulated[-1:]
        allowed = max(window, default=0)
        excess = measured - allowed
        previous = index
        label = action_texts[index] if index < len(action_texts) else END
        if worst["worst_excess_bytes"] is None or excess > worst["worst_excess_bytes"]:
            worst = {"worst_index": index, "worst_action": label, "worst_excess_bytes": excess}
        if not first and excess > tolerance_bytes:
            first = {"first_index": index, "first_action": label, "first_excess_bytes": excess,
                     "first_measured_bytes": measured, "first_simulated_bytes": allowed}
    out: dict[str, Any] = {"first_index": None, "samples": len(samples),
                           "measured_peak_bytes": max((m for _, m in samples), default=None),
                           "simulated_peak_bytes": max(simulated, default=None),
                           "tolerance_bytes": tolerance_bytes}
    return {**out, **worst, **first}


def diagnose(model: Any, module: Any, trace: Any, inputs: tuple[Any, ...], device: str,
             fixed_bytes: int, tolerance_bytes: int, sync: bool = False,
             autocast: str | None = None) -> dict[str, Any]:
    """One instrumented step of `module`'s plan (an applied PlannedModule) after one warm-up:
    where its memory first exceeds the simulator's (see `first_excess`)."""
    from fidelity_measure import planned_autocast, training_step

    program = module.program
    actions = [*program.forward.actions, *program.backward.actions]
    probe = Probe(device, sync)
    saved = module._holder["program"]
    module._holder["program"] = probed_program(program, trace, actions, probe)
    try:
        step = training_step(module, inputs, device, planned_autocast(autocast))
        model.zero_grad(set_to_none=True)
        step()  # warm-up, probe inactive
        model.zero_grad(set_to_none=True)
        with probe.recording(len(actions)):
            step()
        model.zero_grad(set_to_none=True)
    finally:
        module._holder["program"] = saved
    simulated = simulated_step_bytes(program.simulation, fixed_bytes)
    report = first_excess(probe.samples, simulated, [str(a) for a in actions], tolerance_bytes)
    mode = "cpu" if device != "cuda" else ("cuda, synchronised" if sync else "cuda")
    return {"mode": mode, **report}
