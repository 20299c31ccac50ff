"""Tracing a model again as the plan's graph was traced, when `apply` is given no trace.

A plan names its graph by hash only; the options that shape a graph (dropout-mask sizes,
gradient lifetime, autocast) are tried until the hash matches (`trace_as_planned`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from planner.core.graph import Graph
from planner.core.plan import Plan


def trace_as_planned(
    model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any, plan: Plan, graph: Graph | None
) -> Any:
    """The model traced (op level) as the plan's graph was, when that can be told from its hash.

    The runtime runs the joint graph, so masks are sized as it keeps them (bool); a plan solved
    on an eager-sized trace (the CLI's default) is recognised as well, and so is either gradient
    lifetime (the traced default "backward", or "step"). With `graph`, its lifetime is taken.
    Autocast: the graph's recorded setting, else the caller's autocast block's, else each
    setting in turn (planner.tracing.autocast.retrace_settings)."""
    from planner.tracing.api import trace as trace_fn
    from planner.tracing.autocast import retrace_settings

    settings = retrace_settings(model, inputs, graph)
    first = trace_fn(
        model, inputs, loss_fn=loss_fn, level="op", dropout_masks="graph", autocast=settings[0]
    )
    if first.joint is None:
        return first
    if graph is not None:
        state = graph.model_state
        return with_lifetime(first, state.gradient_lifetime if state else "step")
    # Eager-sized masks differ only for dropout on CPU.
    masks_differ = any(n.random for n in first.graph.nodes) and all(
        p.device.type == "cpu" for p in model.parameters()
    )
    for setting in settings:
        for masks in ("graph", "eager") if masks_differ else ("graph",):
            result = first if (setting, masks) == (settings[0], "graph") else trace_fn(
                model, inputs, loss_fn=loss_fn, dropout_masks=masks, autocast=setting
            )
            for lifetime in ("backward", "step"):
                candidate = with_lifetime(result, lifetime)
                if candidate.graph.content_hash() == plan.graph_hash:
                    return candidate
    return first


def with_lifetime(result: Any, lifetime: str) -> Any:
    """`result` (a TraceResult) whose graph holds gradients for `lifetime` (no re-trace)."""
    state = result.graph.model_state
    if state is None or state.gradient_lifetime == lifetime:
        return result
    graph = result.graph.model_copy(
        update={"model_state": state.model_copy(update={"gradient_lifetime": lifetime})}
    )
    return dataclasses.replace(result, graph=graph)
