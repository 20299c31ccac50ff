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

A policy may name a submodule of a unit ('h.3.mlp'; its saved ops counted in its own
forward): the unit's call then runs the module as it is, with the submodule's instance
`forward` rebound for the call to one that runs it under its plan (`UnitPlan.inner`) and
restored after, so a checkpoint of the MLP alone keeps its input and reruns only the MLP.

The host copies of an offloaded unit: planner.runtime.unit_offload.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils.checkpoint import checkpoint

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineStage, StageVariant, saved_op_parts
from planner.runtime.pipeline_split import owner_of
from planner.runtime.unit_offload import HostMemory, drop_saved, never_unpacked, offloaded
from planner.runtime.unit_ops import (  # op_name: re-exported
    CallOutputs,
    SavedOpsPolicy,
    op_name,
    selective_contexts,
)

POLICIES = ("keep", "recompute", "offload")
__all__ = ["HostMemory", "UnitCall", "UnitPlan", "UnitPolicies", "UnitSwitch",
           "apply_unit_policies", "check_unit_policies", "offloaded", "op_name"]


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


@dataclass(frozen=True)
class UnitPlan:
    """What one call of a unit does in a micro-batch: its policy, the calls a "recompute" unit
    keeps (`saved_ops`), those an "offload" unit moves (`offload_ops`), and `where` its plan's
    field is named in a refusal ("partition: stage 0's variants[1].unit_saved_ops['h.3']")."""

    policy: str = "keep"
    saved_ops: tuple[str, ...] = ()
    offload_ops: tuple[str, ...] = ()
    where: str = ""
    inner: tuple[tuple[str, UnitPlan], ...] = ()  # (submodule path in the unit, its plan)


