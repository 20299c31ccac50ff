"""Checkpoints of a module's submodules: op-level options of the whole-job planner's per-stage
plan that recompute part of a module ('h.3.mlp', or 'h.3.attn' and 'h.3.mlp' apart) and keep
the rest of it (PipelineStage.unit_policies naming submodules; planner.sim.stage_facts).

A selective checkpoint of the whole module (planner.solvers.pipeline.op_options) reruns every
call it does not keep, and keeps every output of a call it keeps, read by a backward or not.
Freeing a GPT block's MLP activations that way either reruns the attention before them too or
keeps its unread outputs (the scores before the mask, 12.6 MB of a 20 MB block); a checkpoint
of the MLP alone keeps its input and frees the same 8.4 MB for a rerun of the MLP only (24.6 us,
its first linear and GELU, of the block's 175 us on the benchmark's GPT-12). Its options:

- each submodule with saved bytes of its own, checkpointed whole; inside it, selective
  checkpoints as op_options makes them (its calls by rerun time saved per byte kept: the MLP
  keeping its first linear's output reruns the GELU alone);
- each pair of the module's own children, each whole or with those selective options (the
  attention and the MLP apart: the layer norms and the residual adds between them keep
  theirs).

Each carries additive figures bounding the simulator's rule, as op_options' do: the module's
other calls keep theirs, so its other saved roots stay and the figures are exact up to storages
the submodules' inputs share with other modules (counted added) and the backward's working
bytes (counted with nothing else kept). Not offered under a split W (zero-bubble, not the
first stage: planner.solvers.pipeline.stage_items), whose rerun figures they would need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from planner.core.graph import Graph
from planner.core.pipeline_actions import UnitPolicy
from planner.sim.ledger import MemoryLedger
from planner.sim.selective_units import cached_nodes, rerun_ms
from planner.sim.stage_costs import checkpoint_state_bytes
from planner.sim.stage_facts import region_facts, unit_regions
from planner.sim.stage_working import backward_working_bytes
from planner.solvers.pipeline.op_options import Module, OpOption, prefixes, ranked_calls

MOST_OPTIONS = 6  # region options a module keeps (undominated, spread over bytes freed)


def submodules(graph: Graph, m: Module) -> list[str]:
    """The module paths strictly inside the module that its forward's nodes run in."""
    index = graph.index
    name = m.unit.name
    out: set[str] = set()
    for v, n in m.facts.forward:
        if n != name:
            continue
        path = index.node(v).module_path
        while path.startswith(name + "."):
            out.add(path)
            path = path.rpartition(".")[0]
    return sorted(out)


@dataclass(frozen=True)
class _Candidate:
    """A submodule checkpoint's cheap figures; `option` adds the backward's working bytes."""

    regions: tuple[tuple[str, tuple[str, ...]], ...]
    delta_bytes: int
    ms: float
    kept: frozenset[int]  # what the checkpoints keep (inputs and kept calls' outputs)
    inputs: frozenset[int]
    cached: Mapping[str, frozenset[int]]

    def option(self, graph: Graph, m: Module) -> OpOption:
        """With the stage's backward working bytes (over its every backward node)."""
        facts = region_facts(graph, m.facts, [r for r, _ in self.regions])
        chosen: dict[str, UnitPolicy] = {u.name: "keep" for u in facts.units}
        chosen.update((r, "recompute") for r, _ in self.regions)
        transient = backward_working_bytes(graph, facts, chosen, m.least | self.kept,
                                           m.inputs | self.inputs, cached=self.cached)
        # each region a checkpoint call, keeping its state from F to B (sim.stage_costs)
        delta = self.delta_bytes + checkpoint_state_bytes(graph) * len(self.regions)
        return OpOption("recompute", (), delta, 0, transient, self.ms, regions=self.regions)


def region_option(graph: Graph, m: Module,
                  regions: Mapping[str, Sequence[str]]) -> _Candidate | None:
    """Recomputing `regions` (submodule -> the calls its checkpoint keeps) and keeping the
    rest of the module; None where it frees nothing."""
    ledger = MemoryLedger.of(graph)
    size, root = ledger.storage_bytes, ledger.storage_root
    facts = unit_regions(graph, m.facts, m.unit.name, list(regions))  # the module's own nodes
    units = {u.name: u for u in facts.units}
    rest = units[m.unit.name]
    named = {r: list(ops) for r, ops in regions.items() if ops}
    cached = cached_nodes(graph, {r: [v for v, n in facts.forward if n == r] for r in named},
                          named)
    kept_calls = frozenset(root[v] for nodes in cached.values() for v in nodes)
    freed = frozenset().union(*(units[r].saved for r in regions)) & m.exclusive - rest.saved
    inputs = frozenset().union(*(units[r].inputs for r in regions))
    freed_bytes = sum(size[r] for r in freed - inputs - kept_calls)
    if freed_bytes <= 0:
        return None
    # what the checkpoints keep that the all-keep stage does not (an upper bound)
    added = sum(size[r] for r in (inputs | kept_calls) - m.unit.saved - m.least)
    ms = sum(rerun_ms(graph, facts,
                      {r: cached.get(r, frozenset()) for r in regions}).values())
    return _Candidate(tuple(sorted((r, tuple(ops)) for r, ops in regions.items())),
                      added - freed_bytes, ms, inputs | kept_calls, inputs, cached)


