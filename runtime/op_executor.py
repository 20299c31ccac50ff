"""Executing an op-level plan on the traced joint forward+backward fx graph.

A graph node is a group of fx nodes (`TraceResult.node_fx_names`). `compute(v)` runs the
group's fx nodes in fx order and keeps their values; `free(v)` drops them, so the tensors die
when nothing else holds them. Each segment is compiled to straight-line Python once per applied
plan (`planner.runtime.op_codegen`). The plan is split at the first computation that needs the
loss's
tangent: the prefix runs in the autograd forward, what is resident at the split is what stays
alive between forward and backward, and the suffix (with its recomputations, in the plan's
order) runs in the autograd backward.

View-like fx nodes of parameters or tangents (`t(weight)`, `expand(tangent)`) belong to no
producing group in the graph model: they are re-derived on the spot when a group reads them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from planner.core.plan import Action, ActionOp
from planner.core.resources import Resources
from planner.runtime.op_codegen import (
    MUTATION_APPLIED,
    CompiledSegment,
    PlanExecutionError,
    SegmentCompiler,
    resident_sets,
)
from planner.runtime.rng import RngStates
from planner.sim.simulator import PlanError, loss_rule_error, simulate
from planner.tracing.records import draws_random

__all__ = ["JointProgram", "PlanExecutionError", "PlanRun", "Segment"]

_VIEW_OPS = {"_unsafe_view", "alias", "detach", "lift_fresh", "t", "view", "expand"}


def _is_view(node: fx.Node) -> bool:
    """Costs no storage of its own: getitem, or an op whose schema returns an alias."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target.overloadpacket.__name__ in _VIEW_OPS:
        return True
    return any(r.alias_info is not None for r in target._schema.returns)


@dataclass(frozen=True)
class Segment:
    """Actions of one autograd phase: the forward prefix or the backward suffix."""

    start: int  # index of the first action in the plan
    actions: tuple[Action, ...]


