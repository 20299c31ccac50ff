"""A pipeline stage's facts for its unit policies (planner.sim.stage_policies): per unit (a
module of the stage, 'h.3', or a submodule a policy names, 'h.3.mlp'), what its backward keeps
from its forward, what it reads from outside, its times and its host copies; and the stage's
nodes in execution order with their unit.

A policy may name a submodule of a unit (PipelineStage.unit_policies: 'h.3.mlp'): it is a
unit of its own then (`region_facts`), the nodes inside it leave the enclosing unit, whose
other nodes keep theirs. So a checkpoint of the MLP alone keeps its input and frees what only
the MLP's backward reads, and reruns the MLP, not the attention before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace

from planner.core.graph import Graph, Phase
from planner.sim.ledger import MemoryLedger
from planner.sim.result import PlanError
from planner.sim.stage_costs import gradient_nodes

# operators whose backward reads none of their inputs (autograd saves none for them)
SAVES_NOTHING = frozenset({
    "getitem", "aten.add", "aten.sub", "aten.neg", "aten.clone", "aten.cat", "aten.view",
    "aten._unsafe_view", "aten.reshape", "aten.t", "aten.transpose", "aten.permute",
    "aten.expand", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select",
    "aten.split", "aten.split_with_sizes", "aten.alias", "aten.detach", "aten.contiguous",
})


@dataclass(frozen=True)
class UnitFacts:
    name: str
    saved: frozenset[int]  # storage roots its backward nodes read from forward nodes
    inputs: frozenset[int]  # roots produced outside the unit that its forward nodes read
    forward_ms: float
    backward_ms: float
    host_bytes: int  # offloaded: one host copy per (backward node, forward root) it saves
    weight_groups: int  # modules whose parameters' gradient nodes it holds (W's autograd calls)
    input_read: frozenset[int]  # of saved, roots an input-gradient (not weight) node reads
    saving: tuple[tuple[int, int], ...] = ()  # (saved root, its backward nodes saving it)
    weight_read: frozenset[int] = frozenset()  # of saved, roots a weight-gradient node reads
    rerun: frozenset[int] = frozenset()  # forward nodes its checkpoint reruns (`checkpoint_rerun`)
    rerun_ms: float = 0.0  # their time

    def host_bytes_of(self, moved: Set[int] | None, size: Mapping[int, int]) -> int:
        """Host bytes when only the `moved` roots go to the host (None: every saved one)."""
        if moved is None:
            return self.host_bytes
        return sum(count * size[r] for r, count in self.saving if r in moved)

    def copies_of(self, moved: Set[int] | None) -> int:
        """How many host copies `host_bytes_of(moved)` is made of (one a saving)."""
        return sum(count for r, count in self.saving if moved is None or r in moved)


@dataclass(frozen=True)
class StageFacts:
    """One stage's units (module order), what its nodes outside them keep, and its nodes in
    execution order with their unit (None: outside every unit)."""

    units: tuple[UnitFacts, ...]
    rest_saved: frozenset[int]  # saved by backward nodes outside units, plus received roots
    held: frozenset[int]  # roots the stage sends on and its loss: kept whatever the policies
    rest_forward_ms: float
    rest_backward_ms: float
    forward: tuple[tuple[int, str | None], ...] = ()  # forward and loss nodes
    backward: tuple[tuple[int, str | None], ...] = ()


def _unit_of(module_path: str, modules: frozenset[str]) -> str | None:
    """The stage module containing `module_path` (itself or its nearest enclosing one)."""
    path = module_path
    while path:
        if path in modules:
            return path
        path = path.rpartition(".")[0]
    return None


def _backward_nodes(graph: Graph) -> frozenset[int]:
    """The graph's backward nodes (memoised on the graph)."""
    memo = graph.index.memo
    got: frozenset[int] | None = memo.get("backward_nodes")
    if got is None:
        got = memo["backward_nodes"] = frozenset(n.id for n in graph.nodes
                                                 if n.phase == Phase.backward)
    return got


