"""Selective activation checkpointing inside a 'recompute' unit (PipelineStage.unit_saved_ops).

A recompute unit with saved ops runs under non-reentrant `torch.utils.checkpoint` with a
selective policy (planner.runtime.pipeline_units): the named calls' outputs are kept by the
checkpoint (MUST_SAVE: torch caches every output of such a call), every other op of the unit
reruns before its backward, up to the unit's last saving (planner.sim.stage_facts
`checkpoint_rerun`). An op is named 'OP#K', the K-th call (from 0) of operator OP in
the unit's forward, OP as the graph names it ('aten.addmm'); the graph's `getitem` nodes are
the outputs of the call before them, not calls, and an in-place call counts as its functional
operator, as the runtime counts them.

Per unit this module gives the nodes the checkpoint keeps (`cached`), which the simulator's rule
(planner.sim.stage_policies) adds to the device's kept bytes and leaves out of the rerun; and,
for an 'offload' unit that names calls (PipelineStage.unit_offload_ops), the storage roots it
moves to the host (`unit_moved`): only saved tensors on those calls' outputs are copied, the
unit's other saved tensors stay on the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from planner.core.graph import Graph
from planner.core.pipeline_actions import UnitPolicy, saved_op, saved_op_parts
from planner.sim.ledger import MemoryLedger
from planner.sim.result import PlanError
from planner.sim.stage_facts import StageFacts

GETITEM = "getitem"


def op_name(op: str) -> str:
    """The operator a call counts as: 'aten.add_' -> 'aten.add' (in-place as functional)."""
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


def unit_calls(graph: Graph, forward: Sequence[int]) -> list[tuple[str, int]]:
    """('OP#K', node) for a unit's forward nodes in execution order, getitems left out."""
    index = graph.index
    seen: dict[str, int] = {}
    out = []
    for v in forward:
        op = op_name(index.node(v).op)
        if op == GETITEM or not op:
            continue
        k = seen.get(op, 0)
        seen[op] = k + 1
        out.append((saved_op(op, k), v))
    return out


def call_outputs(graph: Graph, forward: Sequence[int], node: int) -> frozenset[int]:
    """The node and the getitems that take its outputs apart (what the checkpoint keeps)."""
    index = graph.index
    inside = set(forward)
    parts = {w for w in index.successors[node]
             if w in inside and index.node(w).op == GETITEM}
    return frozenset({node, *parts})


def cached_nodes(graph: Graph, forward: Mapping[str, Sequence[int]],
                 saved_ops: Mapping[str, Sequence[str]],
                 field: str = "unit_saved_ops") -> dict[str, frozenset[int]]:
    """Per unit with named calls, the forward nodes of those calls and their getitems (what a
    selective checkpoint keeps, or what a partial offload moves); `forward`: each unit's
    forward nodes in execution order. PlanError (one line, naming `field`) for a call the
    unit's forward does not make."""
    out: dict[str, frozenset[int]] = {}
    for unit, ops in saved_ops.items():
        nodes = forward.get(unit, ())
        calls = dict(unit_calls(graph, nodes))
        kept: set[int] = set()
        for name in ops:
            op, k = saved_op_parts(name)
            v = calls.get(saved_op(op_name(op), k))
            if v is None:
                count = sum(1 for c in calls if c.rpartition("#")[0] == op_name(op))
                raise PlanError(
                    f"{field}[{unit!r}]: {name!r} is not a call of the module's forward "
                    f"({op} is called {count} times there); name calls 'OP#K' with K below that"
                )
            kept |= call_outputs(graph, nodes, v)
        out[unit] = frozenset(kept)
    return out


Order = Sequence[tuple[int, str | None]]  # a stage's forward nodes in order, with their unit


def unit_cached(graph: Graph, forward: Order, chosen: Mapping[str, UnitPolicy],
                saved_ops: Mapping[str, Sequence[str]] | None) -> dict[str, frozenset[int]]:
    """Per recompute unit with saved ops, the nodes its selective checkpoint keeps."""
    named = {u: ops for u, ops in (saved_ops or {}).items()
             if chosen.get(u) == "recompute" and ops}
    if not named:
        return {}
    nodes = {u: [v for v, n in forward if n == u] for u in named}
    return cached_nodes(graph, nodes, named)


def rerun_ms(graph: Graph, facts: StageFacts,
             cached: Mapping[str, Set[int]]) -> dict[str, float]:
    """A selective unit's rerun: what its checkpoint reruns (UnitFacts.rerun: torch stops
    after the last saving) less the calls it keeps."""
    ms = MemoryLedger.of(graph).compute_ms
    units = {u.name: u for u in facts.units}
    return {u: sum(ms[v] for v in units[u].rerun if v not in nodes)
            for u, nodes in cached.items()}


def unit_moved(graph: Graph, forward: Order, chosen: Mapping[str, UnitPolicy],
               offload_ops: Mapping[str, Sequence[str]] | None) -> dict[str, frozenset[int]]:
    """Per offload unit with named calls (unit_offload_ops), the storage roots of those calls'
    outputs: the only saved tensors it copies to the host (the rest stay on the device)."""
    named = {u: ops for u, ops in (offload_ops or {}).items()
             if chosen.get(u) == "offload" and ops}
    if not named:
        return {}
    root = MemoryLedger.of(graph).storage_root
    nodes = {u: [v for v, n in forward if n == u] for u in named}
    return {u: frozenset(root[v] for v in calls)
            for u, calls in cached_nodes(graph, nodes, named, "unit_offload_ops").items()}