class JointProgram:
    """The joint fx graph indexed for plan execution; built once per applied plan."""

    def __init__(self, trace: Any, actions: Sequence[Action],
                 resources: Resources | None = None) -> None:
        gm: fx.GraphModule = trace.joint
        self.fx_nodes: dict[str, fx.Node] = {n.name: n for n in gm.graph.nodes}
        self.members: dict[int, tuple[str, ...]] = {
            int(k): tuple(v) for k, v in trace.node_fx_names.items()
        }
        self.group_of: dict[str, int] = {m: g for g, ms in self.members.items() for m in ms}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.tangents: tuple[str, ...] = tuple(trace.tangent_fx_names)
        self.primals: tuple[str, ...] = tuple(
            n.name for n in placeholders if n.name not in self.tangents
        )
        self.primal_kinds: dict[str, str] = dict(trace.primal_kinds)
        self.primal_names: dict[str, str] = dict(trace.primal_names)
        self.loss_fx: str = trace.loss_fx_name
        # clones the joint graph makes for an identity dropout (p = 0, eval): eager returns the
        # input itself, and the tracer sized them as views of it; run them as that alias
        self.identity_fx: frozenset[str] = frozenset(
            (getattr(trace, "details", None) or {}).get("identity_dropout_fx_names", ())
        )
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self.grad_fx, self.mutations = _outputs(output, len(self.primals))
        self.output_fx: set[str] = {self.loss_fx, *self.grad_fx.values(), *self.mutations}
        self.grad_of: dict[str, int] = {name: k for k, name in self.grad_fx.items()}
        # primals whose gradient nothing but the step's output reads: added into an existing
        # .grad as soon as it is made (PlanRun._in_parameter_layout)
        self.sole_grads: frozenset[int] = frozenset(
            k for k, name in self.grad_fx.items()
            if all(u.op == "output" for u in self.fx_nodes[name].users))
        self.derivable: set[str] = self._derivable(gm)
        self.random: set[str] = {n.name for n in gm.graph.nodes if draws_random(n)}
        # What may run is the simulator's to say (one rule, one message): it also refuses a
        # backward op before the loss, which this split into forward and backward relies on.
        self.graph = trace.graph
        self.resources = resources
        try:
            self.simulation = simulate(self.graph, actions, resources)
        except PlanError as e:
            raise PlanExecutionError(str(e)) from None
        self._prepare()
        self.forward, self.backward = self._split(actions)
        # Residency is checked here, once: a plan that cannot run is refused before any step.
        compiler = self._compiler()
        self.forward_code = compiler.compile(self.forward)
        self.backward_code = compiler.compile(self.backward, self.tangents)
        self._compiled(compiler)

    # Hooks for programs whose plans do more than compute and free
    # (planner.runtime.offload_program).
    def _prepare(self) -> None:
        """Set-up a subclass needs before the plan is split and compiled."""

    def _compiler(self) -> SegmentCompiler:
        return SegmentCompiler(self)

    def _compiled(self, compiler: SegmentCompiler) -> None:
        """Called with the compiler once both segments are compiled."""

    @property
    def resident_after(self) -> tuple[frozenset[int], ...]:
        """Graph nodes the generated code holds after each action (the runtime's resident
        sets, tied to the simulator's by tests): computed on demand, as it is quadratic; a
        subclass whose compiler records them (planner.runtime.offload_program) sets them."""
        recorded: tuple[frozenset[int], ...] | None = self.__dict__.get("_resident_after")
        if recorded is not None:
            return recorded
        return tuple(resident_sets([*self.forward.actions, *self.backward.actions]))

    @resident_after.setter
    def resident_after(self, value: tuple[frozenset[int], ...]) -> None:
        self.__dict__["_resident_after"] = value

    def _derivable(self, gm: fx.GraphModule) -> set[str]:
        """View-like fx nodes computed from placeholders only: cheap to re-derive anywhere."""
        out: set[str] = set()
        for n in gm.graph.nodes:
            if n.op != "call_function" or not _is_view(n):
                continue
            if all(a.op == "placeholder" or a.name in out for a in n.all_input_nodes):
                out.add(n.name)
        return out

    def _split(self, actions: Sequence[Action]) -> tuple[Segment, Segment]:
        needs_tangent: set[str] = set(self.tangents)
        for n in self.fx_nodes.values():
            if any(a.name in needs_tangent for a in n.all_input_nodes):
                needs_tangent.add(n.name)
        tangent_groups = {self.group_of[m] for m in needs_tangent if m in self.group_of}
        loss_group = self.group_of.get(self.loss_fx)
        if loss_group is None:
            raise PlanExecutionError(f"the loss fx node {self.loss_fx!r} is in no graph node")
        split = len(actions)
        loss_at: int | None = None
        for i, a in enumerate(actions):
            if a.op is not ActionOp.compute:
                continue
            if a.node == loss_group and loss_at is None:
                loss_at = i
            if a.node in tangent_groups:
                split = i
                break
        if loss_at is None:
            # The simulator's loss rule (graph.index.order_predecessors) refuses such a plan
            # before it gets here; this names the same rule in the same words should a plan
            # reach the executor unchecked.
            a = actions[split]
            raise PlanExecutionError(str(loss_rule_error(self.graph, split, a, a.node, loss_group)))
        return (
            Segment(0, tuple(actions[:split])),
            Segment(split, tuple(actions[split:])),
        )


