"""Tracing a model again as the plan's graph was traced, when `apply` is given no trace.

A plan solved on a traced graph carries the options it was traced with (`Plan.trace_options`,
from `graph.metadata.extra["trace_options"]`): the model is traced once with them
(`trace_as_planned`), using the capture the plan's graph was traced from when this model's
fingerprint is the one the plan records (planner.tracing.fingerprint; the capture store keeps
it): no dynamo, no AOTAutograd, and the graph hash is checked as after any trace; otherwise the
model is captured again and the log says why (a warning when the model differs from the one the
plan was traced from). Older plans name their graph by hash only: the options that shape a graph
(gradient lifetime, optimizer, dropout-mask sizes, autocast) are then tried until the hash
matches.

Dropout masks: the runtime runs the joint graph, whose masks are bool, so it is always traced with
`dropout_masks="graph"`. A plan solved on the CLI's default eager-sized trace (CPU eager keeps
masks in the input's dtype, 4 bytes an element for fp32) is checked on that trace's view of the
same capture (`graph_as_planned`): same ops, edges and costs, masks sized as eager. The plan then
runs as solved and holds less than it predicts (each mask is smaller, nothing else changes).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from planner.core.graph import Graph
from planner.core.plan import GraphSummary, Plan

OPTIMIZERS = ("sgd", "adam", "sgd-momentum", "adamw")


def recorded_options(plan: Plan, graph: Graph | None) -> dict[str, Any] | None:
    """The options the plan's graph was traced with: the graph's record, else the plan's."""
    options = graph.trace_options if graph is not None else None
    return options or plan.trace_options


def trace_as_planned(
    model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any, plan: Plan, graph: Graph | None
) -> Any:
    """The model traced (op level, graph-sized masks) as the plan's graph was: once with the
    recorded options; without them (an older plan) as the hash tells (`_guess`)."""
    from planner.tracing.api import TRACE_OPTION_NAMES
    from planner.tracing.api import trace as trace_fn
    from planner.tracing.autocast import check_call_autocast, device_type_of

    options = recorded_options(plan, graph)
    if options is None:
        return _guess(model, inputs, loss_fn, plan, graph)
    # Refused here, in one line, rather than traced under the caller's block.
    check_call_autocast(options.get("autocast"), device_type_of(model, inputs))
    kwargs = {k: options[k] for k in TRACE_OPTION_NAMES if k in options}
    # Measured costs are not reproduced by any trace: the structure is checked instead (graph=).
    kwargs.update(dropout_masks="graph", costs="estimate")
    # The capture the plan's graph was traced from, when this model is the one it was
    # (planner.tracing.fingerprint): no dynamo, no AOTAutograd; the graph hash is checked after.
    fingerprint = options.get("fingerprint")
    result = trace_fn(model, inputs, loss_fn=loss_fn, reuse_capture=fingerprint or False,
                      **kwargs)
    if not fingerprint:
        _say_capture(result, "the plan records no model fingerprint (traced before they were "
                     "recorded, or at module level)")
    else:
        _say_capture(result, result.details.get("capture_note", ""))
    return result


logger = logging.getLogger("planner.runtime")


def _say_capture(result: Any, why: str) -> None:
    """Log why the model was captured again rather than the plan's recorded capture used: a
    warning when the model differs from the one the plan was traced from, else a note."""
    if getattr(result, "level", "op") != "op" or result.details.get("capture_source") != \
            "captured":
        return
    level = logging.WARNING if "differs" in why else logging.INFO
    logger.log(level, "apply: captured the model again (%s)", why or "no reason recorded")
    result.details["capture_note"] = why


def _guess(
    model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any, plan: Plan, graph: Graph | None
) -> Any:
    """A plan without trace options: each autocast setting traced (the graph's recorded one, the
    caller's block's, else each in turn), gradient lifetime, optimizer and mask sizes varied
    without tracing again, until the plan's hash matches; else the first trace."""
    from planner.tracing.api import trace as trace_fn
    from planner.tracing.autocast import retrace_settings

    settings = retrace_settings(model, inputs, graph)
    first = None
    for setting in settings:
        result = trace_fn(
            model, inputs, loss_fn=loss_fn, level="op", dropout_masks="graph", autocast=setting
        )
        first = first or result
        if result.joint is None:
            return result
        if graph is not None:
            state = graph.model_state
            return with_state(result, state.gradient_lifetime if state else "step")
        views = [result.graph, eager_sized(result)]
        for view in (v for v in views if v is not None):
            for lifetime in ("backward", "step"):
                for optimizer in OPTIMIZERS:
                    if _with_state(view, lifetime, optimizer).content_hash() == plan.graph_hash:
                        return with_state(result, lifetime, optimizer)
    return first


def with_state(result: Any, lifetime: str, optimizer: str | None = None) -> Any:
    """`result` (a TraceResult) whose graph holds gradients for `lifetime` and optimizer state
    for `optimizer` (no re-trace: both are model-state fields)."""
    graph = _with_state(result.graph, lifetime, optimizer)
    return result if graph is result.graph else dataclasses.replace(result, graph=graph)


