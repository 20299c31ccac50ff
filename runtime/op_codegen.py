"""Compiling a plan segment into one Python function: the plan is fixed, so which fx values are
resident at every action is known before the step runs.

Interpreting the joint graph node by node (argument mapping, residency checks, lookups) cost
about 10 µs per fx node, ~15 % of a small GPT's step on CPU. Here residency is checked once, at
compile time (errors name the action and node), and the step runs straight-line code:
`V['mm_3'] = T[7](V['view_2'], V['t_1'])`, `K.setdefault('mm_3', V.pop('mm_3', None))`.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from planner.core.plan import ActionOp
from planner.sim.ledger import resident_after

# The generated function: (values, kept outputs, random-op runner, gradient layout fixer).
SegmentFunction = Callable[
    [dict[str, Any], dict[str, Any], Callable[..., Any], Callable[[Any, int], Any]], None
]


# What the kept outputs hold for a buffer update the generated code already copied back.
MUTATION_APPLIED = "applied"


class PlanExecutionError(RuntimeError):
    """The plan asked for something the joint graph cannot do (names the action and node)."""


@dataclass(frozen=True)
class CompiledSegment:
    function: SegmentFunction
    computations: int  # compute actions in the segment
    source: str  # the generated code, for debugging


class _Emitter:
    """Static residency of fx values while a segment's code is generated."""

    def __init__(self, program: Any, available: set[str]) -> None:
        self.program = program
        self.available = available  # fx names held in V when the segment reaches this point
        self.resident: set[int] = set()
        self.lines: list[str] = []
        self.constants: list[Any] = []
        self.mutations_applied: set[str] = set()  # buffer updates the code already copies back
        self.const_index: dict[int, int] = {}
        # Elements of multi-output ops (native_dropout's mask, ...): getitem fx name ->
        # (tuple fx name, index). The graph gives each element its own node, so an element
        # must die when its node is freed even while the tuple's own node stays resident.
        self.element_of: dict[str, tuple[str, int]] = {
            n.name: (n.args[0].name, n.args[1])
            for n in program.fx_nodes.values()
            if n.op == "call_function" and n.target is operator.getitem
            and isinstance(n.args[0], fx.Node) and isinstance(n.args[1], int)
        }
        # tuple fx name -> (index, getitem fx name) of its elements
        self.elements: dict[str, list[tuple[int, str]]] = {}
        for name, (tup, k) in self.element_of.items():
            self.elements.setdefault(tup, []).append((k, name))
        actions: list[Any] = [*program.forward.actions, *program.backward.actions]
        # Lookahead over the whole plan by index lists (a scan per freed element was quadratic):
        # node -> indices of the actions on it, and of the computes of it, ascending.
        self.touches: dict[int, list[int]] = {}
        self.computes: dict[int, list[int]] = {}
        for i, action in enumerate(actions):
            self.touches.setdefault(action.node, []).append(i)
            if action.op is ActionOp.compute:
                self.computes.setdefault(action.node, []).append(i)

    def const(self, value: Any) -> str:
        key = id(value)
        if key not in self.const_index:
            self.const_index[key] = len(self.constants)
            self.constants.append(value)
        return f"C[{self.const_index[key]}]"

    def ref(self, node: fx.Node, where: str) -> str:
        name = node.name
        if node.op == "get_attr":  # a tensor the trace lifted into the graph (torch.tensor(2.0))
            return self.const(_attribute(node))
        if name not in self.available:
            if name not in self.program.derivable:
                owner = self.program.group_of.get(name)
                raise PlanExecutionError(
                    f"{where}: reads {name} of node {owner}, which is not resident")
            self.emit_call(node, where)  # a view of a primal or tangent: derived on the spot
        return f"V[{name!r}]"

    def expr(self, arg: Any, where: str) -> str:
        if isinstance(arg, fx.Node):
            return self.ref(arg, where)
        if isinstance(arg, (list, tuple)) and _has_node(arg):
            inner = ", ".join(self.expr(a, where) for a in arg)
            return f"[{inner}]" if isinstance(arg, list) else f"({inner},)"
        if isinstance(arg, dict) and _has_node(arg.values()):
            items = ", ".join(f"{k!r}: {self.expr(v, where)}" for k, v in arg.items())
            return "{" + items + "}"
        return self.const(arg)

    def emit_call(self, node: fx.Node, where: str) -> None:
        args = [self.expr(a, where) for a in node.args]
        args += [f"{k}={self.expr(v, where)}" for k, v in node.kwargs.items()]
        call = f"{self.const(_runnable(node.target))}({', '.join(args)})"
        if node.name in self.program.identity_fx:  # the tracer counted it as a view: no copy
            call = f"{self.const(torch.ops.aten.alias.default)}({args[0]})"
        if node.name in self.program.random and self._recomputed(node.name):
            # replays its RNG state when recomputed; one computed once records none (a CPU
            # generator's state is 5,056 B, which the simulator does not charge)
            call = f"R({node.name!r}, lambda: {call})"
        self.lines.append(f"V[{node.name!r}] = {call}")
        if node.name in self.program.grad_of:
            self.lines.append(f"V[{node.name!r}] = L(V[{node.name!r}], "
                              f"{self.program.grad_of[node.name]})")
        self.available.add(node.name)

    def _recomputed(self, fx_name: str) -> bool:
        """Whether the plan computes the node holding `fx_name` more than once."""
        group = self.program.group_of.get(fx_name)
        return group is None or len(self.computes.get(group, ())) > 1

    def compute(self, group: int, index: int) -> None:
        where = f"action {index} (C{group})"
        if group in self.resident:
            raise PlanExecutionError(f"action {index}: node {group} is already resident")
        members = self.program.members.get(group)
        if members is None:
            raise PlanExecutionError(f"action {index}: node {group} is not in the traced graph")
        for name in members:
            self.emit_call(self.program.fx_nodes[name], where)
            if name in self.elements:
                self._drop_unused_elements(name, group, index)
        self.resident.add(group)

    def _drop_unused_elements(self, tup: str, group: int, index: int) -> None:
        """Right after a multi-output op ran: drop from its tuple the elements whose own node
        will not take them from this run (it holds an earlier copy, or the plan frees or
        recomputes the op first), so that they live only as long as the op itself (the
        simulator charges them while it runs: planner.sim.ledger's workspace rule)."""
        drop = []
        for k, name in self.elements[tup]:
            owner = self.program.group_of.get(name)
            if owner is None or owner == group:
                continue
            if not self._taken_later(owner, group, index):
                drop.append(k)
        if drop:
            self.lines.append(
                f"V[{tup!r}] = type(V[{tup!r}])(None if i in {tuple(drop)!r} else x "
                f"for i, x in enumerate(V[{tup!r}]))")

    def _taken_later(self, element_group: int, group: int, index: int) -> bool:
        """Whether the element's node takes it from this run of the op: it is computed before
        the plan's next action on the op (the simulator's rule, planner.sim.ledger_replay)."""
        return _next_after(self.computes.get(element_group, ()), index) <= \
            _next_after(self.touches.get(group, ()), index)

    def _drop_allowed(self, tup: str, group: int, index: int) -> bool:
        """Whether an element of `tup` can leave the held tuple when `group` (its getitem's
        node) is freed at action `index`: the tuple is held by another resident node, and the
        plan does not compute `group` again from this same tuple (it frees or recomputes the
        tuple's node first). Else the element stays (memory the plan does not count, but a
        step that runs)."""
        owner = self.program.group_of.get(tup)
        if tup not in self.available or owner == group:
            return False
        # The first later action on the tuple's node decides, unless `group` is computed first.
        return _next_after(self.touches.get(owner, ()), index) <= \
            _next_after(self.computes.get(group, ()), index)

    def _apply_mutation(self, name: str) -> None:
        """A buffer's new value (BatchNorm running statistics) freed for the first time: copied
        into the buffer there, so that it dies at its free as the plan counts it, not at the end
        of the forward; marked applied so that neither a recomputation nor the step's end copies
        it again."""
        buffer = self.program.primals[self.program.mutations[name]]
        self.lines.append(f"V[{buffer!r}].copy_(V.pop({name!r}))")
        self.lines.append(f"K[{name!r}] = {self.const(MUTATION_APPLIED)}")
        self.mutations_applied.add(name)

    def free(self, group: int, index: int) -> None:
        if group not in self.resident:
            raise PlanExecutionError(f"action {index}: frees node {group}, which is not resident")
        self.resident.discard(group)
        for name in self.program.members[group]:
            if name not in self.available:
                continue
            self.available.discard(name)
            element = self.element_of.get(name)
            if element is not None and self._drop_allowed(element[0], group, index):
                # The tuple's node stays resident: drop this element from it, so that its
                # storage dies with its own node, as the plan counts it.
                tup, k = element
                self.lines.append(
                    f"V[{tup!r}] = type(V[{tup!r}])(None if i == {k} else x "
                    f"for i, x in enumerate(V[{tup!r}]))")
            if name in self.program.mutations and name not in self.mutations_applied:
                self._apply_mutation(name)
            elif name in self.program.output_fx:  # handed back by the step even when freed
                self.lines.append(f"K.setdefault({name!r}, V.pop({name!r}, None))")
            else:
                self.lines.append(f"del V[{name!r}]")


