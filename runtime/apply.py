"""planner.runtime.apply: a module whose training step follows a plan.

`apply(model, plan, example_inputs)` traces the model (op level, the tracer's default
deterministic cost estimate, so that the graph hash is reproducible), refuses a plan made for
another graph, and returns a `PlannedModule` sharing the model's parameters, buffers and
submodules. Calling it runs forward + loss under the plan and returns the loss; `loss.backward()`
runs the backward part of the plan and leaves gradients in the parameters' `.grad`.

Plans with host copies (kinds offload and remat+offload: `O`, `P`, `D` actions) run through
planner.runtime.offload_program on the plan's resources (a host tier is needed): copy streams and a
pinned host pool on CUDA, synchronous copies into a host pool on CPU;
`PlannedModule.last_transfer_stats` says what the last step moved.

The returned module checks the training loop's gradients against the gradient lifetime of the
plan's graph (planner.runtime.grad_lifetime) and says in one `GradientLifetimeWarning` line when
they disagree, with the bytes the plan is off by.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.io import load_plan, plan_from_dict
from planner.core.plan import Plan, PlanKind, PlanStatus
from planner.core.resources import Resources
from planner.runtime.grad_lifetime import GradientLifetimeCheck
from planner.runtime.grad_lifetime import install as install_lifetime_check
from planner.runtime.op_codegen import PlanExecutionError
from planner.runtime.op_executor import JointProgram, PlanRun
from planner.runtime.retrace import graph_as_planned, mismatch_detail, trace_as_planned
from planner.sim.simulator import PlanError, simulate
from planner.sim.step_memory import model_state_breakdown
from planner.tracing.cuda_allocator import use_exact_allocator


class PlanMismatch(InputError):
    """The plan was made for another graph; the message says what differs."""


def load(plan: Plan | dict[str, Any] | str | Path) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return plan_from_dict(plan)
    if isinstance(plan, str | Path):
        return load_plan(plan)
    raise InputError(
        f"plan: expected a Plan, a plan.json dict or a path, got {type(plan).__name__}"
    )


def apply(
    model: nn.Module,
    plan: Plan | dict[str, Any] | str | Path,
    example_inputs: tuple[Any, ...] | Any,
    *,
    loss_fn: Any = None,
    trace: Any = None,
    graph: Graph | None = None,
    resources: Resources | None = None,
) -> Any:
    """Bind `plan` to `model`; `trace` (a TraceResult of this model) skips re-tracing.

    With a module-level trace the plan must be a chain solver's (`Plan.block_plan`, refused
    unless the simulator runs it on the traced graph) and a
    `BlockPlannedModule` (checkpointed block segments) is returned; else a `PlannedModule`.

    `graph` is the graph the plan was solved for when it is not the freshly traced one (e.g. a
    graph with measured costs): it must then match the trace in structure (ops, sizes, edges).
    Without `trace`, the model is traced once with the options the plan's graph was traced
    with (`Plan.trace_options`; planner.runtime.retrace).

    `resources` (default: the plan's own) is the machine an offload plan is checked on.
    """
    plan, inputs = runnable_plan(
        plan, example_inputs, "applied", "; planner.runtime.apply runs one-device plans (remat, "
        "offload, remat+offload): pipeline execution is not built yet")
    offloads = plan.kind in (PlanKind.offload, PlanKind.remat_offload)
    if _on_cuda(model, inputs):
        use_exact_allocator()  # allocated bytes = the plan's rounded sizes
    machine = resources if resources is not None else plan.resources
    if trace is None:
        trace = trace_as_planned(model, inputs, loss_fn, plan, graph)
    if getattr(trace, "level", "op") == "module":
        if offloads:
            raise InputError(
                f"plan ({plan.method}): a {plan.kind} plan needs an op-level "
                "trace (level='op'): host copies are not applied to module-level blocks"
            )
        blocks = _apply_blocks(model, plan, trace, graph, loss_fn)
        install_lifetime_check(blocks, graph if graph is not None else trace.graph)
        return blocks
    if trace.joint is None:
        raise InputError("trace: an op-level TraceResult is needed for an op-level plan")
    traced = trace.graph
    # Masks sized as the plan's trace sized them (eager on CPU): the runtime's are no larger.
    check_plan_graph(plan, graph_as_planned(trace, plan, graph), graph, loss_fn)
    try:
        simulate(traced, plan.actions, machine if offloads else None)
    except PlanError as e:
        raise InputError(f"plan ({plan.method}): does not run on the traced graph: {e}") from None
    program: JointProgram
    if offloads:
        from planner.runtime.offload_program import OffloadProgram

        try:
            program = OffloadProgram(trace, plan.actions, machine)
        except PlanExecutionError as e:
            raise InputError(f"plan ({plan.method}): cannot run: {e}") from None
    else:
        program = JointProgram(trace, plan.actions)
    module = PlannedModule(model, plan, program, _signature(trace), traced)
    module._holder["loss_fn"] = loss_fn
    # The training loop's gradients against the lifetime the plan was made for.
    install_lifetime_check(module, graph if graph is not None else traced)
    return module


def runnable_plan(plan: Plan | dict[str, Any] | str | Path, example_inputs: Any, verb: str,
                  pipeline_note: str) -> tuple[Plan, tuple[Any, ...]]:
    """The loaded plan and the inputs as a tuple; a pipeline plan, a plan that is not feasible
    or optimal, or one without actions, is refused in one line saying which (`verb`:
    "applied", "compiled")."""
    plan = load(plan)
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    status = PlanStatus(plan.status).value
    if plan.kind is PlanKind.fsdp:  # one FSDP2 rank's settings: applied before fully_shard
        raise InputError(f"plan ({plan.method}): an fsdp plan cannot be {verb} as a "
                         "one-device plan: apply it on every rank with "
                         "planner.runtime.fsdp_apply.apply_fsdp_plan(model, plan, mesh)")
    if plan.kind is PlanKind.pipeline:  # its actions are per rank (rank_actions), never here
        raise InputError(f"plan ({plan.method}): a pipeline plan (status {status}) cannot be "
                         f"{verb} here{pipeline_note}")
    if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
        raise InputError(f"plan ({plan.method}): status {status}: only a feasible or optimal "
                         f"plan can be {verb}")
    if not plan.actions:
        raise InputError(f"plan ({plan.method}): status {status} but no actions: nothing to "
                         f"run (the plan file lost its actions?); solve it again")
    return plan, inputs


def _on_cuda(model: nn.Module, inputs: tuple[Any, ...]) -> bool:
    tensors = [*model.parameters(), *(x for x in inputs if isinstance(x, torch.Tensor))]
    return any(t.device.type == "cuda" for t in tensors)


def _apply_blocks(
    model: nn.Module, plan: Plan, trace: Any, graph: Graph | None, loss_fn: Any
) -> nn.Module:
    """A chain solver's plan on a module-level trace: checkpointed segments of blocks."""
    from planner.runtime.block_executor import BlockPlannedModule, check_simulates, stage_names_of

    check_plan_graph(plan, trace.graph, graph, loss_fn)
    check_simulates(plan, trace.graph)
    return BlockPlannedModule(model, plan, stage_names_of(trace), loss_fn)


# -- mismatch checks ---------------------------------------------------------------------------
def check_plan_graph(
    plan: Plan, traced: Graph, graph: Graph | None = None, loss_fn: Any = None
) -> None:
    """Raise PlanMismatch unless `plan` is for `traced` (directly or via `graph`)."""
    if plan.graph_hash == traced.content_hash():
        return
    if graph is None:
        detail = mismatch_detail(plan, traced, loss_fn)
        if detail is not None:
            raise PlanMismatch(detail)
        raise PlanMismatch(
            f"the plan is for graph {plan.graph_hash[:19]}…, but the model now traces to "
            f"{traced.content_hash()[:19]}… ({len(traced.nodes)} nodes, "
            f"{describe_inputs(traced)}): solve again for this model and these input shapes, "
            "or pass the plan's graph to see what differs"
        )
    if plan.graph_hash != graph.content_hash():
        raise PlanMismatch(
            f"the plan is for graph {plan.graph_hash[:19]}…, not the graph given with it "
            f"({graph.content_hash()[:19]}…)"
        )
    difference = structural_difference(graph, traced)
    if difference:
        raise PlanMismatch(f"the plan's graph differs from the model as traced now: {difference}")


def describe_inputs(graph: Graph) -> str:
    meta = graph.metadata
    parts = [f"dtype {meta.dtype or '?'}", f"batch {meta.batch_size}"]
    parts.append(f"inputs {graph.fixed.inputs_bytes} bytes")
    return ", ".join(parts)


def structural_difference(planned: Graph, traced: Graph) -> str:
    """'' when the graphs have the same ops, sizes and edges; else the first difference."""
    if planned.metadata.dtype != traced.metadata.dtype:
        return f"dtype {planned.metadata.dtype} in the plan's graph, {traced.metadata.dtype} now"
    if planned.metadata.batch_size != traced.metadata.batch_size:
        return (
            f"batch size {planned.metadata.batch_size} in the plan's graph, "
            f"{traced.metadata.batch_size} now"
        )
    if planned.fixed.inputs_bytes != traced.fixed.inputs_bytes:
        return (
            f"inputs take {planned.fixed.inputs_bytes} bytes in the plan's graph, "
            f"{traced.fixed.inputs_bytes} now (input shapes or dtype changed)"
        )
    planned_params = model_state_breakdown(planned).parameters_bytes
    traced_params = model_state_breakdown(traced).parameters_bytes
    if planned_params != traced_params:
        return (
            f"parameters take {planned_params} bytes in the plan's graph, "
            f"{traced_params} now (the model changed)"
        )
    if len(planned.nodes) != len(traced.nodes):
        return f"{len(planned.nodes)} nodes in the plan's graph, {len(traced.nodes)} now"
    for a, b in zip(planned.nodes, traced.nodes, strict=True):
        if (a.id, a.op) != (b.id, b.op):
            return f"node {a.id} is {a.op} in the plan's graph, {b.op} now"
        if a.output_bytes != b.output_bytes:
            return (
                f"{planned.describe(a.id)}: output {a.output_bytes} bytes in the plan's graph, "
                f"{b.output_bytes} now (shapes changed)"
            )
    edges_planned = {(e.source, e.target) for e in planned.edges}
    if edges_planned != {(e.source, e.target) for e in traced.edges}:
        return "the edges differ"
    return ""


# -- the module -------------------------------------------------------------------------------
InputSignature = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def _signature(trace: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """fx placeholder -> (shape, dtype) as traced, for every primal."""
    out = {}
    for node in trace.joint.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                out[node.name] = (tuple(int(s) for s in val.shape), val.dtype)
    return out


class _PlanFunction(torch.autograd.Function):
    """Forward prefix of the plan in forward, the suffix (recomputations) in backward."""

    @staticmethod
    def forward(ctx: Any, holder: dict[str, Any], *primals: torch.Tensor) -> torch.Tensor:
        program = holder["program"]
        run: PlanRun
        if hasattr(program, "streams_for"):  # an OffloadProgram
            from planner.runtime.offload_program import OffloadRun

            run = OffloadRun(program, primals)
        else:
            run = PlanRun(program, primals)
        loss = run.run_forward()
        # The state must not hold the returned tensor itself (that would tie it to ctx).
        run.values[holder["program"].loss_fx] = loss.detach()
        ctx.run = run
        ctx.holder = holder
        holder["last_computations"] = run.computations
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        run: PlanRun | None = ctx.run
        if run is None:
            raise RuntimeError(
                "the planned step ran its backward already: one backward per forward "
                "(retain_graph is not supported by plan execution)"
            )
        from planner.tracing.autocast import autocast_off

        with autocast_off(grad_loss.device.type):  # the graph holds its casts (see forward)
            grads = run.run_backward([grad_loss])
        ctx.run = None
        holder: dict[str, Any] = ctx.holder
        holder["last_computations"] = run.computations
        holder["last_transfer_stats"] = getattr(run, "transfer_stats", None)
        return (None, *grads)


class PlannedModule(nn.Module):
    """The model's training step under a plan. Shares parameters, buffers and submodules.

    `planned(*inputs)` returns the loss (the traced step ends at the loss).
    """

    # Plain attributes (set with object.__setattr__, so nn.Module does not register them).
    _model: nn.Module
    plan: Plan
    graph: Graph
    _holder: dict[str, Any]
    _signature: dict[str, tuple[tuple[int, ...], torch.dtype]]
    agent_report: Any
    gradient_lifetime_check: GradientLifetimeCheck  # set by apply (grad_lifetime.install)

    def __init__(
        self,
        model: nn.Module,
        plan: Plan,
        program: JointProgram,
        signature: dict[str, tuple[tuple[int, ...], torch.dtype]],
        graph: Graph,
    ) -> None:
        super().__init__()
        # The same dicts as the model: same named_parameters(), state_dict(), train()/eval().
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "_holder", {"program": program})
        object.__setattr__(self, "_signature", signature)

    @property
    def program(self) -> JointProgram:
        return self._holder["program"]

    @property
    def last_computations(self) -> int:
        """Node computations of the last step (forward only until its backward has run)."""
        return int(self._holder.get("last_computations", 0))

    @property
    def last_transfer_stats(self) -> Any:
        """planner.runtime.offload_engine.TransferStats of the last full step (None for remat
        plans)."""
        return self._holder.get("last_transfer_stats")

    def forward(self, *inputs: Any) -> torch.Tensor:
        if not self._model.training:
            # The plan is for a training step (dropout on, batch statistics): evaluation runs
            # the model itself and returns its loss.
            from planner.tracing.capture import compute_loss

            return compute_loss(self._model(*inputs), self._holder.get("loss_fn"))
        primals = self._primals(inputs)
        from planner.tracing.autocast import (
            autocast_off,
            check_call_autocast,
            device_type_of,
            recorded_autocast,
        )

        # A graph traced under autocast holds its casts: replayed with autocast off, the step is
        # the traced one inside or outside the user's autocast block (of the traced dtype).
        device_type = device_type_of(self._model, tuple(inputs))
        check_call_autocast(recorded_autocast(self.graph), device_type)
        with autocast_off(device_type):
            return _PlanFunction.apply(self._holder, *primals)

    def _primals(self, inputs: Sequence[Any]) -> list[Any]:
        program = self.program
        params = dict(self._model.named_parameters(remove_duplicate=False))
        buffers = dict(self._model.named_buffers(remove_duplicate=False))
        out: list[Any] = []
        for name in program.primals:
            kind, fqn = program.primal_kinds.get(name, "input"), program.primal_names.get(name, "")
            value: Any
            if kind == "parameter":
                value = params[fqn]
            elif kind == "buffer":
                value = buffers[fqn]
            else:
                value = _input(fqn, inputs)
            expected = self._signature.get(name)
            if expected is not None and isinstance(value, torch.Tensor):
                shape, dtype = tuple(value.shape), value.dtype
                if (shape, dtype) != expected:
                    what = f"input {fqn}" if kind == "input" else f"{kind} {fqn}"
                    raise PlanMismatch(
                        f"{what}: shape {list(shape)} {str(dtype).replace('torch.', '')} now, the "
                        f"plan was made for {list(expected[0])} "
                        f"{str(expected[1]).replace('torch.', '')}: trace and solve again"
                    )
            out.append(value)
        return out


def _input(name: str, inputs: Sequence[Any]) -> Any:
    digits = [p for p in name.split(".") if p.isdigit()]
    index = int(digits[0]) if digits else 0
    if index >= len(inputs):
        raise PlanMismatch(
            f"input {name}: the plan's step takes input {index}, only {len(inputs)} given"
        )
    return inputs[index]
