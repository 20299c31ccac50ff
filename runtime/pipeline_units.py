"""A pipeline stage's own plan: per unit (a module the stage names), recompute or offload.

`PipelineStage.unit_policies` says, per module of a stage ('h.3'), what its saved activations do
in every micro-batch: "keep" (autograd's default), "recompute" (the unit runs under
non-reentrant `torch.utils.checkpoint`, RNG state replayed: only its inputs are kept until its
backward reruns it) or "offload" (every tensor autograd saves inside the unit is copied to host
memory after it is saved, and back to the device when the backward unpacks it, as
`torch.autograd.graph.save_on_cpu` does: pinned buffers on CUDA). A variant
(`PipelineStage.variants`) gives some micro-batches another unit plan: they run its policies,
saved ops and offloaded ops instead of the stage's (a unit kept in one micro-batch may be
recomputed or offloaded in another).

The units are leaf calls of the stage's `GraphModule` (planner.runtime.pipeline_split traces the
named modules as opaque calls), so `apply_unit_policies` retargets each call of a unit with a
policy other than "keep" in the stage's plan or in a variant to a `UnitCall` that runs the
user's module under the plan of the micro-batch the stage runs (`UnitSwitch.microbatch`, set by
the stage's forward; none, as in torch's metadata inference: the stage's plan); the model and
its parameter names are untouched. A micro-batch whose whole stage is recomputed
(`recompute_microbatches`, a checkpoint around the stage) runs its units under their policies
too: the checkpoint needs the same saves in its rerun, and what an offloaded unit saves is then
on the host already, so the backward's rerun drops those saves instead of copying them again
(`UnitSwitch.rerun`, told the micro-batch its forward ran: the rerun, in the backward, runs
the same plan).

Selective checkpointing (`PipelineStage.unit_saved_ops`): a "recompute" unit that names saved ops
('aten.addmm#0': the first call of aten.addmm in its forward) runs under a selective checkpoint
(`SavedOpsPolicy`, fresh per call): the checkpoint keeps those calls' outputs (MUST_SAVE) and
reruns every other op (PREFER_RECOMPUTE). Calls are counted per operator as the traced graph
names them ("aten." + the packet name, an in-place call as its functional op), views included
(the graph leaves views out, so views are not worth naming). A named call the forward does not
make is refused in one line (InputError) after the unit's first forward under that plan (the
stage's or a variant's, which the message names). In the rerun of a whole-stage checkpoint the
unit runs under a plain checkpoint: the backward reads the forward's kept outputs, so the rerun
keeps none again. A second backward through the unit (zero-bubble
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
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import (
    checkpoint,
)

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineStage, StageVariant, saved_op_parts
from planner.runtime.pipeline_split import owner_of
from planner.runtime.unit_ops import (  # op_name: re-exported
    CallOutputs,
    SavedOpsPolicy,
    op_name,
    selective_contexts,
)

POLICIES = ("keep", "recompute", "offload")
__all__ = ["HostMemory", "UnitCall", "UnitPlan", "UnitPolicies", "UnitSwitch",
           "apply_unit_policies", "check_unit_policies", "offloaded", "op_name"]


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
    """Shared by a stage's unit calls: the micro-batch the stage runs (`microbatch`, None
    outside a micro-batch: the stage's own plan), and `rerunning` while the backward reruns a
    micro-batch whose whole stage is checkpointed."""

    def __init__(self) -> None:
        self.rerunning = False
        self.microbatch: int | None = None

    @contextmanager
    def running(self, microbatch: int | None) -> Iterator[None]:
        """The unit calls inside run `microbatch`'s plan."""
        before, self.microbatch = self.microbatch, microbatch
        try:
            yield
        finally:
            self.microbatch = before

    @contextmanager
    def rerun(self, microbatch: int | None = None) -> Iterator[None]:
        """The backward's rerun of `microbatch` (the one its forward ran: its plan again)."""
        before, self.rerunning = self.rerunning, True
        try:
            with self.running(microbatch):
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


@dataclass(frozen=True)
class UnitPlan:
    """What one call of a unit does in a micro-batch: its policy, the calls a "recompute" unit
    keeps (`saved_ops`), those an "offload" unit moves (`offload_ops`), and `where` its plan's
    field is named in a refusal ("partition: stage 0's variants[1].unit_saved_ops['h.3']")."""

    policy: str = "keep"
    saved_ops: tuple[str, ...] = ()
    offload_ops: tuple[str, ...] = ()
    where: str = ""