def stage_facts(graph: Graph, nodes: Iterable[int], modules: Sequence[str]) -> StageFacts:
    """The facts of the stage made of `nodes` whose units are `modules`."""
    ledger = MemoryLedger.of(graph)
    index = graph.index
    root, preds, ms = ledger.storage_root, ledger.predecessors, ledger.compute_ms
    inside = set(nodes)
    names = frozenset(modules)
    saved: dict[str | None, set[int]] = {m: set() for m in modules}
    saved[None] = set()
    inputs: dict[str, set[int]] = {m: set() for m in modules}
    fwd: dict[str | None, float] = dict.fromkeys([*modules, None], 0.0)
    bwd: dict[str | None, float] = dict.fromkeys([*modules, None], 0.0)
    unit = {v: _unit_of(index.node(v).module_path, names) for v in inside}
    backward = _backward_nodes(graph)
    held: set[int] = set()
    pairs: set[tuple[int, int]] = set()  # (backward node, forward root it saves)
    grad_nodes = gradient_nodes(graph)
    input_read: set[int] = set()  # forward roots an input-gradient backward node reads
    weight_read: set[int] = set()  # forward roots a weight-gradient node reads
    groups: dict[str | None, set[str]] = {m: set() for m in modules}  # unit -> weight groups
    for param in graph.model_state.parameters if graph.model_state is not None else ():
        g = param.gradient_node
        if param.trainable and g is not None and g in inside:
            groups.setdefault(unit[g], set()).add(param.module_path)
    for v in inside:
        u = unit[v]
        back = v in backward
        if index.node(v).phase == Phase.loss:
            held.add(root[v])
        elif not back:
            for w in ledger.successors[v]:
                if w not in inside and w not in backward:  # sent on to a later stage
                    held.add(root[v])
                    break
        (bwd if back else fwd)[u] += ms[v]
        for p in preds[v]:
            p_back = p in backward
            if back and not p_back:  # forward data this backward node keeps
                saved[u].add(root[p])
                pairs.add((v, root[p]))
                (input_read if v not in grad_nodes else weight_read).add(root[p])
            elif not back and not p_back:
                if p not in inside:  # received from an earlier stage: kept per micro-batch
                    saved[None].add(root[p])
                if u is not None and (p not in inside or unit[p] != u):
                    inputs[u].add(root[p])
    size = ledger.storage_bytes
    saving: dict[str | None, dict[int, int]] = {m: {} for m in modules}
    for w, r in pairs:
        if unit[w] is not None:
            saving[unit[w]][r] = saving[unit[w]].get(r, 0) + 1
    order = [n.id for n in graph.nodes if n.id in inside]  # the trace's order: execution order
    rerun = {m: checkpoint_rerun(graph, [v for v in order if unit[v] == m and v not in backward],
                                 saved[m]) for m in modules}
    units = tuple(UnitFacts(m, frozenset(saved[m]), frozenset(inputs[m]), fwd[m], bwd[m],
                            sum(size[r] for w, r in pairs if unit[w] == m), len(groups[m]),
                            frozenset(saved[m] & input_read), tuple(sorted(saving[m].items())),
                            frozenset(saved[m] & weight_read), rerun[m],
                            sum(ms[v] for v in rerun[m]))
                  for m in modules)
    return StageFacts(units, frozenset(saved[None]), frozenset(held), fwd[None], bwd[None],
                      tuple((v, unit[v]) for v in order if v not in backward),
                      tuple((v, unit[v]) for v in order if v in backward))


def checkpoint_rerun(graph: Graph, forward: Sequence[int], saved: Set[int]) -> frozenset[int]:
    """The nodes of a unit's forward (`forward`, in execution order) that its checkpoint reruns
    before its backward. Torch's non-reentrant checkpoint stops its rerun once every tensor the
    forward saved is saved again (early stop, its default), and an op saves its inputs before it
    computes (its outputs after). So the rerun ends at the last saving of a `saved` root: at its
    producer (included) or before a node reading it (excluded). Which reader saves a root is not
    known, so the last one that may is taken (not an op that saves nothing: SAVES_NOTHING):
    never shorter than torch's rerun. Every node when a saved root is neither made nor read so
    there (where it is saved is not known). On a GPT block the rerun ends before the MLP's second
    linear, which saves only its input (the residual add after it saves nothing)."""
    ledger = MemoryLedger.of(graph)
    root, preds = ledger.storage_root, ledger.predecessors
    index = graph.index
    end: dict[int, int] = {}  # saved root -> the rerun's length that covers its saving
    for i, v in enumerate(forward):
        if index.node(v).op.rstrip("_") not in SAVES_NOTHING:
            for p in preds[v]:
                if root[p] in saved:
                    end[root[p]] = max(end.get(root[p], 0), i)
        if root[v] in saved:
            end[root[v]] = max(end.get(root[v], 0), i + 1)
    if len(end) < len(saved):
        return frozenset(forward)
    return frozenset(forward[:max(end.values(), default=0)])


def unit_regions(graph: Graph, facts: StageFacts, unit: str,
                 regions: Sequence[str]) -> StageFacts:
    """The facts of `unit`'s own nodes (of the stage `facts`) with `regions`, submodules of it,
    units of their own (memoised on the graph: a unit's nodes are the same in every stage
    holding it). PlanError (one line) for a region without an op in the graph's forward."""
    memo = graph.index.memo.setdefault("unit_regions", {})
    key = (unit, tuple(sorted(regions)))
    local: StageFacts | None = memo.get(key)
    if local is None:
        nodes = [v for v, n in (*facts.forward, *facts.backward) if n == unit]
        local = memo[key] = stage_facts(graph, nodes, [unit, *key[1]])
    empty = [r for r in key[1] if not any(n == r for _, n in local.forward)]
    if empty:
        raise PlanError(f"unit_policies: {empty[0]!r} runs no op of the graph's forward "
                        f"inside {unit!r}; name a submodule that does (or the module)")
    return local


def region_facts(graph: Graph, facts: StageFacts, names: Iterable[str]) -> StageFacts:
    """`facts` with each of `names` that is not a unit but inside one (a policy's submodule,
    'h.3.mlp') made a unit of its own: its nodes leave the enclosing unit ('h.3'). PlanError
    (one line) for a name outside every unit or without an op in the graph."""
    units = {u.name for u in facts.units}
    regions = sorted(set(names) - units)
    if not regions:
        return facts
    by_owner: dict[str, list[str]] = {}
    for r in regions:
        owner = _unit_of(r, frozenset(units))
        if owner is None:
            raise PlanError(f"unit_policies: {r!r} is not a module of the stage nor inside one; "
                            "name one of its modules or a submodule of one")
        by_owner.setdefault(owner, []).append(r)
    out: list[UnitFacts] = []
    unit_of: dict[int, str | None] = {}
    for u in facts.units:
        inner = by_owner.get(u.name)
        if not inner:
            out.append(u)
            continue
        local = unit_regions(graph, facts, u.name, inner)
        out.extend(local.units)
        unit_of.update((v, n) for v, n in (*local.forward, *local.backward))
    return replace(facts, units=tuple(out),
                   forward=tuple((v, unit_of.get(v, n)) for v, n in facts.forward),
                   backward=tuple((v, unit_of.get(v, n)) for v, n in facts.backward))
