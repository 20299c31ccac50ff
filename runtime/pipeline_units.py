"""A pipeline stage's own plan: per unit (a module the stage names), recompute or offload.

`PipelineStage.unit_policies` says, per module of a stage ('h.3'), what its saved activations do
in every micro-batch: "keep" (autograd's default), "recompute" (the unit runs under
non-reentrant `torch.utils.checkpoint`, RNG state replayed: only its inputs are kept until its
backward reruns it) or "offload" (every tensor autograd saves inside the unit is copied to host
memory after it is saved, and back to the device when the backward unpacks it, as
`torch.autograd.graph.save_on_cpu` does: pinned buffers on CUDA).

The units are leaf calls of the stage's `GraphModule` (planner.runtime.pipeline_split traces the
named modules as opaque calls), so `apply_unit_policies` retargets each call of a unit with a
policy to a `UnitCall` that runs the user's module under it; the model and its parameter names
are untouched. A micro-batch whose whole stage is recomputed (`recompute_microbatches`, a
checkpoint around the stage) runs its units under their policies too: the checkpoint needs the
same saves in its rerun, and what an offloaded unit saves is then on the host already, so the
backward's rerun drops those saves instead of copying them again (`UnitSwitch.rerun`).

Measuring on CPU, where device and host are one memory: host buffers are allocated outside any
active TorchDispatchMode (as planner.runtime.offload_pool does), so a step's storage tracker
counts them as what they are, host memory, and `HostMemory` counts them instead (in use and
peak, released when autograd frees them).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineStage
from planner.runtime.pipeline_split import owner_of

POLICIES = ("keep", "recompute", "offload")


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


class UnitSwitch:
    """Shared by a stage's unit calls: `rerunning` while the backward reruns a micro-batch
    whose whole stage is checkpointed."""

    def __init__(self) -> None:
        self.rerunning = False

    @contextmanager
    def rerun(self) -> Iterator[None]:
        before, self.rerunning = self.rerunning, True
        try:
            yield
        finally:
            self.rerunning = before


class _HostCopy:
    """One saved tensor's host copy, shared by every save of the same tensor in a unit call;
    its device copy is made once in the backward and shared while alive."""

    def __init__(self, t: torch.Tensor, host: HostMemory) -> None:
        self.device = t.device
        pinned = t.device.type == "cuda"
        with _disable_current_modes():  # host memory: invisible to the step's device tracker
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
def offloaded(host: HostMemory, unit: nn.Module) -> Iterator[None]:
    """Saved tensors of what runs inside go to host memory, once per tensor (the unit's
    parameters, meta and empty tensors stay: copying them frees nothing)."""
    kept = frozenset(p.untyped_storage().data_ptr()
                     for p in (*unit.parameters(), *unit.buffers()))
    # a saved tensor's identity -> (its storage, its copy); the address may be reused once the
    # storage is freed, so a hit counts only while that storage lives
    copies: dict[tuple[Any, ...], tuple[StorageWeakRef, _HostCopy]] = {}

    def pack(t: torch.Tensor) -> Any:
        if t.is_meta or t.layout != torch.strided or t.numel() == 0:
            return t
        ptr = t.untyped_storage().data_ptr()
        if ptr in kept:
            return t
        key = (ptr, t.storage_offset(), tuple(t.size()), t.stride(), t.dtype, t._version)
        known = copies.get(key)
        if known is None or known[0].expired():
            known = copies[key] = (StorageWeakRef(t.untyped_storage()), _HostCopy(t, host))
        return known[1]

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        yield


class UnitCall(nn.Module):
    """One call of a unit in a stage's GraphModule, run under its policy."""

    def __init__(self, unit: nn.Module, name: str, policy: str, switch: UnitSwitch,
                 host: HostMemory) -> None:
        super().__init__()
        self.units = [unit]  # a list: not registered, so parameters keep the model's names
        self.name = name
        self.policy = policy
        self.switch = switch
        self.host = host

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        unit = self.units[0]
        if not torch.is_grad_enabled():
            return unit(*args, **kwargs)
        if self.policy == "recompute":
            return checkpoint(unit, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if self.switch.rerunning:  # the forward's host copies serve the backward: none again
            with torch.autograd.graph.saved_tensors_hooks(_drop, _never):
                return unit(*args, **kwargs)
        with offloaded(self.host, unit):
            return unit(*args, **kwargs)


def _drop(t: torch.Tensor) -> None:
    return None


def _never(packed: Any) -> torch.Tensor:
    raise RuntimeError("planner.runtime.pipeline_units: a dropped saved tensor was unpacked")


def check_unit_policies(stage: PipelineStage) -> dict[str, str]:
    """The stage's policies other than "keep"; one line for a module or policy it cannot run."""
    out: dict[str, str] = {}
    for name, policy in stage.unit_policies.items():
        if name not in stage.modules:
            raise InputError(
                f"partition: stage {stage.stage_index}'s unit_policies name {name!r}, which is "
                f"not one of its modules ({', '.join(stage.modules)}); name one of those"
            )
        if policy not in POLICIES:
            raise InputError(
                f"partition: stage {stage.stage_index}'s unit_policies give {name!r} the policy "
                f"{policy!r}; use one of {', '.join(POLICIES)}"
            )
        if policy != "keep":
            out[name] = policy
    return out


def apply_unit_policies(
    module: fx.GraphModule, policies: Mapping[str, str], switch: UnitSwitch, host: HostMemory
) -> list[UnitCall]:
    """Retarget every call of a unit with a policy (or of a module inside it) to a UnitCall
    registered on `module` (the unit itself stays registered where it was)."""
    named = list(policies)
    calls: list[UnitCall] = []
    for node in module.graph.nodes:
        if node.op != "call_module" or (owner := owner_of(str(node.target), named)) is None:
            continue
        call = UnitCall(module.get_submodule(str(node.target)), str(node.target),
                        policies[owner], switch, host)
        target = f"_unit_call_{len(calls)}"
        module.add_module(target, call)
        node.target = target
        calls.append(call)
    if calls:
        module.recompile()
    return calls
