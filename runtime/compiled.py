"""planner.runtime.compile: a plan's save/recompute decisions, executed by torch.compile.

`compile(model, plan, example_inputs)` returns a module whose training step (forward + loss,
then `loss.backward()`) runs through `torch.compile` (inductor by default): what the plan keeps
from the forward into the backward is saved, every other forward value the backward needs is
recomputed in the backward graph.

How: the whole step (model and loss) runs in one `torch.utils.checkpoint` region
(`use_reentrant=False`) whose selective-checkpointing policy (`OpPolicy`) tags each aten op call
MUST_SAVE (the plan keeps the value) or MUST_RECOMPUTE (the plan recomputes it in the backward).
Calls are matched to the traced joint graph's forward ops by op overload and position (the k-th
`aten.addmm` call is the k-th forward `addmm` fx node), fx nodes to plan nodes by the trace.

Why selective checkpointing rather than a partition function of our own: the tags travel through
inductor's own pipeline. Verified in torch 2.13 (`torch/_functorch/partitioners.py`,
`torch/utils/checkpoint.py`, and by tests/runtime/test_runtime_compile.py): the SAC dispatch mode
tags every fx node an op call creates, decompositions included; the min-cut partitioner turns
MUST_RECOMPUTE into an infinite edge to the sink (recomputed in the backward) and MUST_SAVE into a
ban on recomputation (an infinite edge from the source), so with every forward op tagged the cut
is the plan's; views are never banned (a view costs no memory either way); recomputed random ops
get their RNG state saved (`functionalize_rng_ops`). A partition function of our own would
replace inductor's partitioner on inductor's decomposed joint graph (whose node names are not our
trace's: the same mapping would be needed), would redo what the partitioner does besides the cut
(saved sizes, RNG, mutations, effect tokens), and inductor's backend takes no partition function.

What cannot be expressed: inductor computes each forward value once in the forward and at most
once more in the backward, and copies nothing to the host. A plan that recomputes a value within
the forward, twice in the backward, recomputes a backward value, or copies to the host (O/P/D) is
refused with one line naming the construct (InputError). With `project=True` it is projected
instead (a value recomputed in the forward is held across the gap, one recomputed twice in the
backward is recomputed once and held; host copies are always refused): most solvers' plans free
a recomputed value between two backward uses, so most need it. `CompiledPlanModule.execution` is
the plan the compiled step follows as the simulator runs it (`compiled_schedule`), its peak and
compute against the plan's own; a `ProjectionWarning` says when it exceeds the plan's budget.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    SAC_IGNORED_OPS,
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from planner.core.errors import InputError
from planner.core.graph import Graph, Phase
from planner.core.plan import HOST_OPS, Action, ActionOp, Plan, PlanKind
from planner.sim.simulator import PlanError, simulate
from planner.solvers.remat.sac_space import compiled_schedule


class ProjectionWarning(UserWarning):
    """The plan torch.compile executes needs more memory than the plan's budget."""


@dataclass(frozen=True)
class Decisions:
    """What the compiled step saves and recomputes, by plan node (graph node id)."""

    recomputed: frozenset[int]  # forward values recomputed in the backward (MUST_RECOMPUTE)
    saved: frozenset[int]  # kept forward values the backward reads (directly or to recompute)
    projected: tuple[str, ...] = ()  # what the projection changed; () when the plan is exact

    @property
    def exact(self) -> bool:
        return not self.projected


@dataclass(frozen=True)
class Execution:
    """The plan the compiled step follows, simulated, against the plan's own figures."""

    decisions: Decisions
    actions: tuple[Action, ...]  # the executed plan, in the simulator's model
    peak_bytes: int
    compute_cost: float
    plan_peak_bytes: int
    plan_compute_cost: float

    def describe(self) -> str:
        projected = self.decisions.projected
        how = "exact" if not projected else (
            f"projected, {len(projected)} changes: {projected[0]}"
            + (", ..." if len(projected) > 1 else ""))
        return (
            f"compiled plan ({how}): saves {len(self.decisions.saved)} values, recomputes "
            f"{len(self.decisions.recomputed)}; peak {self.peak_bytes} bytes (plan "
            f"{self.plan_peak_bytes}), compute {self.compute_cost:.4g} (plan "
            f"{self.plan_compute_cost:.4g})"
        )


