"""Baseline plans that need no solver: the reference points every solver is measured against.

All of them are built by one scheduler in Checkmate's frontier form: stage t computes the t-th
node of the topological order (its "target") for the first time, after recomputing whichever of
its ancestors are not resident. What stays resident between stages is decided by a checkpoint
set: checkpoints stay until their last consumer has run; the target of stage t is carried into
stage t+1; other values are freed as soon as the current stage no longer needs them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator

from planner.core.graph import Graph, Phase, paused_gc
from planner.core.plan import Action, compute, free
from planner.sim.simulator import simulate
from planner.solvers.order import schedule_order


class ScheduleAbandoned(Exception):
    """A schedule grew past its `max_actions` or ran past its `deadline` (time.perf_counter)."""


# Recompute-all recomputes every forward value for every consumer after the next: its plan grows
# with the square of the graph (8 million actions at 5,001 nodes). Callers that only want a
# reference point (`bounded_baselines`) skip it beyond this many actions.
QUADRATIC_MAX_ACTIONS = 2_000_000
_CHECK_EVERY = 16  # stages between deadline checks (a recompute-all stage can be long)


def checkpoint_schedule(
    graph: Graph,
    checkpoints: Collection[int],
    *,
    retain_recomputed: bool = False,
    max_actions: int | None = None,
    deadline: float | None = None,
) -> list[Action]:
    """Actions for the frontier scheduler keeping `checkpoints` (see module doc).

    retain_recomputed: keep a recomputed value until its last consumer (Chen's segment
    recomputation: a segment is recomputed once for its backward pass) instead of freeing it
    at the end of the stage that recomputed it; and, as in Chen's forward pass, keep every
    value until its last forward consumer has run, so that a skip connection inside a segment
    is not recomputed during the forward pass and then retained into the backward pass.

    Time: linear in the graph plus the plan's length. ScheduleAbandoned once the plan has more
    than `max_actions` actions or `deadline` (a time.perf_counter() value) has passed.
    """
    with paused_gc():
        return _checkpoint_schedule(graph, checkpoints, retain_recomputed, max_actions, deadline)


def _checkpoint_schedule(
    graph: Graph,
    checkpoints: Collection[int],
    retain_recomputed: bool,
    max_actions: int | None,
    deadline: float | None,
) -> list[Action]:
    order = schedule_order(graph)
    pos = {v: i for i, v in enumerate(order)}
    preds = graph.index.predecessors
    never = -1
    last_use, last_forward_use, keep, ending = _last_uses(graph, order, pos, checkpoints,
                                                          retain_recomputed)
    retained: set[int] = set()
    resident: set[int] = set()
    actions: list[Action] = []
    computes: dict[int, Action] = {}  # one (immutable) action object per node and op
    frees: dict[int, Action] = {}

    def freed(u: int) -> None:
        a = frees.get(u)
        if a is None:
            a = frees[u] = free(u)
        actions.append(a)
        resident.discard(u)
        retained.discard(u)

    previous_target = never
    for t, target in enumerate(order):
        if t % _CHECK_EVERY == 0 and deadline is not None and time.perf_counter() > deadline:
            raise ScheduleAbandoned(f"stopped at stage {t} of {len(order)}: out of time")
        if max_actions is not None and len(actions) > max_actions:
            raise ScheduleAbandoned(f"over {max_actions} actions at stage {t} of {len(order)}")

        def kept_past(u: int, stage: int = t, tgt: int = target) -> bool:
            if last_use[u] <= stage:
                return False
            if retain_recomputed and last_forward_use[u] > stage:
                return True
            return u in keep or u == tgt or u in retained

        in_stage = _needed(target, preds, resident, pos)
        uses_left: dict[int, int] = {}
        for v in in_stage:
            for u in preds[v]:
                uses_left[u] = uses_left.get(u, 0) + 1
        for v in in_stage:
            c = computes.get(v)
            if c is None:
                c = computes[v] = compute(v)
            actions.append(c)
            resident.add(v)
            if v != target and retain_recomputed:
                retained.add(v)
            for u in preds[v]:
                uses_left[u] -= 1
                if uses_left[u] == 0 and not kept_past(u):
                    freed(u)
            if uses_left.get(v, 0) == 0 and not kept_past(v):
                freed(v)
        # Everything resident before this stage was kept past the previous one; only values
        # computed now, the previous target and values whose (forward) last use is now can
        # have stopped being kept: checking those alone keeps this linear, same actions.
        candidates = {*in_stage, previous_target, *ending[t]}
        for u in sorted(candidates & resident, key=pos.__getitem__):
            if not kept_past(u):
                freed(u)
        previous_target = target
    return actions


def _last_uses(graph: Graph, order: list[int], pos: dict[int, int],
               checkpoints: Collection[int], retain_recomputed: bool) -> tuple[
        dict[int, int], dict[int, int], set[int], list[list[int]]]:
    """Per value its last use and last forward use (stages; -1: none), the values kept (the
    checkpoints and every value that cannot be recomputed, then kept to the end), and per
    stage the values whose (forward) last use it is, which may stop being kept there."""
    index = graph.index
    succs, node = index.successors, index.node
    never = -1
    last_use = {v: max((pos[w] for w in succs[v]), default=never) for v in order}
    last_forward_use = {
        v: max(
            (pos[w] for w in succs[v] if node(w).phase is not Phase.backward),
            default=never,
        )
        for v in order
    }
    keep = set(checkpoints)
    for v in order:  # a value that cannot be recomputed must survive every later need of it
        if not node(v).recomputable and succs[v]:
            keep.add(v)
            last_use[v] = len(order)
    ending: list[list[int]] = [[] for _ in order]
    for v in order:
        for stage in {last_use[v], last_forward_use[v] if retain_recomputed else never}:
            if 0 <= stage < len(order):
                ending[stage].append(v)
    return last_use, last_forward_use, keep, ending


def _needed(target: int, preds: dict[int, list[int]], resident: set[int],
            pos: dict[int, int]) -> list[int]:
    """Nodes to compute in a stage, in order: the target and its non-resident ancestors."""
    needed: set[int] = set()
    stack = [target]
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        stack.extend(u for u in preds[v] if u not in resident and u not in needed)
    return sorted(needed, key=pos.__getitem__)


def store_all(graph: Graph, *, deadline: float | None = None) -> list[Action]:
    """Topological order, every output freed right after its last consumer.

    Exactly `checkpoint_schedule(graph, every node)`, written out: every input is resident, so
    each stage computes its target alone, then frees the inputs it was the last consumer of (in
    input order) and the target itself when nothing reads it; a value that cannot be recomputed
    stays to the end. A few times faster: the reference of every budget."""
    with paused_gc():
        index = graph.index
        order = schedule_order(graph)
        pos = {v: i for i, v in enumerate(order)}
        preds, succs, node = index.predecessors, index.successors, index.node
        end = len(order)
        last_use = {v: max((pos[w] for w in succs[v]), default=-1) for v in order}
        for v in order:
            if succs[v] and not node(v).recomputable:
                last_use[v] = end
        actions: list[Action] = []
        for t, v in enumerate(order):
            if t % _CHECK_EVERY == 0 and deadline is not None and time.perf_counter() > deadline:
                raise ScheduleAbandoned(f"stopped at stage {t} of {end}: out of time")
            actions.append(compute(v))
            actions.extend(free(u) for u in preds[v] if last_use[u] == t)
            if last_use[v] < 0:
                actions.append(free(v))
        return actions


def recompute_all(
    graph: Graph, *, max_actions: int | None = None, deadline: float | None = None
) -> list[Action]:
    """Keep only what the backward pass cannot recompute: forward values are recomputed from
    scratch for every consumer after the one that follows them (gradients are kept). The plan
    grows with the square of the graph: `max_actions` and `deadline` as in
    `checkpoint_schedule`."""
    kept = [n.id for n in graph.nodes if n.phase is Phase.backward or not n.recomputable]
    return checkpoint_schedule(graph, kept, max_actions=max_actions, deadline=deadline)


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


def chen_sqrt(graph: Graph, *, deadline: float | None = None) -> list[Action]:
    """Chen et al. 2016: a checkpoint every sqrt(n) forward nodes, at chain joints."""
    cuts = cut_points(graph)
    n_forward = len(forward_nodes(graph))
    stride = max(1, round(math.sqrt(n_forward) * len(cuts) / max(1, n_forward)))
    chosen = cuts[stride - 1 :: stride]
    return checkpoint_schedule(
        graph, chosen + _backward_kept(graph), retain_recomputed=True, deadline=deadline
    )


def chen_greedy_candidates(
    graph: Graph, *, deadline: float | None = None
) -> Iterable[list[Action]]:
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
        yield checkpoint_schedule(
            graph, chosen + _backward_kept(graph), retain_recomputed=True, deadline=deadline
        )


def chen_greedy(
    graph: Graph, budget_bytes: int | None = None, *, deadline: float | None = None
) -> list[Action]:
    """The cheapest greedy segmentation within the budget, else the one with the least peak.
    With a `deadline`, the best of the segmentations tried by then (ScheduleAbandoned if none
    was)."""
    best: tuple[tuple[int, float, int], list[Action]] | None = None
    # Every node its own segment (nothing recomputed) first: where the budget allows it, that is
    # the cheapest segmentation, which the threshold grid (cut points only) never reaches.
    candidates = itertools.chain([store_all(graph, deadline=deadline)],
                                 chen_greedy_candidates(graph, deadline=deadline))
    while True:
        try:
            actions = next(candidates)
        except StopIteration:
            break
        except ScheduleAbandoned:
            if best is None:
                raise
            break
        sim = simulate(graph, actions)
        fits = budget_bytes is None or sim.peak_bytes <= budget_bytes
        key = (0, sim.compute_cost, sim.peak_bytes) if fits else (1, sim.peak_bytes, 0)
        if best is None or key < best[0]:
            best = (key, actions)
        if deadline is not None and time.perf_counter() > deadline:
            break
    assert best is not None
    return best[1]


BaselineFn = Callable[[Graph, int | None], list[Action]]

BASELINES: dict[str, BaselineFn] = {
    "store-all": lambda g, _b: store_all(g),
    "recompute-all": lambda g, _b: recompute_all(g),
    "chen-sqrt": lambda g, _b: chen_sqrt(g),
    "chen-greedy": chen_greedy,
}


def bounded_baselines(
    graph: Graph,
    budget_bytes: int | None,
    *,
    max_actions: int = QUADRATIC_MAX_ACTIONS,
    deadline: float | None = None,
) -> Iterator[tuple[str, list[Action]]]:
    """(name, plan) of every baseline as BASELINES makes it, in BASELINES' order, skipping a
    recompute-all plan longer than `max_actions` and whatever is unfinished at `deadline`: the
    reference points that stay affordable on large graphs (the others are linear)."""
    makers: dict[str, Callable[[], list[Action]]] = {
        "store-all": lambda: store_all(graph, deadline=deadline),
        "recompute-all": lambda: recompute_all(graph, max_actions=max_actions, deadline=deadline),
        "chen-sqrt": lambda: chen_sqrt(graph, deadline=deadline),
        "chen-greedy": lambda: chen_greedy(graph, budget_bytes, deadline=deadline),
    }
    for name, fn in BASELINES.items():
        try:
            yield name, makers[name]() if name in makers else fn(graph, budget_bytes)
        except ScheduleAbandoned:
            continue


def store_all_peak_bytes(graph: Graph) -> int:
    """The store-all plan's peak (computed once per graph: it is every budget's reference)."""
    memo = graph.index.memo
    if "store_all_peak_bytes" not in memo:
        memo["store_all_peak_bytes"] = simulate(graph, store_all(graph)).peak_bytes
    peak: int = memo["store_all_peak_bytes"]
    return peak