def _next_after(indices: Sequence[int], index: int) -> float:
    """The first of the ascending `indices` after `index`, or infinity."""
    k = bisect.bisect_right(indices, index)
    return indices[k] if k < len(indices) else math.inf


def _runnable(target: Any) -> Any:
    """The op to run for `target`: `view` as `reshape`. The joint graph is traced with fake
    tensors, whose strides can differ from the real kernel's (native_dropout_backward of a
    transposed gradient is contiguous in fake mode, transposed on CPU); a `view` valid in the
    trace then fails at run time. `reshape` is that view whenever one exists, a copy otherwise."""
    if target in _VIEW_AS_RESHAPE:
        return torch.ops.aten.reshape.default
    return target


_VIEW_AS_RESHAPE = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


def _has_node(values: Iterable[Any]) -> bool:
    return any(isinstance(v, fx.Node) or (isinstance(v, (list, tuple)) and _has_node(v))
               for v in values)


class SegmentCompiler:
    """Compiles the forward prefix, then the backward suffix, of one plan (in that order: the
    suffix starts from what the prefix left resident)."""

    def __init__(self, program: Any) -> None:
        self.emitter = _Emitter(program, set(program.primals))
        # Subclasses that move memory (planner.runtime.offload_program) record the graph nodes their
        # code holds after each action here; remat plans' resident sets follow from the actions
        # alone (`resident_sets`), so none are stored per action (that was quadratic).
        self.resident_after: list[frozenset[int]] = []

    def compile(self, segment: Any, extra_inputs: Iterable[str] = ()) -> CompiledSegment:
        em = self.emitter
        em.available.update(extra_inputs)
        em.lines = []
        computations = 0
        for offset, action in enumerate(segment.actions):
            index = segment.start + offset
            if action.op is ActionOp.compute:
                em.compute(action.node, index)
                computations += 1
            elif action.op is ActionOp.free:
                em.free(action.node, index)
            else:  # offload/prefetch are not remat actions: refuse rather than ignore
                raise PlanExecutionError(f"action {index} ({action}): {action.op} is not "
                                         "supported by the remat executor")
        body = "\n".join(f"    {line}" for line in em.lines) or "    pass"
        source = f"def segment(V, K, R, L):\n{body}\n"
        namespace: dict[str, Any] = {"C": list(em.constants)}
        exec(compile(source, "<plan segment>", "exec"), namespace)  # noqa: S102 - our own code
        return CompiledSegment(namespace["segment"], computations, source)


def resident_sets(actions: Iterable[Any]) -> Iterable[frozenset[int]]:
    """The graph nodes a compiled remat plan holds after each action (the compiler checked the
    plan): the memory ledger's resident sets, built as they are iterated."""
    return resident_after(actions)


def _attribute(node: fx.Node) -> Any:
    """The value of a get_attr node: an attribute (dotted path) of the graph's module."""
    value: Any = node.graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value
