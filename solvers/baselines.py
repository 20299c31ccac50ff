"""Baseline plans that need no solver: the reference points every solver is measured against.

All of them are built by one scheduler in Checkmate's frontier form: stage t computes the t-th
node of the topological order (its "target") for the first time, after recomputing whichever of
its ancestors are not resident. What stays resident between stages is decided by a checkpoint
set: checkpoints stay until their last consumer has run; the target of stage t is carried into
stage t+1; other values are freed as soon as the current stage no longer needs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable

from planner.graph import Graph, Phase
from planner.plan import Action, compute, free
from planner.simulator import SimulationResult, simulate
from solvers.order import schedule_order

BASELINE_METHODS = ("store-all", "recompute-all", "chen-sqrt", "chen-greedy")


def checkpoint_schedule(
    graph: Graph, checkpoints: Collection[int], *, retain_recomputed: bool = False
) -> list[Action]:
    """Actions for the frontier scheduler keeping `checkpoints` (see module doc).

    retain_recomputed: keep a recomputed value until its last consumer (Chen's segment
    recomputation: a segment is recomputed once for its backward pass) instead of freeing it
    at the end of the stage that recomputed it; and, as in Chen's forward pass, keep every
    value until its last forward consumer has run, so that a skip connection inside a segment
    is not recomputed during the forward pass and then retained into the backward pass.
    """
    index = graph.index
    order = schedule_order(graph)
    pos = {v: i for i, v in enumerate(order)}
    preds, succs = index.predecessors, index.successors
    never = -1
    last_use = {v: max((pos[w] for w in succs[v]), default=never) for v in order}
    last_forward_use = {
        v: max(
            (pos[w] for w in succs[v] if index.node(w).phase is not Phase.backward),
            default=never,
        )
        for v in order
    }
    keep = set(checkpoints)
    for v in order:  # a value that cannot be recomputed must survive every later need of it
        if not index.node(v).recomputable and succs[v]:
            keep.add(v)
            last_use[v] = len(order)
    retained: set[int] = set()
    resident: set[int] = set()
    actions: list[Action] = []

    for t, target in enumerate(order):

        def kept_past(u: int, stage: int = t, tgt: int = target) -> bool:
            if last_use[u] <= stage:
                return False
            if retain_recomputed and last_forward_use[u] > stage:
                return True
            return u in keep or u == tgt or u in retained

        # Nodes to compute in this stage: the target and its non-resident ancestors.
        needed: set[int] = set()
        stack = [target]
        while stack:
            v = stack.pop()
            if v in needed:
                continue
            needed.add(v)
            stack.extend(u for u in preds[v] if u not in resident and u not in needed)
        in_stage = sorted(needed, key=pos.__getitem__)
        uses_left: dict[int, int] = {}
        for v in in_stage:
            for u in preds[v]:
                uses_left[u] = uses_left.get(u, 0) + 1
        for v in in_stage:
            actions.append(compute(v))
            resident.add(v)
            if v != target and retain_recomputed:
                retained.add(v)
            for u in preds[v]:
                uses_left[u] -= 1
                if uses_left[u] == 0 and not kept_past(u):
                    actions.append(free(u))
                    resident.discard(u)
            if uses_left.get(v, 0) == 0 and not kept_past(v):
                actions.append(free(v))
                resident.discard(v)
        for u in sorted(resident, key=pos.__getitem__):
            if not kept_past(u):
                actions.append(free(u))
                resident.discard(u)
        retained.intersection_update(resident)
    return actions


def store_all(graph: Graph) -> list[Action]:
    """Topological order, every output freed right after its last consumer."""
    return checkpoint_schedule(graph, schedule_order(graph))


def recompute_all(graph: Graph) -> list[Action]:
    """Keep only what the backward pass cannot recompute: forward values are recomputed from
    scratch for every consumer after the one that follows them (gradients are kept)."""
    kept = [n.id for n in graph.nodes if n.phase is Phase.backward or not n.recomputable]
    return checkpoint_schedule(graph, kept)


def forward_nodes(graph: Graph) -> list[int]:
    """Forward (and loss) nodes in topological order: the part checkpointing applies to."""
    index = graph.index
    return [v for v in schedule_order(graph) if index.node(v).phase is not Phase.backward]


def joint_positions(graph: Graph, forward: list[int]) -> list[int]:
    """Positions in `forward` of the chain joints: nodes every later forward node depends on
    only through them (never the last forward node)."""
    pos = {v: i for i, v in enumerate(forward)}
    succs = graph.index.successors
    cuts: list[int] = []
    reach = -1  # furthest forward position an edge from before the current node reaches
    for i, v in enumerate(forward):
        if reach <= i and i < len(forward) - 1:
            cuts.append(i)
        for w in succs[v]:
            if w in pos:
                reach = max(reach, pos[w])
    return cuts


def cut_points(graph: Graph) -> list[int]:
    """Forward nodes at the chain joints, where a DAG linearises into a chain of segments
    (residual and skip connections stay inside segments). Falls back to every forward node
    when the graph has no joints."""
    fwd = forward_nodes(graph)
    cuts = [fwd[i] for i in joint_positions(graph, fwd)]
    return cuts if len(cuts) >= 2 else fwd


def _backward_kept(graph: Graph) -> list[int]:
    return [n.id for n in graph.nodes if n.phase is Phase.backward]


def chen_sqrt(graph: Graph) -> list[Action]:
    """Chen et al. 2016: a checkpoint every sqrt(n) forward nodes, at chain joints."""
    cuts = cut_points(graph)
    n_forward = len(forward_nodes(graph))
    stride = max(1, round(math.sqrt(n_forward) * len(cuts) / max(1, n_forward)))
    chosen = cuts[stride - 1 :: stride]
    return checkpoint_schedule(graph, chosen + _backward_kept(graph), retain_recomputed=True)


def chen_greedy_candidates(graph: Graph) -> Iterable[list[Action]]:
    """Chen et al.'s greedy segmentation for a grid of per-segment memory thresholds."""
    cuts = cut_points(graph)
    fwd = forward_nodes(graph)
    index = graph.index
    sizes = {v: index.storage_bytes[v] for v in fwd}
    total = sum(sizes.values())
    smallest = max(1, min((s for s in sizes.values() if s > 0), default=1))
    cut_set = set(cuts)
    thresholds = sorted(
        {int(smallest * (total / smallest) ** (k / 24)) for k in range(25)}
    )
    seen: set[tuple[int, ...]] = set()
    for threshold in thresholds:
        chosen: list[int] = []
        acc = 0
        for v in fwd:
            acc += sizes[v]
            if v in cut_set and acc > threshold:
                chosen.append(v)
                acc = 0
        key = tuple(chosen)
        if key in seen:
            continue
        seen.add(key)
        yield checkpoint_schedule(graph, chosen + _backward_kept(graph), retain_recomputed=True)


def chen_greedy(graph: Graph, budget_bytes: int | None = None) -> list[Action]:
    """The cheapest greedy segmentation within the budget, else the one with the least peak."""
    best: tuple[tuple[int, float, int], list[Action]] | None = None
    for actions in chen_greedy_candidates(graph):
        sim = simulate(graph, actions)
        fits = budget_bytes is None or sim.peak_bytes <= budget_bytes
        key = (0, sim.compute_cost, sim.peak_bytes) if fits else (1, sim.peak_bytes, 0)
        if best is None or key < best[0]:
            best = (key, actions)
    assert best is not None
    return best[1]


BaselineFn = Callable[[Graph, int | None], list[Action]]

BASELINES: dict[str, BaselineFn] = {
    "store-all": lambda g, _b: store_all(g),
    "recompute-all": lambda g, _b: recompute_all(g),
    "chen-sqrt": lambda g, _b: chen_sqrt(g),
    "chen-greedy": chen_greedy,
}


def store_all_peak_bytes(graph: Graph) -> int:
    return simulate(graph, store_all(graph)).peak_bytes


def run_baseline(graph: Graph, method: str, budget_bytes: int | None) -> SimulationResult:
    return simulate(graph, BASELINES[method](graph, budget_bytes))
