"""A lower bound on the compute of every plan within a budget, whatever its order: cuts.

Take any node c and the moment of its first computation. Every ancestor of c (through data and
ordering edges) has been computed by then, and every descendant of c runs after it. So each
value v computed before c that a descendant of c reads (the set A_c, "crossing" c) is either
resident at that moment or computed again afterwards: one computation more than every node
once, charged to v alone. Memory at that moment holds the fixed bytes, the held bytes of every
node computed so far (its ancestors and c), the storage of c's inputs and output (a storage
counted once for all its aliases, as the simulator does), c's workspace and the storage of
every resident crossing value. A value computed again after c needs its inputs then: each is
resident at c or computed again itself.

That is a covering problem per cut; its LP relaxation is a sound bound (values in [0, 1]), and
so is CP-SAT's proven bound on the integer problem (tried on the best cut while time is left:
resnet50 at 0.8 goes from +1.232 % to +1.330 %, the cost of auto's plan, which is then optimal):
  z[v]  v resident at c's first computation          (v an ancestor of c)
  r[v]  v computed again after c's first computation (v an ancestor of c)
  s[k]  storage k (a storage root) resident then
minimise Σ cost(v)·r[v] subject to the families commented in `_cut_model`. Plans from any
order, any number of recomputations, are covered: unlike the Checkmate LP/MILP bounds, which
hold only for schedules whose first computations follow the graph's order. When the bytes that
must be resident at some cut (inputs, output, workspace, fixed and held bytes, crossing values
that may not be recomputed) exceed the budget, no plan fits: a proof of infeasibility.

On training graphs the loss is the cut that matters (every activation saved for the backward
pass crosses it); on forward-only layered DAGs few values cross any node and the bound stays
near every node once. Cuts are chosen by pressure (the bytes crossing them over the budget),
among the loss nodes and the steps where store-all in the graph's order peaks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from planner.core.graph import Graph, reachable
from planner.sim.ledger import MemoryLedger
from planner.solvers.order import order_successors, schedule_order
from planner.solvers.remat.backends import solve_linear
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.linear import INF, LinearModel
from planner.solvers.remat.problem import problem_from_graph

MAX_CUTS = 4  # LPs solved (highest pressure first); evaluating a cut is O(n + e)
PEAK_STEPS = 24  # store-all's highest steps in the graph's order, as cut candidates
LP_TOLERANCE = 1e-6  # relative: the LP optimum is shaded by this before it is claimed
INTEGER_S = 5.0  # CP-SAT on the best cut's integer problem, at most (and within the deadline)


@dataclass(frozen=True)
class CutBound:
    """`extra_ms`: every plan within the budget computes at least this much beyond every node
    once (0.0: nothing proven). `infeasible`: no plan fits, `reason` says where."""

    extra_ms: float
    infeasible: bool
    cut_node: int | None  # node id of the cut that gives the bound (or the proof)
    cuts_solved: int
    wall_seconds: float
    reason: str = ""


@dataclass(frozen=True)
class _Cut:
    node: int
    ancestors: list[int]  # node ids, topological
    crossing: set[int]  # A_c: ancestors read by a descendant of c
    must_bytes: int  # resident whatever the plan: fixed, held, c's inputs/output/workspace
    forced: set[int]  # crossing values that may not be recomputed: resident at c (in must)
    pressure: int  # must + every crossing storage − budget (> 0: something must go)


def cut_lower_bound(graph: Graph, budget_bytes: int, *, deadline: float | None = None,
                    max_cuts: int = MAX_CUTS, backend: str = "glop",
                    candidates: Iterable[int] | None = None,
                    integer_s: float = INTEGER_S) -> CutBound:
    """The strongest bound among the cuts tried before `deadline` (see the module text).
    `candidates`: node ids to try as cuts (default: loss nodes and store-all's peak steps);
    `integer_s`: at most this long for CP-SAT on the integer problem of the best cut."""
    started = time.perf_counter()
    succ = order_successors(graph.index)
    pos = {v: i for i, v in enumerate(schedule_order(graph))}
    nodes = candidates if candidates is not None else _candidates(graph, budget_bytes, succ)
    cuts: list[_Cut] = []
    for c in dict.fromkeys(nodes):
        if deadline is not None and time.perf_counter() > deadline:
            break
        cut = _cut(graph, c, budget_bytes, succ, pos)
        if cut.must_bytes > budget_bytes:
            return CutBound(0.0, True, c, 0, time.perf_counter() - started,
                            f"at the first computation of {graph.describe(c)}, {cut.must_bytes} "
                            f"bytes must be resident (its inputs, output and workspace, the "
                            f"fixed and held bytes, values read later that may not be "
                            f"recomputed), over the budget of {budget_bytes}")
        if cut.pressure > 0:
            cuts.append(cut)
    cuts.sort(key=lambda k: -k.pressure)
    best, best_cut, solved = 0.0, None, 0
    for cut in cuts[:max_cuts]:
        left = _left(deadline)
        if left <= 0.05:
            break
        model = _cut_model(graph, cut, budget_bytes)
        raw = solve_linear(model, backend, time_limit_s=left, threads=1)
        solved += 1
        if raw.status == "optimal" and raw.bound is not None:
            extra = max(0.0, raw.bound) * (1 - LP_TOLERANCE)
            if extra > best:
                best, best_cut = extra, cut
    if best_cut is not None and integer_s > 0 and _left(deadline) > 0.1:
        # The integer problem on the best cut (rows are integral: bytes and 0/1 choices)
        model = _cut_model(graph, best_cut, budget_bytes)
        model.integer = [True] * model.num_vars
        raw = solve_linear(model, "cpsat", time_limit_s=min(integer_s, _left(deadline)),
                           threads=1)
        if raw.bound is not None and raw.status != "infeasible":
            best = max(best, raw.bound)
    return CutBound(best, False, None if best_cut is None else best_cut.node, solved,
                    time.perf_counter() - started)


def _left(deadline: float | None) -> float:
    return 60.0 if deadline is None else deadline - time.perf_counter()


def _candidates(graph: Graph, budget_bytes: int, succ: dict[int, list[int]]) -> list[int]:
    """Loss nodes (ordering edges to nodes they do not feed), then the steps where store-all
    in the graph's order peaks, highest first."""
    index = graph.index
    problem = problem_from_graph(graph, budget_bytes)
    losses = [v for v in problem.node_ids if len(succ[v]) > len(index.successors[v])]
    peaks = CheckpointPlan(problem).stage_peak  # store-all: every value kept
    steps = sorted(range(problem.n), key=lambda t: -peaks[t])[:PEAK_STEPS]
    return losses + [problem.node_ids[t] for t in steps]


def _cut(graph: Graph, c: int, budget_bytes: int, succ: dict[int, list[int]],
         pos: dict[int, int]) -> _Cut:
    index = graph.index
    ledger = MemoryLedger.of(graph)
    anc = reachable(c, index.order_predecessors) - {c}
    desc = reachable(c, succ) - {c}
    crossing = {v for v in anc if any(w in desc for w in ledger.successors[v])}
    inputs = set(ledger.predecessors[c])
    forced = {v for v in crossing - inputs if not ledger.recomputable[v]}
    # the ledger's bytes at c's first computation: fixed, held by c and its ancestors (all
    # computed by then), each storage of c, its inputs and forced values once, c's workspace
    must_values = inputs | forced | {c}
    must = ledger.resident_bytes(must_values, (*anc, c)) + ledger.workspace_bytes[c]
    root = ledger.storage_root
    must_roots = {root[v] for v in must_values}
    crossing_bytes = sum(ledger.storage_bytes[k] for k in {root[v] for v in crossing}
                         if k not in must_roots)
    return _Cut(c, sorted(anc, key=pos.__getitem__), crossing, must,
                forced, must + crossing_bytes - budget_bytes)


def _cut_model(graph: Graph, cut: _Cut, budget_bytes: int) -> LinearModel:
    ledger = MemoryLedger.of(graph)
    root, size, preds = ledger.storage_root, ledger.storage_bytes, ledger.predecessors
    m = LinearModel()
    inputs = set(preds[cut.node]) | cut.forced
    # z[v]: v resident at c's first computation; r[v]: v computed again after it
    z = {v: m.var(f"z{v}", 1.0 if v in inputs else 0.0, 1.0, False) for v in cut.ancestors}
    r = {v: m.var(f"r{v}", 0.0, 1.0 if ledger.recomputable[v] else 0.0, False)
         for v in cut.ancestors}
    # s[k]: storage root k resident (c's storage, its inputs' and forced ones: in must_bytes)
    must_roots = {root[v] for v in inputs | {cut.node}}
    s = {k: m.var(f"s{k}", 0.0, 1.0, False)
         for k in {root[v] for v in cut.ancestors} if k not in must_roots}
    # crossing values: resident at c, or computed again after it
    for v in cut.crossing:
        m.row([z[v], r[v]], [1.0, 1.0], 1.0, INF)
    # a value computed again after c needs each input then: resident at c or computed again
    for v in cut.ancestors:
        for u in preds[v]:
            m.row([z[u], r[u], r[v]], [1.0, 1.0, -1.0], 0.0, INF)
    # a resident value keeps its storage resident (the simulator's view rule: share_base)
    for v in cut.ancestors:
        if root[v] in s:
            m.row([s[root[v]], z[v]], [1.0, -1.0], 0.0, INF)
    # memory at c's first computation within the budget
    room = budget_bytes - cut.must_bytes
    if s:
        keys = list(s)
        m.row([s[k] for k in keys], [float(size[k]) for k in keys], -INF, float(room))
    for v in cut.ancestors:
        cost = ledger.compute_ms[v]
        if cost > 0:
            m.objective[r[v]] = cost
    return m
