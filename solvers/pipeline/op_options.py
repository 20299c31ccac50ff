"""Op-level choices for one module of a stage: the part of the whole-job planner's per-stage plan
below a module (PipelineStage.unit_saved_ops and unit_offload_ops).

- Selective checkpointing: a recomputed module keeps the outputs of some of its calls and reruns
  the others before its backward (planner.sim.selective_units). The checkpoint reruns every
  call it does not keep up to the module's last saving (torch's early stop), whether the
  backward reads its output or not, so every call before it is a candidate: keeping it saves
  its rerun time (the call and its getitems) for the bytes of its outputs not held anyway; the
  calls are ranked by time saved per byte kept (as the single-device greedy planners rank what
  to keep). Keeping a GPT block's causal mask and its attention's output projection, which the
  backward does not read, saves their reruns for few bytes (GPT-24 on 8 ranks, 1F1B, 1x: 11.6 %
  over the fastest unconstrained split with only read calls as candidates, 7.9 % with them).
- Partial offload: an offloaded module copies only the saved tensors on some calls' outputs to
  the host; the rest stay on the device. The calls are ranked by the saved bytes they move,
  largest first (fewest copies for the bytes).

For each, the calls taken in that order while they fit in a quarter, a half and three quarters
of the module's saved bytes (a checkpoint) or of the candidates' bytes (an offload) are the
module's options, between the whole-module policy and "keep". Each option carries additive
figures that bound the simulator's rule, as stage_menu's `Item` does for whole-module
policies: the saved bytes it frees at least (the module's exclusive saved roots it drops) and
adds at most (a checkpoint's inputs and kept outputs outside its saved roots and what the stage
keeps whatever the policies), its host bytes
(exact), its backward working bytes with nothing else changed, and its time (a rerun's, or its
copies out and back in the stage's stream: planner.sim.unit_times).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.pipeline_actions import UnitPolicy
from planner.sim.ledger import MemoryLedger
from planner.sim.selective_units import call_outputs, rerun_ms, unit_calls
from planner.sim.stage_costs import checkpoint_state_bytes
from planner.sim.stage_policies import StageFacts, UnitFacts, weight_rerun_bytes
from planner.sim.stage_working import backward_working_bytes

FRACTIONS = (0.25, 0.5, 0.75)  # of a module's saved (or offload candidates') bytes, per option


@dataclass(frozen=True)
class OpOption:
    """One op-level option of a module and its additive figures (bytes of storage roots)."""

    policy: UnitPolicy  # "recompute" (ops: the calls kept) or "offload" (ops: the calls moved)
    ops: tuple[str, ...]  # 'OP#K' calls
    delta_bytes: int  # saved bytes per micro-batch over the all-keep stage (upper bound)
    host_bytes: int  # its host copies per micro-batch
    transient_bytes: int  # its backward working bytes (upper bound)
    ms: float  # added time (a rerun, or the copies)
    weight_rerun_bytes: int = 0  # under a split W (zero-bubble, not the first stage)
    # submodules recomputed instead of the module, each with the calls its checkpoint keeps
    # (planner.solvers.pipeline.region_options; empty: `policy` and `ops` are the module's)
    regions: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Module:
    """What the options of one module are judged against."""

    facts: StageFacts
    unit: UnitFacts
    exclusive: frozenset[int]  # its saved roots nothing else of the stage keeps
    least: frozenset[int]  # what the stage keeps whatever the policies
    inputs: frozenset[int]  # every module's inputs (a checkpoint holds them)


@dataclass(frozen=True)
class _Call:
    name: str
    nodes: frozenset[int]  # the call and its getitems
    roots: frozenset[int]
    cost_bytes: int  # its outputs' bytes not held anyway
    gain_ms: float  # the call and its getitems, where the checkpoint reruns them


def calls_of(graph: Graph, m: Module, saved_only: bool = False) -> list[_Call]:
    """The module's calls (`saved_only`: those with an output its backward reads)."""
    ledger = MemoryLedger.of(graph)
    root, size, ms = ledger.storage_root, ledger.storage_bytes, ledger.compute_ms
    forward = [v for v, n in m.facts.forward if n == m.unit.name]
    made_saved = m.unit.saved - m.unit.inputs
    held = m.unit.inputs if saved_only else m.unit.inputs | m.least
    out = []
    for name, v in unit_calls(graph, forward):
        nodes = call_outputs(graph, forward, v)
        roots = frozenset(root[w] for w in nodes)
        if roots & made_saved or not saved_only:
            out.append(_Call(name, nodes, roots, sum(size[r] for r in roots - held),
                             sum(ms[w] for w in nodes & m.unit.rerun)))
    return out