def decide(plan: Plan, graph: Graph, *, project: bool = False) -> Decisions:
    """The plan's save/recompute decision per forward value; InputError (one line) for what
    torch.compile cannot execute, unless `project` (then `Decisions.projected` says what moved).
    """
    where = f"plan ({plan.method})"
    host = next((a for a in plan.actions if a.op in HOST_OPS), None)
    if host is not None or plan.kind in (PlanKind.offload, PlanKind.remat_offload):
        token = f"action {host}" if host is not None else f"kind {plan.kind}"
        raise InputError(
            f"{where}: {token} copies to the host: runtime.compile executes save/recompute "
            "decisions only; use runtime.apply for offload plans"
        )
    boundary = _loss_position(plan, graph)
    before: Counter[int] = Counter()  # computations up to the loss
    after: Counter[int] = Counter()  # computations after it: the backward's
    for i, a in enumerate(plan.actions):
        if a.op is ActionOp.compute:
            (before if i <= boundary else after)[a.node] += 1
    forward_side = [n.id for n in graph.nodes if n.phase is not Phase.backward]
    constructs = _inexpressible(graph, forward_side, before, after)
    if constructs and not project:
        more = f" (and {len(constructs) - 1} more)" if len(constructs) > 1 else ""
        raise InputError(
            f"{where}: {constructs[0]}{more}: torch.compile computes each forward value once "
            "and recomputes it at most once in the backward; pass project=True to run the "
            "nearest such plan (its cost is reported), or use runtime.apply"
        )
    recomputed = frozenset(v for v in forward_side if after[v] > 0)
    preds = graph.index.predecessors
    # Kept values the backward reads (directly or through a recomputation): saved by the step.
    read_later = {
        u for n in graph.nodes if n.phase is Phase.backward or n.id in recomputed
        for u in preds[n.id]
    }
    saved = frozenset(v for v in forward_side if v not in recomputed and v in read_later)
    return Decisions(recomputed=recomputed, saved=saved, projected=tuple(constructs))


def _inexpressible(
    graph: Graph, forward_side: Sequence[int], before: Counter[int], after: Counter[int]
) -> list[str]:
    """One phrase per value whose computations torch.compile cannot reproduce."""
    found: list[str] = []
    name = {n.id: n.name or n.op for n in graph.nodes}
    for v in forward_side:
        if before[v] > 1:
            found.append(f"node {v} ({name[v]}) is recomputed in the forward "
                         f"({before[v]} computations before the backward)")
        if after[v] > 1:
            found.append(f"node {v} ({name[v]}) is recomputed {after[v]} times in the backward")
    for n in graph.nodes:
        if n.phase is Phase.backward and after[n.id] > 1:
            found.append(f"backward node {n.id} ({name[n.id]}) is recomputed")
    return found


def _loss_position(plan: Plan, graph: Graph) -> int:
    """Index of the action after which the loss exists (the first computation of the last
    forward-side output); what the plan computes later runs in the backward."""
    index = graph.index
    losses = index.loss_nodes or [
        v for v in index.outputs if index.node(v).phase is not Phase.backward
    ]
    first: dict[int, int] = {}
    for i, a in enumerate(plan.actions):
        if a.op is ActionOp.compute:
            first.setdefault(a.node, i)
    if losses and all(v in first for v in losses):
        return max(first[v] for v in losses)
    backward = [i for v, i in first.items() if index.node(v).phase is Phase.backward]
    return min(backward, default=len(plan.actions)) - 1


