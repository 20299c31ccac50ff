"""Hand-built offload plans: what `save_on_cpu` does, written as a plan the simulator can judge.

`boundary_offload(graph, actions)` takes any one-device compute/free plan (store-all, a remat
plan) and offloads every node it keeps across the forward/backward boundary: `O v F v` right
after v's last use in the forward, `P v D v` before its first use in the backward (`lead`
computations earlier, so that the copy can hide behind them), the host copy dropped as soon as
the prefetch is issued (its buffer is reused only after that copy: runtime/offload_engine.py).
Each `F v` is then moved to where v's copy has ended (planner.sim.free_placement), the point at
which the simulator and the runtime release it.
Views (alias_of) stay on the device, and so do nodes with a resident view. Used by the runtime
tests and benchmarks/offload_runtime_gpu.py; the planners proper live in solvers/offload.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp, Plan, PlanStatus, drop, free, offload, prefetch
from planner.core.resources import Resources
from planner.sim.free_placement import place_frees
from planner.sim.ledger import MemoryLedger


def backward_start(graph: Graph, actions: Sequence[Action]) -> int:
    """Index of the plan's first backward computation (len(actions) when none)."""
    phase = {n.id: n.phase for n in graph.nodes}
    return next(
        (i for i, a in enumerate(actions) if a.op is ActionOp.compute
         and phase[a.node] == "backward"),
        len(actions),
    )


def boundary_offload(
    graph: Graph, actions: Sequence[Action], *, lead: int = 1, min_bytes: int = 1
) -> list[Action]:
    """`actions` with every node of at least `min_bytes` kept across the boundary offloaded."""
    ledger = MemoryLedger.of(graph)  # storage roots and bytes: the simulator's view rule
    acts = list(actions)
    split = backward_start(graph, acts)
    resident: set[int] = set()
    made: dict[int, int] = {}  # node -> position of its last forward computation
    for i, a in enumerate(acts[:split]):
        if a.op is ActionOp.compute:
            resident.add(a.node)
            made[a.node] = i
        elif a.op is ActionOp.free:
            resident.discard(a.node)
    viewed = {ledger.storage_root[v] for v in resident if ledger.is_view(v)}
    reads: dict[int, list[int]] = {}  # node -> positions of the computations that read it
    for i, a in enumerate(acts):
        if a.op is ActionOp.compute:
            for u in ledger.predecessors[a.node]:
                reads.setdefault(u, []).append(i)
    # one pass each instead of a scan per node (linear on 5,000-node plans)
    touched: dict[int, int] = {}  # node -> its first action from the boundary on
    for i in range(len(acts) - 1, split - 1, -1):
        touched[acts[i].node] = i
    computes = [i for i in range(split, len(acts)) if acts[i].op is ActionOp.compute]
    inserts: dict[int, list[Action]] = {}  # position -> actions inserted before it
    for v in sorted(resident):
        if graph.index.node(v).phase != "forward" or ledger.is_view(v) or v in viewed:
            continue
        if ledger.storage_bytes[v] < min_bytes:
            continue
        after = [i for i in reads.get(v, []) if i >= split]
        if not after:
            continue
        first = min(after)
        # v must stay as computed in the forward up to its first backward read
        if touched.get(v, first) < first:
            continue
        before = [i for i in reads.get(v, []) if i < split]
        last = max([made[v], *before]) + 1
        inserts.setdefault(last, []).extend([offload(v), free(v)])
        ahead = bisect_left(computes, first)  # the computations in [split, first)
        at = computes[ahead - lead] if lead and ahead >= lead else first
        inserts.setdefault(at, []).extend([prefetch(v), drop(v)])
    out: list[Action] = []
    for i, a in enumerate(acts):
        out.extend(inserts.get(i, []))
        out.append(a)
    out.extend(inserts.get(len(acts), []))
    return out


def boundary_offload_plan(
    graph: Graph,
    actions: Sequence[Action],
    resources: Resources,
    *,
    method: str = "boundary-offload",
    lead: int = 1,
    min_bytes: int = 1,
) -> Plan:
    """A checked Plan (kind offload or remat+offload) with the simulator's prediction."""
    # each free goes where its copy has ended: the plan's order is the allocator's order
    acts, sim = place_frees(
        graph, boundary_offload(graph, actions, lead=lead, min_bytes=min_bytes), resources
    )
    return Plan(
        graph_hash=graph.content_hash(),
        budget_bytes=sim.peak_bytes,
        resources=resources,
        method=method,
        status=PlanStatus.feasible,
        predicted=sim.predicted(),
        actions=acts,
    )
