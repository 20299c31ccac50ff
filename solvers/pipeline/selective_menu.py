"""Selective checkpointing choices for one module of a stage: the op-level part of the
whole-job planner's per-stage plan (PipelineStage.unit_saved_ops).

A module recomputed under a selective checkpoint keeps the outputs of some of its calls and
reruns the others before its backward (planner.sim.selective_units). Which calls to keep is a
small knapsack per module: keeping a call whose output the backward reads saves its rerun time
(`gain_ms`, the call and its getitems) for the bytes of its outputs. The calls are ranked by
time saved per byte kept (as the single-device greedy planners rank what to keep) and the
prefixes that keep a quarter, a half and three quarters of the bytes worth keeping are the
module's options, between "recompute" (keep none) and "keep" (autograd keeps all).

Each option carries additive figures that bound the simulator's rule (as stage_menu's `Item`
does for the other policies): the saved bytes it frees at least (the module's exclusive saved
roots that no call keeps) and adds at most (its inputs and the kept outputs outside its saved
roots), its backward working bytes with nothing else changed, its rerun's time.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.pipeline_actions import UnitPolicy
from planner.sim.ledger import MemoryLedger
from planner.sim.selective_units import call_outputs, rerun_ms, unit_calls
from planner.sim.stage_policies import (
    StageFacts,
    UnitFacts,
    backward_working_bytes,
    weight_rerun_bytes,
)

FRACTIONS = (0.25, 0.5, 0.75)  # of the bytes worth keeping, per option


@dataclass(frozen=True)
class Selective:
    """One selective option of a module and its additive figures (bytes of storage roots)."""

    saved_ops: tuple[str, ...]  # 'OP#K' calls whose outputs the checkpoint keeps
    delta_bytes: int  # saved bytes per micro-batch over the all-keep stage (upper bound)
    transient_bytes: int  # its backward working bytes (upper bound)
    rerun_ms: float
    weight_rerun_bytes: int = 0  # under a split W (zero-bubble, not the first stage)


@dataclass(frozen=True)
class _Call:
    name: str
    nodes: frozenset[int]  # the call and its getitems
    roots: frozenset[int]
    cost_bytes: int
    gain_ms: float


def _worth_keeping(graph: Graph, facts: StageFacts, u: UnitFacts) -> list[_Call]:
    """The module's calls whose outputs its backward reads, best time per byte first."""
    ledger = MemoryLedger.of(graph)
    root, size, ms = ledger.storage_root, ledger.storage_bytes, ledger.compute_ms
    forward = [v for v, n in facts.forward if n == u.name]
    made_saved = u.saved - u.inputs
    out = []
    for name, v in unit_calls(graph, forward):
        nodes = call_outputs(graph, forward, v)
        roots = frozenset(root[w] for w in nodes)
        gain = sum(ms[w] for w in nodes)
        if roots & made_saved and gain > 0:
            out.append(_Call(name, nodes, roots, sum(size[r] for r in roots - u.inputs), gain))
    return sorted(out, key=lambda c: (-c.gain_ms / max(c.cost_bytes, 1), c.name))


def selective_options(graph: Graph, facts: StageFacts, u: UnitFacts, exclusive: Set[int],
                      least: Set[int], inputs: Set[int],
                      weight_reruns: bool) -> tuple[Selective, ...]:
    """The module's selective options (`exclusive`: its saved roots nothing else of the stage
    keeps; `least`: what the stage keeps whatever the policies; `inputs`: every module's)."""
    calls = _worth_keeping(graph, facts, u)
    total = sum(c.cost_bytes for c in calls)
    if not calls or total == 0:
        return ()
    size = MemoryLedger.of(graph).storage_bytes
    prefixes: list[list[_Call]] = []
    for fraction in FRACTIONS:
        taken, spent = [], 0
        for c in calls:
            if spent + c.cost_bytes <= fraction * total:
                taken.append(c)
                spent += c.cost_bytes
        if taken and len(taken) < len(calls) and all(taken != p for p in prefixes):
            prefixes.append(taken)
    alone: dict[str, UnitPolicy] = {w.name: "keep" for w in facts.units}
    alone[u.name] = "recompute"
    out = []
    for taken in prefixes:
        nodes = frozenset().union(*(c.nodes for c in taken))
        roots = frozenset().union(*(c.roots for c in taken))
        cached = {u.name: nodes}
        delta = (-sum(size[r] for r in exclusive - roots) + sum(size[r] for r in u.inputs)
                 + sum(size[r] for r in roots - u.saved))
        transient = backward_working_bytes(graph, facts, alone, set(least) | u.inputs | roots,
                                           inputs, cached=cached)
        rerun = weight_rerun_bytes(graph, facts, alone, False) if weight_reruns else 0
        out.append(Selective(tuple(c.name for c in taken), delta, transient,
                             rerun_ms(graph, facts.forward, cached)[u.name], rerun))
    return tuple(out)
