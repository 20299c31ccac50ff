"""A graph as an ordered chain of units (layers), with what any contiguous range of them costs.

A unit is a module: a node's module_path cut after its first numeric component ('h.3.attn.qkv'
-> 'h.3', the 4th block of a ModuleList), else its first component ('tok', 'head'); an op-level
graph grouped by module and a module-level trace both give one unit per layer. Nodes outside
every module (a loss, an `x + pos`) follow their inputs exactly as the simulator places them
(planner.sim.stage_costs: a forward node goes with its latest input, a backward node with its
earliest gradient input), so the costs of a range of units equal `stage_costs` of the stage
that names those modules (tests/test_pipeline_units.py checks it). Units whose data would flow
backwards across a cut (a module used twice, tied weights) are merged.

`UnitChain.range_costs(i, j, stage_count)` gives a stage [i, j)'s forward/backward/weight-grad
times, model state (its parameters plus an even share of the rest), saved and held bytes per
micro-batch, received input and receive-buffer bytes, the largest transient, and the boundary
bytes sent at each cut (planner.sim.stage_costs.boundary_sizes: the same rule).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from functools import cached_property

from planner.core.errors import InputError
from planner.core.graph import Graph, Phase
from planner.sim.backward_release import BackwardTransients, backward_transients
from planner.sim.ledger import MemoryLedger
from planner.sim.rank_memory import weight_rerun_residue_bytes
from planner.sim.stage_costs import (
    Boundary,
    Flow,
    StageCosts,
    backward_weight_ms,
    boundary_sizes,
    checkpoint_state_bytes,
    gradient_nodes,
    is_module_level,
    loss_roots,
    node_transient_bytes,
    place_the_rest,
    stage_sums,
)
from planner.sim.stage_state import even_share_bytes, parameter_stages, unplaced_fixed_bytes


@dataclass(frozen=True)
class Unit:
    name: str  # the module path that names it in a partition
    forward_ms: float
    backward_ms: float
    parameter_bytes: int  # weights alone (what parameter-balanced splits count)
    model_state_bytes: int  # weights, gradients, optimizer state on one device
    node_count: int


@dataclass(frozen=True)
class RangeCosts(StageCosts):
    """Stage [first, end) of a chain: planner.sim.stage_costs.StageCosts of the stage naming
    those units' modules (model state: its parameters plus its share of the rest; boundary
    sends: the cuts at `end` and at `first`), read in O(1) from per-unit tables."""

    first: int
    end: int


def unit_key(module_path: str) -> str:
    """'h.3.attn.qkv' -> 'h.3'; 'head' -> 'head'; '' -> '' (outside every module)."""
    if not module_path:
        return ""
    parts = module_path.split(".")
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: k + 1])
    return parts[0]


class UnitChain:
    """The units of `graph` in forward order and their range costs."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        index = graph.index
        order = index.topological_order
        keys = _resolve_ancestors({unit_key(n.module_path) for n in graph.nodes} - {""})
        if not keys:
            raise InputError(
                "the graph names no modules (module_path is empty on every node): a pipeline "
                "partition splits by module; trace the model at module or op level"
            )
        first_seen: dict[str, int] = {}
        for pos, v in enumerate(order):
            n = index.node(v)
            k = keys.get(unit_key(n.module_path), "")
            if k and n.phase is not Phase.backward:
                first_seen.setdefault(k, pos)
        for k in set(keys.values()) - set(first_seen):  # backward-only modules: last
            first_seen[k] = len(order) + len(first_seen)
        names = sorted(set(keys.values()), key=lambda k: first_seen[k])
        groups = [[k] for k in names]
        while True:
            unit_of_key = {k: u for u, g in enumerate(groups) for k in g}
            node_unit = self._place(keys, unit_of_key, len(groups))
            bad = self._backward_flow(node_unit)
            if bad is None:
                break
            lo, hi = bad
            groups = groups[:lo] + [list(itertools.chain(*groups[lo : hi + 1]))] + groups[hi + 1 :]
        self.groups: list[list[str]] = groups
        self.node_unit = node_unit
        self._tables()

    # -- which node is in which unit -----------------------------------------------------------
    def _place(
        self, keys: dict[str, str], unit_of_key: dict[str, int], count: int
    ) -> dict[int, int]:
        out: dict[int, int] = {}
        for n in self.graph.nodes:
            k = keys.get(unit_key(n.module_path), "")
            if k:
                out[n.id] = unit_of_key[k]
        place_the_rest(self.graph, out, count - 1)  # as the simulator places them, per unit
        return out

    def _backward_flow(self, unit: dict[int, int]) -> tuple[int, int] | None:
        """Units (lo, hi) to merge: forward data from hi to lo, or gradients from lo to hi."""
        index = self.graph.index
        worst: tuple[int, int] | None = None
        for e in self.graph.edges:
            a, b = unit[e.source], unit[e.target]
            fa = index.node(e.source).phase != Phase.backward
            fb = index.node(e.target).phase != Phase.backward
            if fa == fb and a != b and ((fa and b < a) or (not fa and b > a)):
                span = (min(a, b), max(a, b))
                if worst is None or span[1] - span[0] > worst[1] - worst[0]:
                    worst = span
        return worst

    # -- per-unit tables -------------------------------------------------------------------------
    def _tables(self) -> None:
        """Per unit what planner.sim.stage_costs sums per stage (`stage_sums`: the same node
        rule over the ledger's facts), kept apart so that any range's costs come from prefix
        sums and an incremental saved-bytes table: the DPs query O(L^2) ranges, the simulator
        one partition."""
        count = len(self.groups)
        sums = stage_sums(self.graph, self.node_unit, count)
        # storage root -> units whose backward reads it (forward storages)
        self.read_back: list[set[int]] = [set() for _ in range(count)]
        cut_f: list[set[int]] = [set() for _ in range(count + 1)]
        cut_b: list[set[int]] = [set() for _ in range(count + 1)]
        for flow, s, t, root, _, _ in sums.flows:
            if flow is Flow.saved:
                self.read_back[t].add(root)
            elif flow is Flow.forward:
                for c in range(s + 1, t + 1):
                    cut_f[c].add(root)
            else:
                for c in range(t + 1, s + 1):
                    cut_b[c].add(root)
        ledger = MemoryLedger.of(self.graph)
        self.forward_ms = fwd = sums.forward_ms
        self.backward_ms = bwd = sums.backward_ms
        self.weight_ms = sums.weight_ms
        self.has_weight = sums.has_weight
        self.transient = sums.transient_bytes
        self.forward_transient = sums.forward_transient_bytes
        backward = {n.id for n in self.graph.nodes if n.phase == Phase.backward}
        # unit -> its backward nodes as (execution position, node), in execution order
        self.backward_nodes: list[list[tuple[int, int]]] = [[] for _ in range(count)]
        for pos, v in enumerate(self.graph.index.topological_order):
            if v in backward:
                self.backward_nodes[self.node_unit[v]].append((pos, v))
        # backward node -> its transient without the gradients it reads, and those gradients
        # (root, its unit, bytes): one made at or after a range's end is received
        self.node_transient = {v: node_transient_bytes(ledger, backward, v, lambda r: True)
                               for v in backward}
        roots = ledger.storage_root
        self.gradient_reads = {
            v: [(r, self.node_unit[r], ledger.storage_bytes[r]) for r in
                {roots[u] for u in ledger.predecessors[v] if u in backward} - {roots[v]}]
            for v in backward}
        # gradient root -> the units of its readers that pass it on (stage_costs'
        # buffered_gradients: received, it is in a buffer only where none of these reads it)
        self.passed_on: dict[int, list[int]] = {}
        weight = gradient_nodes(self.graph)
        for v in backward:
            if v in weight or not any(w in backward for w in ledger.successors[v]):
                continue
            for r, _, _ in self.gradient_reads[v]:
                self.passed_on.setdefault(r, []).append(self.node_unit[v])
        self._released_memo: dict[tuple[int, int], BackwardTransients] = {}
        self.size = ledger.storage_bytes  # of storage roots: the saved-bytes table's sizes
        self.cut_forward = cut_f  # cut c: forward roots made before unit c, read from c on
        self.cut_forward_bytes = [ledger.storages_bytes(c) for c in cut_f]
        self.cut_backward_bytes = [ledger.storages_bytes(c) for c in cut_b]
        self.module_level = is_module_level(self.graph)
        self.loss_roots = loss_roots(self.graph)
        saved_reads = [(r, self.node_unit[r], t) for flow, _, t, r, _, _ in sums.flows
                       if flow is Flow.saved]
        # (first, end) -> bytes: gradients I keeps for W; the range's saved roots; those of
        # them an input-gradient node reads (stage_costs' zero-bubble sizes)
        self.pending_bytes = self._inside_bytes(sums.weight_reads)
        self.rerun_bytes = self._inside_bytes(saved_reads)
        self.input_read_bytes = self._inside_bytes(sums.input_reads)
        self.weight_groups = sums.weight_groups
        state, params, rest = self._model_state(count)
        self.state_bytes = state
        self.rest_bytes = rest
        self.units = [
            Unit(".".join(self.groups[u][:1]) if len(self.groups[u]) == 1 else "+".join(
                self.groups[u]), fwd[u], bwd[u], params[u], state[u], sums.node_count[u])
            for u in range(count)
        ]

    def _inside_bytes(self, reads: list[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
        """(first, end) -> bytes of the roots made in the range and read in it, for `reads`
        (root, unit making it, unit reading it), every range: a root enters a range starting
        at `first` at the first end that holds both its maker and a reader."""
        readers: dict[int, set[int]] = {}
        for r, _, t in reads:
            readers.setdefault(r, set()).add(t)
        unit, size, count = self.node_unit, self.size, self.length
        out: dict[tuple[int, int], int] = {}
        for i in range(count):
            enters = [0] * count  # unit j -> bytes entering the range [i, j + 1)
            for r, ts in readers.items():
                later = [t for t in ts if t >= i]
                if unit[r] >= i and later:
                    enters[max(unit[r], min(later))] += size[r]
            total = 0
            for j in range(i, count):
                total += enters[j]
                out[(i, j + 1)] = total
        return out

    def _model_state(self, count: int) -> tuple[list[int], list[int], int]:
        """Per unit its placed model state and weights (the simulator's placement, per unit),
        and the fixed bytes no unit owns."""
        state = [0] * count
        params = [0] * count
        for p, b, u in parameter_stages(self.graph, self.node_unit):
            if u is not None:
                state[u] += b.total_bytes
                params[u] += p.bytes
        return state, params, unplaced_fixed_bytes(self.graph, sum(state))

    # -- queries ---------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return len(self.groups)

    def modules(self, first: int, end: int) -> list[str]:
        return [k for u in range(first, end) for k in self.groups[u]]

    def share_bytes(self, stage_index: int, stage_count: int) -> int:
        """Stage `stage_index`'s even share of what no unit owns (inputs, buffers)."""
        return even_share_bytes(self.rest_bytes, stage_index, stage_count)

    @cached_property
    def _prefix(self) -> tuple[list[float], list[float], list[float], list[int]]:
        f = [0.0]
        b = [0.0]
        w = [0.0]
        h = [0]
        for u in range(self.length):
            f.append(f[-1] + self.forward_ms[u])
            b.append(b[-1] + self.backward_ms[u])
            w.append(w[-1] + self.weight_ms[u])
            h.append(h[-1] + int(self.has_weight[u]))
        return f, b, w, h

    @cached_property
    def _kept(self) -> dict[tuple[int, int], tuple[int, int, int]]:
        """(first, end) -> bytes of (what the range keeps from F: the forward roots made in it
        that its backward reads, sends on, or its loss; its sent roots; its loss roots not
        sent), every range: stage_costs' rule, the saved roots grown one unit at a time (a
        received root sits in torch's receive buffer)."""
        out: dict[tuple[int, int], tuple[int, int, int]] = {}
        unit, size = self.node_unit, self.size
        for i in range(self.length):
            saved: set[int] = set()
            saved_b = 0
            later: dict[int, set[int]] = {}  # read here, made by a unit not yet in the range
            for j in range(i, self.length):
                fresh = later.pop(j, set())
                for r in self.read_back[j]:
                    k = unit[r]
                    if k > j:
                        later.setdefault(k, set()).add(r)
                    elif k >= i:
                        fresh.add(r)
                for r in fresh - saved:
                    saved.add(r)
                    saved_b += size[r]
                sent = {r for r in self.cut_forward[j + 1] if unit[r] >= i}
                loss = {r for r in self.loss_roots if i <= unit[r] <= j} - sent
                extra = sum(size[r] for r in (sent | loss) - saved)
                out[(i, j + 1)] = (saved_b + extra, sum(size[r] for r in sent),
                                   sum(size[r] for r in loss))
        return out

    def range_costs(self, first: int, end: int, stage_index: int, stage_count: int) -> RangeCosts:
        f, b, w, h = self._prefix
        bwd = b[end] - b[first]
        weight = backward_weight_ms(bwd, w[end] - w[first], h[end] > h[first])
        kept, sent_b, loss_b = self._kept[(first, end)]
        boundary = Boundary(
            kept=kept, sent=sent_b, loss=loss_b,
            forward_in=self.cut_forward_bytes[first], forward_out=self.cut_forward_bytes[end],
            gradient_in=self.cut_backward_bytes[first], gradient_out=self.cut_backward_bytes[end],
        )
        saved, held, received, buffers, sent = boundary_sizes(boundary, self.module_level)
        unreduced = max(self.transient[first:end])
        released = self._released(first, end)
        forward = max(self.forward_transient[first:end])
        transient = max(forward, released.joint_bytes)
        unreduced = max(unreduced, released.unreduced_bytes)
        groups = len(set().union(*self.weight_groups[first:end]))
        read = self.input_read_bytes[(first, end)]
        first_stage = stage_index == 0
        return RangeCosts(
            first=first,
            end=end,
            forward_ms=f[end] - f[first],
            backward_ms=bwd,
            backward_input_ms=bwd - weight,
            backward_weight_ms=weight,
            saved_bytes=saved,
            input_bytes=received,
            transient_bytes=transient,
            model_state_bytes=sum(self.state_bytes[first:end])
            + self.share_bytes(stage_index, stage_count),
            send_forward_bytes=sent,
            send_backward_bytes=self.cut_backward_bytes[first],
            held_bytes=held,
            buffer_bytes=buffers,
            weight_pending_bytes=0 if first_stage else self.pending_bytes[(first, end)],
            weight_transient_bytes=transient if first_stage else unreduced,
            weight_rerun_bytes=unreduced + (0 if first_stage else weight_rerun_residue_bytes(
                groups, read, self.rerun_bytes[(first, end)] - read)),
            first_stage=first_stage,
            input_transient_bytes=transient if first_stage else unreduced,
            recompute_transient_bytes=unreduced,
            checkpoint_bytes=checkpoint_state_bytes(self.graph),
        )

    def _released(self, first: int, end: int) -> BackwardTransients:
        """The range's backward transients less what its backward frees as it runs
        (planner.sim.backward_release, as stage_costs applies it to a stage), memoised."""
        got = self._released_memo.get((first, end))
        if got is None:
            unit = self.node_unit
            saved = {r for t in range(first, end) for r in self.read_back[t]
                     if first <= unit[r] < end}
            sent = {r for r in self.cut_forward[end] if unit[r] >= first}
            loss = {r for r in self.loss_roots if first <= unit[r] < end}
            order = [v for _, v in heapq.merge(*self.backward_nodes[first:end])]

            def transient(v: int) -> int:  # stage_costs.buffered_gradients
                return self.node_transient[v] + sum(
                    b for r, u, b in self.gradient_reads[v]
                    if u < end or any(first <= t < end for t in self.passed_on.get(r, ())))

            got = backward_transients(MemoryLedger.of(self.graph), order, saved - sent - loss,
                                      transient)
            self._released_memo[(first, end)] = got
        return got


def _resolve_ancestors(keys: set[str]) -> dict[str, str]:
    """Each key -> its outermost ancestor among the keys (a unit 'h' swallows 'h.0')."""
    out = {}
    for k in keys:
        best = k
        path = k.rpartition(".")[0]
        while path:
            if path in keys:
                best = path
            path = path.rpartition(".")[0]
        out[k] = best
    return out
