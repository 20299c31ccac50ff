"""The working bytes of a pipeline stage's F and B under per-unit policies
(planner.sim.stage_policies): what the stage holds on top of a micro-batch's kept bytes while
its forward or backward nodes run. The rules are stated in stage_policies' module doc; the
whole-job planner's knapsack bounds its figures with the same functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import TYPE_CHECKING

from planner.core.graph import Graph
from planner.core.pipeline_actions import UnitPolicy
from planner.sim.ledger import MemoryLedger
from planner.sim.stage_costs import node_transient_bytes

if TYPE_CHECKING:
    from planner.sim.stage_policies import StageFacts


def forward_working_bytes(graph: Graph, facts: StageFacts, kept: Set[int]) -> int:
    """What the stage's F holds on top of its kept bytes (charged in full from F's start):
    the most that is alive at once (`_working_peak`) less the kept roots it makes. What a
    recompute or offload unit saves is on the device only while alive there (the runtime
    copies a saved tensor to the host as autograd saves it; a checkpoint saves none)."""
    return _working_peak(graph, [v for v, _ in facts.forward], kept, frozenset())


def backward_working_bytes(graph: Graph, facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                           kept: Set[int], unfreed: Set[int] | None = None,
                           cached: Mapping[str, Set[int]] | None = None,
                           moved: Mapping[str, Set[int]] | None = None) -> int:
    """What a backward node holds on top of the micro-batch's kept bytes: its node transient
    (stage_costs), plus in an offload unit the host copies it reloads (every root it reads,
    kept or not: the runtime reloads whatever the unit saved), in a recompute unit the rerun
    of the unit's forward and then the recomputed roots until their last backward reader;
    less the kept roots already freed (made here, not held, not in `unfreed` (None: the
    inputs of recompute units), their last backward reader run). `cached`: per recompute unit
    the nodes its selective checkpoint keeps: not rerun, and never counted freed. `moved`: per
    partially offloaded unit the roots it reloads (the others are kept)."""
    ledger = MemoryLedger.of(graph)
    root, size, preds = ledger.storage_root, ledger.storage_bytes, ledger.predecessors
    backward = {v for v, _ in facts.backward}
    made = {v for v, _ in facts.forward}
    units = {u.name: u for u in facts.units}
    cached = cached or {}
    cached_roots = {u: {root[v] for v in nodes} for u, nodes in cached.items()}
    # recompute unit -> its rerun's peak (new tensors, its saved ones kept to the rerun's end;
    # the rerun stops at the unit's last saving: UnitFacts.rerun)
    rerun = {u.name: _rerun_peak(graph, tuple(v for v, n in facts.forward if v in u.rerun
                                              and v not in cached.get(u.name, ())), u.saved)
             for u in facts.units if chosen[u.name] == "recompute"}
    if unfreed is None:  # a checkpoint holds its inputs: never counted freed
        unfreed = set().union(*(u.inputs for u in facts.units if chosen[u.name] == "recompute"))
    unfreed = set(unfreed).union(*cached_roots.values())
    last: dict[int, int] = {}  # forward root -> the position of its last backward reader
    for j, (w, _) in enumerate(facts.backward):
        for p in preds[w]:
            if p not in backward:
                last[root[p]] = j
    freed_at: dict[int, int] = {}  # position -> kept bytes freed after its node
    for r, j in last.items():
        if r in kept and r in made and r not in facts.held and r not in unfreed:
            freed_at[j] = freed_at.get(j, 0) + size[r]
    peak = freed = 0
    started: set[str] = set()
    transients = _backward_transients(graph, facts.backward)
    for j, (w, name) in enumerate(facts.backward):
        extra = 0
        policy = chosen[name] if name is not None else "keep"
        if policy == "offload":
            reloaded = {root[p] for p in preds[w] if p not in backward}
            if moved and name is not None and name in moved:
                reloaded &= moved[name]
            extra = sum(size[r] for r in reloaded)
        elif policy == "recompute" and name is not None:
            # remade by the rerun
            again = units[name].saved - units[name].inputs - cached_roots.get(name, set())
            alive = sum(size[r] for r in again if last.get(r, -1) >= j)
            extra = alive if name in started else max(alive, rerun[name])
            started.add(name)
        peak = max(peak, transients[j] + extra - freed)
        freed += freed_at.get(j, 0)
    return peak


def _backward_transients(graph: Graph,
                         backward: tuple[tuple[int, str | None], ...]) -> tuple[int, ...]:
    """What each of a stage's backward nodes holds while it runs (memoised on the graph: the
    knapsack asks for the same stage's many times): `node_transient_bytes`, plus
    - the gradients earlier nodes made that a later node reads (alive, though this one does
      not read them: a linear's input gradient while its weight gradient is computed);
    - (in `node_transient_bytes`) a weight gradient added into .grad: the runtime keeps .grad
      across micro-batches, so each one is a new tensor added in."""
    memo = graph.index.memo.setdefault("stage_backward_transients", {})
    got: tuple[int, ...] | None = memo.get(backward)
    if got is None:
        ledger = MemoryLedger.of(graph)
        root, size, preds = ledger.storage_root, ledger.storage_bytes, ledger.predecessors
        nodes = {v for v, _ in backward}
        last: dict[int, int] = {}  # gradient root -> the position of its last reader here
        for j, (w, _) in enumerate(backward):
            for p in preds[w]:
                if p in nodes:
                    last[root[p]] = j
        ends: dict[int, int] = {}  # position -> bytes of gradients freed after it
        out, alive = [], 0
        for j, (w, _) in enumerate(backward):
            read = {root[p] for p in preds[w] if p in nodes}
            alive_read = sum(size[r] for r in read if last.get(r, -1) >= j and r != root[w])
            out.append(node_transient_bytes(ledger, nodes, w) + max(0, alive - alive_read))
            r = root[w]
            if r == w and size[r] and last.get(r, -1) > j:  # read later: alive until then
                alive += size[r]
                ends[last[r]] = ends.get(last[r], 0) + size[r]
            alive -= ends.pop(j, 0)
        got = memo[backward] = tuple(out)
    return got


def _rerun_peak(graph: Graph, order: tuple[int, ...], saved: frozenset[int]) -> int:
    """A recomputed unit's rerun peak (`_working_peak` of its forward nodes `order` with its
    `saved` roots kept to the end), memoised on the graph."""
    memo = graph.index.memo.setdefault("unit_rerun_peaks", {})
    key = (order, saved)
    got: int | None = memo.get(key)
    if got is None:
        got = memo[key] = _working_peak(graph, order, frozenset(), saved)
    return got


def _working_peak(graph: Graph, order: Sequence[int], kept: Set[int],
                  to_end: Set[int]) -> int:
    """The most alive at once while the forward nodes `order` run, less the `kept` roots they
    make (those count from the start): every root made here, kept ones and those in `to_end`
    to the end, the others until their readers' outputs are last read (`x = f(g(x))` keeps
    the old x until f has run: a name is rebound when its statement ends), plus the running
    node's workspace."""
    ledger = MemoryLedger.of(graph)
    root, size, ws = ledger.storage_root, ledger.storage_bytes, ledger.workspace_bytes
    position = {v: i for i, v in enumerate(order)}
    last: dict[int, int] = {}  # root -> the position of its last reader in `order`
    for i, v in enumerate(order):
        for p in ledger.predecessors[v]:
            if p in position:
                last[root[p]] = i
    until = dict(last)  # root -> the position after which it is freed
    for i, v in enumerate(order):
        for p in ledger.predecessors[v]:
            if p in position:
                until[root[p]] = max(until[root[p]], last.get(root[v], i))
    live = peak = made_kept = 0
    dying: dict[int, int] = {}  # position -> bytes freed after it
    for i, v in enumerate(order):
        r = root[v]
        if r == v and size[r]:
            live += size[r]
            if r in kept:
                made_kept += size[r]
            end = len(order) if r in kept or r in to_end else until.get(r, i)
            dying[end] = dying.get(end, 0) + size[r]
        peak = max(peak, live + ws[v])
        live -= dying.pop(i, 0)
    return max(0, peak - made_kept)