class UnitCall(nn.Module):
    """One call of a unit in a stage's GraphModule, run under the plan of the micro-batch the
    stage runs (`variants`: micro-batch -> its plan; the others, and calls outside a micro-batch,
    run `policy`, `saved_ops`, `offload_ops`); a "recompute" plan with saved ops runs under a
    selective checkpoint (`observed`: the last such forward's calls per op)."""

    def __init__(self, unit: nn.Module, name: str, policy: str, switch: UnitSwitch,
                 host: HostMemory, saved_ops: Sequence[str] = (), where: str = "",
                 offload_ops: Sequence[str] = (),
                 variants: Mapping[int, UnitPlan] | None = None) -> None:
        super().__init__()
        self.units = [unit]  # a list: not registered, so parameters keep the model's names
        self.name = name
        self.switch = switch
        self.host = host
        field = "unit_offload_ops" if offload_ops else "unit_saved_ops"
        self.own = UnitPlan(policy, tuple(saved_ops), tuple(offload_ops),
                            where or f"{field}[{name!r}]")
        self.variants = dict(variants or {})
        self.observed: Counter[str] | None = None  # set by a selective forward
        self.checked: set[UnitPlan] = set()  # plans whose named calls were found

    @property
    def policy(self) -> str:
        return self.own.policy

    def plan_of(self, microbatch: int | None) -> UnitPlan:
        """The plan micro-batch `microbatch` runs (None: the stage's own)."""
        return self.own if microbatch is None else self.variants.get(microbatch, self.own)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        unit = self.units[0]
        plan = self.plan_of(self.switch.microbatch)
        if plan.policy == "keep" or not torch.is_grad_enabled():
            return unit(*args, **kwargs)
        if plan.policy == "recompute" and plan.saved_ops and not self.switch.rerunning:
            return self._selective(plan, unit, *args, **kwargs)
        if plan.policy == "recompute":
            return checkpoint(unit, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if self.switch.rerunning:  # the forward's host copies serve the backward: none again
            with torch.autograd.graph.saved_tensors_hooks(_drop, _never):
                return unit(*args, **kwargs)
        if not plan.offload_ops:
            with offloaded(self.host, unit):
                return unit(*args, **kwargs)
        calls = CallOutputs(plan.offload_ops)  # fresh per call: its counts start at 0
        with offloaded(self.host, unit, calls):
            out = unit(*args, **kwargs)
        self._check(plan, calls.counts, calls.missing())
        return out

    def _selective(self, plan: UnitPlan, unit: nn.Module, *args: Any, **kwargs: Any) -> Any:
        policy = SavedOpsPolicy(plan.saved_ops)  # fresh per call: its counts start at 0
        out = checkpoint(unit, *args, use_reentrant=False, preserve_rng_state=True,
                         context_fn=functools.partial(selective_contexts, policy), **kwargs)
        self._check(plan, policy.counts, policy.missing())
        return out

    def _check(self, plan: UnitPlan, counts: Counter[str],
               missing: list[tuple[str, int]]) -> None:
        """After the unit's first forward under `plan`: one line for a named call it did not
        make."""
        self.observed = counts
        if plan not in self.checked:
            if missing:
                name, calls = missing[0]
                op = saved_op_parts(name)[0]
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise InputError(
                    f"{plan.where}: {name!r}{more} is not a call of the unit's forward "
                    f"({op} is called {calls} time{'' if calls == 1 else 's'} there); name calls "
                    "'OP#K' with K below that"
                )
            self.checked.add(plan)


def _drop(t: torch.Tensor) -> None:
    return None


def _never(packed: Any) -> torch.Tensor:
    raise RuntimeError("planner.runtime.pipeline_units: a dropped saved tensor was unpacked")


class UnitPolicies(dict[str, str]):
    """A stage's policies other than "keep", by unit, its recompute units' saved ops
    (`saved_ops`, PipelineStage.unit_saved_ops less empty lists) and its offload units' moved
    calls (`offload_ops`, PipelineStage.unit_offload_ops); `variants`, the same for each of its
    variants (`microbatches`: those running it; `label`: 'variants[k].', the field's prefix)."""

    def __init__(self, policies: Mapping[str, str], stage_index: int = 0,
                 saved_ops: Mapping[str, Sequence[str]] | None = None,
                 offload_ops: Mapping[str, Sequence[str]] | None = None,
                 microbatches: Sequence[int] = (), label: str = "") -> None:
        super().__init__(policies)
        self.stage_index = stage_index
        self.saved_ops = {u: tuple(ops) for u, ops in (saved_ops or {}).items() if ops}
        self.offload_ops = {u: tuple(ops) for u, ops in (offload_ops or {}).items() if ops}
        self.microbatches = tuple(microbatches)
        self.label = label
        self.variants: list[UnitPolicies] = []

    def units(self) -> list[str]:
        """Every unit with a policy other than "keep" in the stage's plan or a variant's."""
        return list(dict.fromkeys(u for plan in (self, *self.variants) for u in plan))


def _check_plan(stage: PipelineStage, plan: PipelineStage | StageVariant,
                label: str = "") -> UnitPolicies:
    """One unit plan of the stage (its own, or a variant's, `label` 'variants[k].'): its
    policies other than "keep"; one line for a module or policy it cannot run."""
    what = f"partition: stage {stage.stage_index}'s {label}"
    out: dict[str, str] = {}
    for name, policy in plan.unit_policies.items():
        if name not in stage.modules:
            raise InputError(
                f"{what}unit_policies name {name!r}, which is not one of its modules "
                f"({', '.join(stage.modules)}); name one of those"
            )
        if policy not in POLICIES:
            raise InputError(
                f"{what}unit_policies give {name!r} the policy {policy!r}; use one of "
                f"{', '.join(POLICIES)}"
            )
        if policy != "keep":
            out[name] = policy
    saved = getattr(plan, "unit_saved_ops", None) or {}
    moved = getattr(plan, "unit_offload_ops", None) or {}
    for field, named, policy in (("unit_saved_ops", saved, "recompute"),
                                 ("unit_offload_ops", moved, "offload")):
        for name in named:
            if out.get(name) != policy:
                raise InputError(
                    f"{what}{field} name {name!r}, which is not one of its {policy!r} units; "
                    f"give it unit_policies {policy!r} or drop it"
                )
    microbatches = plan.microbatches if isinstance(plan, StageVariant) else ()
    return UnitPolicies(out, stage.stage_index, saved, moved, microbatches, label)


def check_unit_policies(stage: PipelineStage) -> UnitPolicies:
    """The stage's policies other than "keep" (with its saved ops) and its variants'; one line
    for a module or policy a plan cannot run, or a micro-batch in two variants."""
    out = _check_plan(stage, stage)
    seen: set[int] = set()
    for k, variant in enumerate(getattr(stage, "variants", None) or []):
        plan = _check_plan(stage, variant, f"variants[{k}].")
        twice = sorted(mb for mb in plan.microbatches if mb in seen or mb < 0)
        if twice:
            raise InputError(
                f"partition: stage {stage.stage_index}'s variants[{k}].microbatches name "
                f"{twice[0]}, which is negative or in an earlier variant; give each micro-batch "
                "one variant at most"
            )
        seen |= set(plan.microbatches)
        out.variants.append(plan)
    return out


def _unit_plan(policies: Mapping[str, str], unit: str) -> UnitPlan:
    """`unit`'s plan in one of check_unit_policies' plans (or a plain mapping of policies)."""
    policy = policies.get(unit, "keep")
    saved: Mapping[str, Sequence[str]] = getattr(policies, "saved_ops", {})
    moved: Mapping[str, Sequence[str]] = getattr(policies, "offload_ops", {})
    field = "unit_offload_ops" if policy == "offload" else "unit_saved_ops"
    stage = getattr(policies, "stage_index", None)
    where = f"{getattr(policies, 'label', '')}{field}[{unit!r}]"
    return UnitPlan(policy, tuple(saved.get(unit, ())) if policy == "recompute" else (),
                    tuple(moved.get(unit, ())) if policy == "offload" else (),
                    where if stage is None else f"partition: stage {stage}'s {where}")


def apply_unit_policies(
    module: fx.GraphModule, policies: Mapping[str, str], switch: UnitSwitch, host: HostMemory
) -> list[UnitCall]:
    """Retarget every call of a unit with a policy other than "keep" in the stage's plan or a
    variant's (or of a module inside it) to a UnitCall registered on `module` (the unit itself
    stays registered where it was); `policies` from check_unit_policies carry the saved and
    offloaded ops and the variants (a plain mapping: the stage's policies only)."""
    variants: Sequence[UnitPolicies] = getattr(policies, "variants", [])
    named = policies.units() if isinstance(policies, UnitPolicies) else list(policies)
    calls: list[UnitCall] = []
    for node in module.graph.nodes:
        if node.op != "call_module" or (owner := owner_of(str(node.target), named)) is None:
            continue
        own = _unit_plan(policies, owner)
        per_microbatch = {mb: _unit_plan(v, owner) for v in variants for mb in v.microbatches}
        call = UnitCall(module.get_submodule(str(node.target)), str(node.target), own.policy,
                        switch, host, own.saved_ops, own.where, own.offload_ops, per_microbatch)
        target = f"_unit_call_{len(calls)}"
        module.add_module(target, call)
        node.target = target
        calls.append(call)
    if calls:
        module.recompile()
    return calls