class UnitCall(nn.Module):
    """One call of a unit in a stage's GraphModule, run under the plan of the micro-batch the
    stage runs (`variants`: micro-batch -> its plan; the others, and calls outside a micro-batch,
    run `policy`, `saved_ops`, `offload_ops`); a "recompute" plan with saved ops runs under a
    selective checkpoint (`observed`: the last such forward's calls per op)."""

    def __init__(self, unit: nn.Module, name: str, policy: str, switch: UnitSwitch,
                 host: HostMemory, saved_ops: Sequence[str] = (), where: str = "",
                 offload_ops: Sequence[str] = (),
                 variants: Mapping[int, UnitPlan] | None = None,
                 inner: tuple[tuple[str, UnitPlan], ...] = ()) -> None:
        super().__init__()
        self.units = [unit]  # a list: not registered, so parameters keep the model's names
        self.name = name
        self.switch = switch
        self.host = host
        field = "unit_offload_ops" if offload_ops else "unit_saved_ops"
        self.own = UnitPlan(policy, tuple(saved_ops), tuple(offload_ops),
                            where or f"{field}[{name!r}]", inner)
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
        if not torch.is_grad_enabled():
            return unit(*args, **kwargs)
        if not plan.inner:
            return self._run(plan, unit, unit, *args, **kwargs)
        with self._inner_plans(unit, plan.inner):
            return self._run(plan, unit, unit, *args, **kwargs)

    @contextmanager
    def _inner_plans(self, unit: nn.Module,
                     inner: tuple[tuple[str, UnitPlan], ...]) -> Iterator[None]:
        """Each named submodule's forward runs under its own plan meanwhile (its instance's
        `forward` rebound, then restored: the model is otherwise untouched)."""
        subs = [(unit.get_submodule(path), plan) for path, plan in inner]
        try:
            for sub, plan in subs:
                own = sub.forward
                sub.forward = functools.partial(self._run, plan, own, sub)
            yield
        finally:
            for sub, _ in subs:
                sub.__dict__.pop("forward", None)

    def _run(self, plan: UnitPlan, fn: Callable[..., Any], module: nn.Module, *args: Any,
             **kwargs: Any) -> Any:
        """`fn` (the unit, or a submodule's own forward) under `plan`; `module`: what it runs
        (its parameters are never copied to the host)."""
        if plan.policy == "keep":
            return fn(*args, **kwargs)
        if plan.policy == "recompute" and plan.saved_ops and not self.switch.rerunning:
            return self._selective(plan, fn, *args, **kwargs)
        if plan.policy == "recompute":
            return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        if self.switch.rerunning:  # the forward's host copies serve the backward: none again
            with torch.autograd.graph.saved_tensors_hooks(drop_saved, never_unpacked):
                return fn(*args, **kwargs)
        if not plan.offload_ops:
            with offloaded(self.host, module):
                return fn(*args, **kwargs)
        calls = CallOutputs(plan.offload_ops)  # fresh per call: its counts start at 0
        with offloaded(self.host, module, calls):
            out = fn(*args, **kwargs)
        self._check(plan, calls.counts, calls.missing())
        return out

    def _selective(self, plan: UnitPlan, fn: Callable[..., Any], *args: Any,
                   **kwargs: Any) -> Any:
        policy = SavedOpsPolicy(plan.saved_ops)  # fresh per call: its counts start at 0
        out = checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True,
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
        if owner_of(name, stage.modules) is None:
            raise InputError(
                f"{what}unit_policies name {name!r}, which is not one of its modules "
                f"({', '.join(stage.modules)}) nor inside one; name one of those or a "
                "submodule of one"
            )
        outer = owner_of(name.rpartition(".")[0], list(plan.unit_policies))
        if outer is not None:
            raise InputError(
                f"{what}unit_policies name {name!r} inside {outer!r}, which has a policy too; "
                "give a policy to one of them"
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
    """`unit`'s plan in one of check_unit_policies' plans (or a plain mapping of policies),
    with its submodules' plans where policies name them."""
    inner = tuple((name[len(unit) + 1:], _unit_plan(policies, name))
                  for name in policies if name.startswith(unit + "."))
    if inner:
        return UnitPlan(inner=inner)
    policy = policies.get(unit, "keep")
    saved: Mapping[str, Sequence[str]] = getattr(policies, "saved_ops", {})
    moved: Mapping[str, Sequence[str]] = getattr(policies, "offload_ops", {})
    field = "unit_offload_ops" if policy == "offload" else "unit_saved_ops"
    stage = getattr(policies, "stage_index", None)
    where = f"{getattr(policies, 'label', '')}{field}[{unit!r}]"
    return UnitPlan(policy, tuple(saved.get(unit, ())) if policy == "recompute" else (),
                    tuple(moved.get(unit, ())) if policy == "offload" else (),
                    where if stage is None else f"partition: stage {stage}'s {where}")


def _check_inner(unit: nn.Module, name: str, plans: Sequence[UnitPlan],
                 policies: Mapping[str, str]) -> None:
    """One line for a policy naming a submodule the unit does not have."""
    for plan in plans:
        for path, _ in plan.inner:
            try:
                unit.get_submodule(path)
            except AttributeError:
                stage = getattr(policies, "stage_index", 0)
                full = f"{name}.{path}"
                raise InputError(
                    f"partition: stage {stage}'s unit_policies name {full!r}, which the "
                    f"model's {name!r} does not have; name one of its submodules "
                    f"({', '.join(n for n, _ in unit.named_children())})"
                ) from None


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
        if node.op != "call_module":
            continue
        target = str(node.target)
        owner = owner_of(target, named)
        if owner is None and any(n.startswith(target + ".") for n in named):
            owner = target  # a call whose submodules have policies
        if owner is None:
            continue
        own = _unit_plan(policies, owner)
        per_microbatch = {mb: _unit_plan(v, owner) for v in variants for mb in v.microbatches}
        _check_inner(module.get_submodule(target), target,
                     [own, *per_microbatch.values()], policies)
        call = UnitCall(module.get_submodule(target), target, own.policy, switch, host,
                        own.saved_ops, own.where, own.offload_ops, per_microbatch, own.inner)
        name = f"_unit_call_{len(calls)}"
        module.add_module(name, call)
        node.target = name
        calls.append(call)
    if calls:
        module.recompile()
    return calls