def region_options(graph: Graph, m: Module) -> tuple[OpOption, ...]:
    """The module's submodule checkpoints (module doc): those no other frees more bytes for
    less time, at most MOST_OPTIONS. Their cheap figures are memoised on the graph per module
    and what of the stage they depend on (the search asks for the same module in many
    ranges); the backward's working bytes are the range's."""
    u = m.unit
    root = MemoryLedger.of(graph).storage_root
    near = u.saved | u.inputs | {root[v] for v, n in m.facts.forward if n == u.name}
    key = (u.name, m.exclusive & near, m.least & near)  # all the figures read
    memo = graph.index.memo.setdefault("region_options", {})
    found: list[_Candidate] | None = memo.get(key)
    if found is None:
        found = memo[key] = _best(_candidates(graph, m))
    return tuple(c.option(graph, m) for c in found)


def _candidates(graph: Graph, m: Module) -> list[_Candidate]:
    """Each submodule whole and selective, and each pair of disjoint ones."""
    out: list[_Candidate] = []
    per_region: dict[str, list[_Candidate]] = {}
    for r in submodules(graph, m):
        one = region_option(graph, m, {r: ()})
        if one is None:
            continue
        mine = per_region[r] = [one]
        inner = _inner_module(graph, m, r)
        for taken in prefixes(ranked_calls(graph, inner), _saved_bytes(graph, inner)):
            got = region_option(graph, m, {r: tuple(c.name for c in taken)})
            if got is not None:
                mine.append(got)
        out += mine
    children = [r for r in sorted(per_region) if "." not in r[len(m.unit.name) + 1:]]
    for a, b in combinations(children, 2):  # the module's own children, two at a time
        for x, y in product(per_region[a], per_region[b]):
            got = region_option(graph, m, dict(x.regions + y.regions))
            if got is not None:
                out.append(got)
    return out


def _inner_module(graph: Graph, m: Module, region: str) -> Module:
    """The submodule `region` as a module of its own (its facts split off the module's)."""
    facts = region_facts(graph, m.facts, [region])
    unit = next(u for u in facts.units if u.name == region)
    rest = next(u for u in facts.units if u.name == m.unit.name)
    return Module(facts, unit, frozenset(unit.saved & m.exclusive - rest.saved), m.least,
                  m.inputs | unit.inputs)


def _saved_bytes(graph: Graph, m: Module) -> int:
    size = MemoryLedger.of(graph).storage_bytes
    return sum(size[r] for r in m.unit.saved - m.unit.inputs)


def dominated(o: OpOption, others: Sequence[OpOption]) -> bool:
    """Another option is as good in every figure the knapsack adds, and better in one."""
    def key(x: OpOption) -> tuple[float, ...]:
        return (x.delta_bytes, x.ms, x.transient_bytes, x.weight_rerun_bytes, x.host_bytes)
    mine = key(o)
    return any(all(a <= b for a, b in zip(key(x), mine, strict=True)) and key(x) != mine
               for x in others)


def _best(found: list[_Candidate]) -> list[_Candidate]:
    """The candidates no other frees as many bytes for as little time (its transient is
    not compared: it is made only for the ones kept), at most MOST_OPTIONS spread over the
    bytes they free."""
    by_figures: dict[tuple[int, float], _Candidate] = {}
    for c in found:
        by_figures.setdefault((c.delta_bytes, c.ms), c)
    front = [c for (d, t), c in by_figures.items()
             if not any(d2 <= d and t2 <= t and (d2, t2) != (d, t) for d2, t2 in by_figures)]
    front.sort(key=lambda c: c.delta_bytes)  # the most bytes freed first
    if len(front) <= MOST_OPTIONS:
        return front
    # the lower convex hull of (bytes freed, ms) from nothing freed first (the points a
    # knapsack gains most from), then the others spread evenly over the bytes they free
    hull: list[_Candidate] = []
    for c in reversed(front):  # fewest bytes freed first
        while hull and _slope(hull[-1], c) <= (_slope(hull[-2], hull[-1]) if len(hull) > 1
                                               else _slope(None, hull[-1])):
            hull.pop()
        hull.append(c)
    picked = hull[-MOST_OPTIONS:]
    step = (len(front) - 1) / (MOST_OPTIONS - 1)
    for k in range(MOST_OPTIONS):
        if len(picked) < MOST_OPTIONS and front[round(k * step)] not in picked:
            picked.append(front[round(k * step)])
    return sorted(picked, key=lambda c: c.delta_bytes)


def _slope(a: _Candidate | None, b: _Candidate) -> float:
    """Rerun ms per byte freed from `a` (None: nothing freed) to `b`."""
    da, ta = (0, 0.0) if a is None else (a.delta_bytes, a.ms)
    return (b.ms - ta) / max(1, da - b.delta_bytes)