class PlanRun:
    """The state of one training step under a plan: values held, primals, RNG record."""

    def __init__(self, program: JointProgram, primals: Sequence[torch.Tensor]) -> None:
        self.program = program
        self.values: dict[str, Any] = dict(zip(program.primals, primals, strict=True))
        self.primal_tensors = tuple(primals)  # the parameters themselves (their .grad)
        self.kept_outputs: dict[str, Any] = {}  # loss/gradients/mutations of freed groups
        device = next(
            (p.device for p in primals if isinstance(p, torch.Tensor)), torch.device("cpu")
        )
        self.rng = RngStates(device)
        self.mutated: set[str] = set()  # buffer updates already copied back
        self.computations = 0

    # -- segments -------------------------------------------------------------------------
    def run_forward(self) -> torch.Tensor:
        self._run(self.program.forward_code)
        loss = self.output(self.program.loss_fx)
        self._apply_mutations()
        return loss

    def run_backward(self, tangents: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """The plan's suffix; gradients in primal order (None for primals without one)."""
        self.values.update(zip(self.program.tangents, tangents, strict=True))
        self._run(self.program.backward_code)
        self._apply_mutations()
        grads: list[torch.Tensor | None] = []
        for k in range(len(self.program.primals)):
            name = self.program.grad_fx.get(k)
            grads.append(None if name is None else self.output(name))
        self.values.clear()
        self.kept_outputs.clear()
        return grads

    def output(self, fx_name: str) -> Any:
        if fx_name in self.kept_outputs:
            return self.kept_outputs[fx_name]
        if fx_name not in self.values:
            group = self.program.group_of.get(fx_name)
            raise PlanExecutionError(
                f"output {fx_name} (node {group}) was never computed by the plan"
            )
        return self.values[fx_name]

    def _run(self, code: CompiledSegment) -> None:
        code.function(self.values, self.kept_outputs, self.rng.run, self._in_parameter_layout)
        self.computations += code.computations

    def _in_parameter_layout(self, grad: Any, primal_index: int) -> Any:
        """A gradient with its parameter's strides, so that autograd adopts it as `.grad`.

        A gradient that is a transposed view (Linear weights) would otherwise be copied by
        gradient accumulation at the end of the backward, while the plan counted it once.
        Where the parameter holds a .grad already (gradient accumulation: the second and later
        micro-batches) the gradient is added into it here and dies, as eager's AccumulateGrad
        does when the gradient is made (None goes to autograd then): returned to autograd, every
        new gradient would be alive at once at the end of the backward, on top of .grad (the
        simulator charges each only while its node runs: MemoryLedger.accumulated_bytes).
        """
        param = self.values.get(self.program.primals[primal_index])
        if not isinstance(grad, torch.Tensor) or not isinstance(param, torch.Tensor):
            return grad
        owner = self.primal_tensors[primal_index]
        if (primal_index in self.program.sole_grads and owner.grad is not None
                and owner.grad.shape == grad.shape and not owner.grad.is_sparse):
            owner.grad.add_(grad)
            return None
        if grad.stride() == param.stride() and grad.storage_offset() == 0:
            return grad
        out = torch.empty_strided(param.shape, param.stride(), dtype=grad.dtype, device=grad.device)
        return out.copy_(grad)

    def _apply_mutations(self) -> None:
        """Copy new buffer values (e.g. BatchNorm running stats) into the buffers once."""
        for name, primal_index in list(self.program.mutations.items()):
            value = self.kept_outputs.get(name, self.values.get(name))
            if value is MUTATION_APPLIED:  # copied back at its first free by the plan's code
                self.mutated.add(name)
            if value is None or name in self.mutated:
                continue
            buffer = self.values.get(self.program.primals[primal_index])
            if isinstance(buffer, torch.Tensor):
                with torch.no_grad():
                    buffer.copy_(value)
            self.mutated.add(name)


def _outputs(output: fx.Node, num_primals: int) -> tuple[dict[int, str], dict[str, int]]:
    """Joint outputs: primal index -> gradient fx name; mutated-buffer fx name -> primal index."""
    outs: list[Any] = list(output.args[0])  # type: ignore[arg-type]
    descs = output.meta.get("desc") or [None] * len(outs)
    grads: dict[int, str] = {}
    mutations: dict[str, int] = {}
    for out, desc in zip(outs, descs, strict=False):
        if out is None or desc is None:
            continue
        kind = type(desc).__name__
        if kind.startswith("Grad"):
            idx = getattr(getattr(desc, "grad_of", None), "idx", None)
            if isinstance(idx, int) and idx < num_primals:
                grads[idx] = out.name
        elif "Mutation" in kind:
            idx = getattr(getattr(desc, "mutated_input", None), "idx", None)
            if isinstance(idx, int) and idx < num_primals:
                mutations[out.name] = idx
    return grads, mutations