def ranked_calls(graph: Graph, m: Module) -> list[_Call]:
    """The module's calls worth keeping, the most rerun time saved per byte kept first."""
    return sorted((c for c in calls_of(graph, m) if c.gain_ms > 0),
                  key=lambda c: (-c.gain_ms / max(c.cost_bytes, 1), c.name))


def prefixes(calls: Sequence[_Call], total: int) -> list[list[_Call]]:
    """Per fraction of `total` bytes, the calls taken in order while they fit within it."""
    out: list[list[_Call]] = []
    for fraction in FRACTIONS:
        taken, spent = [], 0
        for c in calls:
            if spent + c.cost_bytes <= fraction * total:
                taken.append(c)
                spent += c.cost_bytes
        if taken and len(taken) < len(calls) and all(taken != p for p in out):
            out.append(taken)
    return out


def selective_options(graph: Graph, m: Module, weight_reruns: bool) -> tuple[OpOption, ...]:
    """Recompute the module keeping the best time-per-byte calls' outputs."""
    calls = ranked_calls(graph, m)
    size = MemoryLedger.of(graph).storage_bytes
    u = m.unit
    alone: dict[str, UnitPolicy] = {w.name: "keep" for w in m.facts.units}
    alone[u.name] = "recompute"
    out = []
    held = u.saved | u.inputs | m.least  # kept outputs there add nothing
    for taken in prefixes(calls, sum(size[r] for r in u.saved - u.inputs)):
        nodes = frozenset().union(*(c.nodes for c in taken))
        roots = frozenset().union(*(c.roots for c in taken))
        cached = {u.name: nodes}
        delta = (-sum(size[r] for r in m.exclusive - roots) + sum(size[r] for r in u.inputs)
                 + sum(size[r] for r in roots - held) + checkpoint_state_bytes(graph))
        transient = backward_working_bytes(graph, m.facts, alone, m.least | u.inputs | roots,
                                           m.inputs, cached=cached)
        rerun = weight_rerun_bytes(graph, m.facts, alone, False) if weight_reruns else 0
        out.append(OpOption("recompute", tuple(c.name for c in taken), delta, 0, transient,
                            rerun_ms(graph, m.facts, cached)[u.name], rerun))
    return tuple(out)


def offload_options(graph: Graph, m: Module,
                    copy_ms: Callable[[frozenset[int]], float]) -> tuple[OpOption, ...]:
    """Offload only the saved tensors on the largest calls' outputs (`copy_ms`: the copies'
    time, for the roots moved)."""
    u = m.unit
    calls = sorted(calls_of(graph, m, saved_only=True), key=lambda c: (-c.cost_bytes, c.name))
    size = MemoryLedger.of(graph).storage_bytes
    alone: dict[str, UnitPolicy] = {w.name: "keep" for w in m.facts.units}
    alone[u.name] = "offload"
    out = []
    for taken in prefixes(calls, sum(c.cost_bytes for c in calls)):
        moved = frozenset().union(*(c.roots for c in taken)) & u.saved
        host = u.host_bytes_of(moved, size)
        transient = backward_working_bytes(graph, m.facts, alone, m.least | (u.saved - moved),
                                           m.inputs, moved={u.name: moved})
        out.append(OpOption("offload", tuple(c.name for c in taken),
                            -sum(size[r] for r in m.exclusive & moved), host, transient,
                            copy_ms(moved)))
    return tuple(out)


def module(facts: StageFacts, unit: UnitFacts, least: Set[int], inputs: Set[int]) -> Module:
    others = set(least)
    for w in facts.units:
        if w is not unit:
            others |= w.saved
    return Module(facts, unit, frozenset(unit.saved - others), frozenset(least),
                  frozenset(inputs))