def _with_state(graph: Graph, lifetime: str, optimizer: str | None = None) -> Graph:
    state = graph.model_state
    if state is None:
        return graph
    update: dict[str, Any] = {"gradient_lifetime": lifetime}
    if optimizer is not None:
        update["optimizer"] = optimizer
    if all(getattr(state, k) == v for k, v in update.items()):
        return graph
    return graph.model_copy(update={"model_state": state.model_copy(update=update)})


def eager_sized(result: Any) -> Graph | None:
    """The graph of `result` (traced with graph-sized masks, op level) with its dropout masks
    sized as a CPU eager trace sizes them, from the same capture; None when no mask differs
    (no dropout, not on CPU, a module-level trace)."""
    capture, joint = getattr(result, "capture", None), getattr(result, "joint", None)
    if capture is None or joint is None or not _on_cpu(joint):
        return None
    from planner.tracing.records import build_records

    sizes = {
        r.name: r.output_bytes
        for r in build_records(capture, cpu_eager_dropout=True)
        if r.extra.get("eager_sized")
    }
    owners = result.owner_fx_names
    # a graph-sized trace charges CPU dropout's input-dtype mask buffer as the op's workspace
    # (planner.tracing.cpu_workspace); an eager-sized one keeps that buffer as the mask
    dropouts = {n.name for n in joint.graph.nodes
                if n.target is torch.ops.aten.native_dropout.default}
    members = getattr(result, "node_fx_names", {}) or {}
    nodes = []
    for n in result.graph.nodes:
        update: dict[str, int] = {}
        if owners.get(n.id) in sizes:
            update["output_bytes"] = sizes[owners[n.id]]
        if n.workspace_bytes and dropouts & set(members.get(str(n.id), members.get(n.id, ()))):
            update["workspace_bytes"] = 0
        nodes.append(n.model_copy(update=update) if update else n)
    if not sizes or nodes == result.graph.nodes:
        return None
    return result.graph.model_copy(update={"nodes": nodes})


def _on_cpu(joint: Any) -> bool:
    values = (n.meta.get("val") for n in joint.graph.nodes if n.op == "placeholder")
    return all(v.device.type == "cpu" for v in values if isinstance(v, torch.Tensor))


def graph_as_planned(result: Any, plan: Plan, graph: Graph | None = None) -> Graph:
    """The traced graph as the plan's trace sized it: dropout masks eager-sized when the plan's
    graph was traced with eager masks (for an older plan: when that is the view its hash names);
    else `result.graph`. The runtime itself runs `result` (graph-sized masks)."""
    traced = result.graph
    masks = (recorded_options(plan, graph) or {}).get("dropout_masks")
    if masks == "graph" or traced.metadata.extra.get("dropout_masks") == "eager":
        return traced
    eager = eager_sized(result)
    if eager is None or (masks is None and eager.content_hash() != plan.graph_hash):
        return traced
    return eager


def mismatch_detail(plan: Plan, traced: Graph, loss_fn: Any = None) -> str | None:
    """One clause saying how the model as traced now differs from what the plan was made for
    (from the plan's graph summary and trace options), with what to do; None when the plan
    records neither."""
    from planner.tracing.api import loss_name

    summary, options = plan.graph_summary, plan.trace_options
    if summary is None and options is None:
        return None
    now = GraphSummary.of(traced)
    differs = [] if summary is None else _differences(summary, now)
    loss_hint = ""
    if options is not None and "loss" in options and options["loss"] != loss_name(loss_fn):
        own = "the model's own"
        loss_hint = (f"; its graph was traced with loss {options['loss'] or own}, this trace with "
                     f"{loss_name(loss_fn) or own}: pass apply that loss_fn")
    if differs:
        assert summary is not None
        return (f"the plan is for {summary.describe()}, but the model now traces to "
                f"{now.describe()}: {differs[0]}{loss_hint}; apply the plan to the model and "
                "inputs it was made for, or trace and solve again for this one")
    if options is not None and options.get("costs") == "measure":
        return ("the plan's graph has measured costs (traced with costs='measure'), which a new "
                "trace does not reproduce: pass the plan's graph, apply(model, plan, inputs, "
                "graph=planner.core.io.load_graph('graph.json'))")
    return (f"the plan is for graph {plan.graph_hash[:19]}…, but the model now traces to "
            f"{traced.content_hash()[:19]}…, {now.describe()}, as the plan's graph but with "
            f"other op sizes or costs{loss_hint}: pass the plan's graph (graph=) to see which "
            "node differs, or trace and solve again")


_COMPARED = (  # field, what it is, what a difference means
    ("parameters", "parameter tensors", "the model structure differs"),
    ("parameters_bytes", "bytes of parameters", "the model's sizes differ"),
    ("nodes", "nodes", "the model structure differs"),
    ("batch_size", "batch size", "the inputs differ"),
    ("dtype", "dtype", "the precision differs"),
    ("inputs_bytes", "bytes of inputs", "the input shapes differ"),
)


def _differences(planned: GraphSummary, now: GraphSummary) -> list[str]:
    """'the model structure differs (parameter tensors: 17 in the plan's graph, 29 now)', ..."""
    out = []
    for field, label, meaning in _COMPARED:
        a, b = getattr(planned, field), getattr(now, field)
        if a is not None and b is not None and a != b:
            out.append(f"{meaning} ({label}: {a} in the plan's graph, {b} now)")
    return out