def execution(plan: Plan, graph: Graph, decisions: Decisions) -> Execution:
    """Simulate the plan the compiled step follows (`compiled_schedule`) and the plan itself."""
    actions = compiled_schedule(graph, decisions.recomputed)
    ran = simulate(graph, actions, check_hash=False)
    own = simulate(graph, plan.actions, check_hash=False)
    return Execution(decisions, tuple(actions), ran.peak_bytes, ran.compute_cost,
                     own.peak_bytes, own.compute_cost)


# -- the per-op policy --------------------------------------------------------------------------
Overload = Any  # torch._ops.OpOverload (callable, hashable)


class OpPolicy:
    """A selective-checkpointing policy from plan decisions: the k-th call of an op overload in
    the checkpointed forward is the k-th forward fx node with that target in the traced joint
    graph; its plan node decides MUST_SAVE or MUST_RECOMPUTE.

    `calls` logs the latest pass: (op, plan node or None, policy). A call that matches no traced
    op, or a pass with fewer calls than the trace, is a mismatch (`check` raises InputError)."""

    def __init__(self, trace: Any, recomputed: frozenset[int]) -> None:
        fx_to_node = trace.fx_to_node
        self.expected: dict[Overload, list[int | None]] = {}
        for fx in trace.joint.graph.nodes:
            if fx.op != "call_function" or fx.meta.get("partitioner_tag") == "is_backward":
                continue
            if fx.target in SAC_IGNORED_OPS or not isinstance(fx.target, torch._ops.OpOverload):
                continue  # getitem and detach: the policy never sees them
            self.expected.setdefault(fx.target, []).append(fx_to_node.get(fx.name))
        self.recomputed = recomputed
        self.calls: list[tuple[Overload, int | None, CheckpointPolicy]] = []
        self.mismatches: list[str] = []
        self._seen: Counter[tuple[bool, Overload]] = Counter()

    def reset(self) -> None:
        """A new pass over the region (torch traces it more than once while compiling)."""
        self.calls, self._seen = [], Counter()

    def __call__(self, ctx: Any, func: Overload, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        op = functional_variant(func)
        key = (bool(getattr(ctx, "is_recompute", False)), op)
        k = self._seen[key]
        self._seen[key] += 1
        nodes = self.expected.get(op, [])
        if k >= len(nodes):
            self.mismatches.append(f"call {k + 1} of {op} (the trace has {len(nodes)})")
            policy = CheckpointPolicy.PREFER_SAVE
            self.calls.append((op, None, policy))
            return policy
        recompute = nodes[k] is not None and nodes[k] in self.recomputed
        policy = CheckpointPolicy.MUST_RECOMPUTE if recompute else CheckpointPolicy.MUST_SAVE
        if not key[0]:
            self.calls.append((op, nodes[k], policy))
        return policy

    def check(self) -> None:
        """InputError (one line) unless the last pass called exactly the traced forward ops."""
        counts = Counter(op for op, _, _ in self.calls)
        short = [f"{op}: {counts[op]} calls, traced {len(v)}"
                 for op, v in self.expected.items() if counts[op] != len(v)]
        problems = self.mismatches + short
        if problems:
            raise InputError(
                f"runtime.compile: the compiled forward's ops differ from the traced step "
                f"({problems[0]}; {len(problems)} differences): the plan cannot be placed on "
                "them; trace the model as it runs (no in-place ops inside the model, same inputs)"
            )


def functional_variant(func: Overload) -> Overload:
    """aten.add_.Tensor -> aten.add.Tensor: the joint graph is functionalised, the policy sees
    the op the model called."""
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if not name.endswith("_") or name.endswith("__"):
        return func
    functional = getattr(torch.ops.aten, name.rstrip("_"), None)
    return getattr(functional, func._overloadname, func) if functional is not None else func


def _contexts(policy: OpPolicy) -> Any:
    # A module-level function under functools.partial: dynamo accepts no closure as context_fn.
    policy.reset()
    return create_selective_checkpoint_contexts(policy)


class _CheckpointedStep(nn.Module):
    """model + loss inside one checkpoint region governed by the plan's policy."""

    def __init__(self, wrapper: nn.Module, policy: OpPolicy) -> None:
        super().__init__()
        self.wrapper = wrapper
        self.context_fn = functools.partial(_contexts, policy)

    def forward(self, *inputs: Any) -> Any:
        return checkpoint(self.wrapper, *inputs, use_reentrant=False, context_fn=self.context_fn)


class CompiledPlanModule(nn.Module):
    """The model's training step under a plan, compiled. Shares parameters, buffers and
    submodules; `compiled(*inputs)` returns the loss (compiled on the first call)."""

    plan: Plan
    graph: Graph
    policy: OpPolicy
    execution: Execution
    _holder: dict[str, Any]

    def __init__(self, model: nn.Module, plan: Plan, graph: Graph, policy: OpPolicy,
                 run: Execution, step: Any, loss_fn: Any) -> None:
        super().__init__()
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        holder = {"model": model, "step": step, "loss_fn": loss_fn, "checked": False}
        attributes = {"plan": plan, "graph": graph, "policy": policy, "execution": run}
        for key, value in {**attributes, "_holder": holder}.items():
            object.__setattr__(self, key, value)

    def forward(self, *inputs: Any) -> torch.Tensor:
        from planner.tracing.capture import compute_loss

        model = self._holder["model"]
        if not model.training:  # the plan is for a training step: evaluation runs the model
            return compute_loss(model(*inputs), self._holder["loss_fn"])
        loss = self._holder["step"](*inputs)
        if not self._holder["checked"]:
            self.policy.check()
            self._holder["checked"] = True
        return loss


def compile(  # noqa: A001 - planner.runtime.compile, as torch.compile
    model: nn.Module,
    plan: Plan | dict[str, Any] | str | Path,
    example_inputs: tuple[Any, ...] | Any,
    *,
    loss_fn: Any = None,
    trace: Any = None,
    graph: Graph | None = None,
    project: bool = False,
    backend: Any = "inductor",
) -> CompiledPlanModule:
    """`model`'s training step under `plan`, through `torch.compile(backend=backend)`.

    `trace` (an op-level TraceResult of this model) skips re-tracing; `graph` is the plan's
    graph when it is not the traced one (as in runtime.apply). `project`: run the nearest plan
    torch.compile can execute instead of refusing one it cannot (module doc);
    `.execution.describe()` says what runs and at what cost."""
    from planner.runtime.apply import check_plan_graph, runnable_plan
    from planner.runtime.retrace import graph_as_planned, trace_as_planned
    from planner.tracing.capture import LossWrapper

    plan, inputs = runnable_plan(plan, example_inputs, "compiled",
                                 ": runtime.compile runs one-device save/recompute plans")
    if trace is None:
        trace = trace_as_planned(model, inputs, loss_fn, plan, graph)
    if getattr(trace, "level", "op") != "op" or trace.joint is None:
        raise InputError("trace: runtime.compile needs an op-level trace (level='op')")
    check_plan_graph(plan, graph_as_planned(trace, plan, graph), graph, loss_fn)
    traced = trace.graph
    try:
        simulate(traced, plan.actions, check_hash=False)
    except PlanError as e:
        raise InputError(f"plan ({plan.method}): does not run on the traced graph: {e}") from None
    decisions = decide(plan, traced, project=project)
    run = execution(plan, traced, decisions)
    if plan.budget_bytes is not None and run.peak_bytes > plan.budget_bytes:
        warnings.warn(f"plan ({plan.method}): {run.describe()}: over the plan's budget of "
                      f"{plan.budget_bytes} bytes", ProjectionWarning, stacklevel=2)
    policy = OpPolicy(trace, decisions.recomputed)
    step = torch.compile(_CheckpointedStep(LossWrapper(model, loss_fn), policy),
                         backend=backend, fullgraph=True, dynamic=False)
    return CompiledPlanModule(model, plan, traced, policy, run, step, loss_fn)
