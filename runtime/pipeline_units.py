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

Selective checkpointing (`PipelineStage.unit_saved_ops`): a "recompute" unit that names saved ops
('aten.addmm#0': the first call of aten.addmm in its forward) runs under a selective checkpoint
(`SavedOpsPolicy`, fresh per call): the checkpoint keeps those calls' outputs (MUST_SAVE) and
reruns every other op (PREFER_RECOMPUTE). Calls are counted per operator as the traced graph
names them ("aten." + the packet name, an in-place call as its functional op), views included
(the graph leaves views out, so views are not worth naming). A named call the forward does not
make is refused in one line (InputError) after the unit's first forward. In the rerun of a
whole-stage checkpoint the unit runs under a plain checkpoint: the backward reads the forward's
kept outputs, so the rerun keeps none again. A second backward through the unit (zero-bubble
schedules split it into inputs' and weights' gradients) recomputes what the first consumed.

Measuring on CPU, where device and host are one memory: host buffers are allocated outside any
active TorchDispatchMode (as planner.runtime.offload_pool does), so a step's storage tracker
counts them as what they are, host memory, and `HostMemory` counts them instead (in use and
peak, released when autograd frees them).
"""

from __future__ import annotations

import functools
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import (
    checkpoint,
)

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineStage, saved_op_parts
from planner.runtime.pipeline_split import owner_of
from planner.runtime.unit_ops import (  # op_name: re-exported
    CallOutputs,
    SavedOpsPolicy,
    op_name,
    selective_contexts,
)

POLICIES = ("keep", "recompute", "offload")
__all__ = ["HostMemory", "UnitCall", "UnitPolicies", "UnitSwitch", "apply_unit_policies",
           "check_unit_policies", "offloaded", "op_name"]


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


class UnitCall(nn.Module):
    """One call of a unit in a stage's GraphModule, run under its policy; a "recompute" unit
    with `saved_ops` under a selective checkpoint (`observed`: its forward's calls per op)."""

    def __init__(self, unit: nn.Module, name: str, policy: str, switch: UnitSwitch,
                 host: HostMemory, saved_ops: Sequence[str] = (), where: str = "",
                 offload_ops: Sequence[str] = ()) -> None:
        super().__init__()
        self.units = [unit]  # a list: not registered, so parameters keep the model's names
        self.name = name
        self.policy = policy
        self.switch = switch
        self.host = host
        self.saved_ops = tuple(saved_ops)
        self.offload_ops = tuple(offload_ops)
        field = "unit_offload_ops" if self.offload_ops else "unit_saved_ops"
        self.where = where or f"{field}[{name!r}]"
        self.observed: Counter[str] | None = None  # set by a selective forward
        self.checked = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        unit = self.units[0]
        if not torch.is_grad_enabled():
            return unit(*args, **kwargs)
        if self.policy == "recompute" and self.saved_ops and not self.switch.rerunning:
            return self._selective(unit, *args, **kwargs)
        if self.policy == "recompute":
            return checkpoint(unit, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if self.switch.rerunning:  # the forward's host copies serve the backward: none again
            with torch.autograd.graph.saved_tensors_hooks(_drop, _never):
                return unit(*args, **kwargs)
        if not self.offload_ops:
            with offloaded(self.host, unit):
                return unit(*args, **kwargs)
        calls = CallOutputs(self.offload_ops)  # fresh per call: its counts start at 0
        with offloaded(self.host, unit, calls):
            out = unit(*args, **kwargs)
        self._check(calls.counts, calls.missing())
        return out

    def _selective(self, unit: nn.Module, *args: Any, **kwargs: Any) -> Any:
        policy = SavedOpsPolicy(self.saved_ops)  # fresh per call: its counts start at 0
        out = checkpoint(unit, *args, use_reentrant=False, preserve_rng_state=True,
                         context_fn=functools.partial(selective_contexts, policy), **kwargs)
        self._check(policy.counts, policy.missing())
        return out

    def _check(self, counts: Counter[str], missing: list[tuple[str, int]]) -> None:
        """After the unit's first forward: one line for a named call it did not make."""
        self.observed = counts
        if not self.checked:
            if missing:
                name, calls = missing[0]
                op = saved_op_parts(name)[0]
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise InputError(
                    f"{self.where}: {name!r}{more} is not a call of the unit's forward "
                    f"({op} is called {calls} time{'' if calls == 1 else 's'} there); name calls "
                    "'OP#K' with K below that"
                )
            self.checked = True


def _drop(t: torch.Tensor) -> None:
    return None


def _never(packed: Any) -> torch.Tensor:
    raise RuntimeError("planner.runtime.pipeline_units: a dropped saved tensor was unpacked")


class UnitPolicies(dict[str, str]):
    """A stage's policies other than "keep", by unit, its recompute units' saved ops
    (`saved_ops`, PipelineStage.unit_saved_ops less empty lists) and its offload units' moved
    calls (`offload_ops`, PipelineStage.unit_offload_ops)."""

    def __init__(self, policies: Mapping[str, str], stage_index: int = 0,
                 saved_ops: Mapping[str, Sequence[str]] | None = None,
                 offload_ops: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(policies)
        self.stage_index = stage_index
        self.saved_ops = {u: tuple(ops) for u, ops in (saved_ops or {}).items() if ops}
        self.offload_ops = {u: tuple(ops) for u, ops in (offload_ops or {}).items() if ops}


def check_unit_policies(stage: PipelineStage) -> UnitPolicies:
    """The stage's policies other than "keep" (with its saved ops); one line for a module or
    policy it cannot run."""
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
    saved = getattr(stage, "unit_saved_ops", None) or {}
    moved = getattr(stage, "unit_offload_ops", None) or {}
    for field, named, policy in (("unit_saved_ops", saved, "recompute"),
                                 ("unit_offload_ops", moved, "offload")):
        for name in named:
            if out.get(name) != policy:
                raise InputError(
                    f"partition: stage {stage.stage_index}'s {field} name {name!r}, which is not "
                    f"one of its {policy!r} units; give it unit_policies {policy!r} or drop it"
                )
    return UnitPolicies(out, stage.stage_index, saved, moved)


def apply_unit_policies(
    module: fx.GraphModule, policies: Mapping[str, str], switch: UnitSwitch, host: HostMemory
) -> list[UnitCall]:
    """Retarget every call of a unit with a policy (or of a module inside it) to a UnitCall
    registered on `module` (the unit itself stays registered where it was); `policies` from
    check_unit_policies carry the recompute units' saved ops."""
    named = list(policies)
    saved: Mapping[str, Sequence[str]] = getattr(policies, "saved_ops", {})
    moved: Mapping[str, Sequence[str]] = getattr(policies, "offload_ops", {})
    stage = getattr(policies, "stage_index", None)
    calls: list[UnitCall] = []
    for node in module.graph.nodes:
        if node.op != "call_module" or (owner := owner_of(str(node.target), named)) is None:
            continue
        offload = policies[owner] == "offload"
        field = "unit_offload_ops" if offload else "unit_saved_ops"
        where = f"partition: stage {stage}'s {field}[{owner!r}]" if stage is not None \
            else f"{field}[{owner!r}]"
        ops = saved.get(owner, ()) if policies[owner] == "recompute" else ()
        call = UnitCall(module.get_submodule(str(node.target)), str(node.target),
                        policies[owner], switch, host, ops, where,
                        moved.get(owner, ()) if offload else ())
        target = f"_unit_call_{len(calls)}"
        module.add_module(target, call)
        node.target = target
        calls.append(call)
    if calls:
        module.recompile()
    return calls
