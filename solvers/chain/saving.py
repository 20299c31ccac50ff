"""Saving options of a linearised chain: F_all keeping less, the backward recomputing the rest.

Rotor's F_all keeps every value of a segment that its backward reads (ā^i). On op-level graphs
a segment is a block or half a block, and some of those values are cheap to compute again for
their bytes (normalisations, activations, reshapes that copy). An option of level q drops, in
every segment, the cheapest values per byte (counting the ancestors in the segment their
recomputation needs) until q of the droppable bytes are gone; the
backward then computes each dropped value again just before its first reader (with whatever
it needs that is not kept, in forward order) and frees it after its last. Each option is a
whole `ChainLayout` and its exact `Chain` (`linearize.chain_of_layout` profiles every
operation's actions, as for the plain chain), so the DP (`rotor.solve_rotor(options=...)`)
judges every stage's options exactly and picks one per stage.

A value is droppable when it has bytes of its own (not a view, no kept view of it), is not a
joint and is recomputable, as is everything its recomputation needs; a segment whose dropped
set cannot be recomputed keeps its plain form at that level. On the traced zoo models
(docs/remat_scale.md) the chain DP's overhead drops by half or more at 0.8 of store-all (gpt12
+17.2 to +7.6 %, llama32 +9.9 to +4.8 %, resnet50 +16.2 to +3.6 %) and by 13-65 % at 0.6.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from planner.core.graph import Graph
from planner.solvers.chain.layout import ChainLayout
from planner.solvers.chain.linearize import chain_of_layout
from planner.solvers.chain.model import Chain

SAVING_LEVELS = tuple(k / 10 for k in range(1, 11))  # shares of droppable bytes dropped


@dataclass(frozen=True)
class SavingOption:
    level: float  # share of each segment's droppable bytes dropped
    layout: ChainLayout
    chain: Chain


def saving_options(graph: Graph, layout: ChainLayout,
                   levels: Sequence[float] = SAVING_LEVELS,
                   deadline: float | None = None) -> list[SavingOption]:
    """One option per level that changes some segment, in level order; those built by
    `deadline` (a time.perf_counter() value; about 0.13 s each at 20,001 nodes)."""
    out: list[SavingOption] = []
    seen: set[tuple[frozenset[int], ...]] = {layout.saved}
    for level in levels:
        if deadline is not None and time.perf_counter() > deadline:
            break
        saved, backward = list(layout.saved), list(layout.backward)
        for i in range(1, layout.length + 1):
            lean = _lean_stage(graph, layout, i, level)
            if lean is not None:
                saved[i], backward[i] = lean
        if tuple(saved) in seen:
            continue
        seen.add(tuple(saved))
        option = replace(layout, saved=tuple(saved), backward=tuple(backward))
        out.append(SavingOption(level, option, chain_of_layout(graph, option)))
    return out


def combined_layout(layout: ChainLayout, options: Sequence[ChainLayout],
                    picks: Sequence[int]) -> ChainLayout:
    """`layout` with stage i's saved set and backward from option picks[i - 1] (0: itself)."""
    if not any(picks):
        return layout
    layouts = (layout, *options)
    saved, backward = list(layout.saved), list(layout.backward)
    for i, o in enumerate(picks, start=1):
        saved[i], backward[i] = layouts[o].saved[i], layouts[o].backward[i]
    return replace(layout, saved=tuple(saved), backward=tuple(backward))


def _lean_stage(graph: Graph, layout: ChainLayout, i: int, level: float
                ) -> tuple[frozenset[int], tuple[int, ...]] | None:
    """(saved set, backward nodes) of stage i at `level`; None: unchanged."""
    index = graph.index
    size, roots, preds = index.storage_bytes, index.storage_roots, index.predecessors
    segment = set(layout.forward[i])
    joint = set(layout.joint[i])
    viewed = {roots[w] for w in layout.saved[i] if roots[w] != w}
    candidates = [v for v in layout.saved[i]
                  if v in segment and v not in joint and v not in viewed and roots[v] == v
                  and size[v] > 0 and index.node(v).recomputable]
    total = sum(size[v] for v in candidates)
    # cheapest to drop first: what dropping v alone makes the backward compute again (v and
    # its ancestors in the segment that are neither kept nor a joint) per byte; ranking by
    # v's own compute instead cost more on every zoo row (gpt12 at 0.6: +32.8 vs +30.2 %)
    resident = set(layout.saved[i]) | set(layout.joint[i - 1]) | set(layout.joint[0])
    again_ms = {v: _again_ms(graph, v, segment, resident) for v in candidates}
    candidates.sort(key=lambda v: (again_ms[v] / size[v], v))
    dropped: set[int] = set()
    bytes_dropped = 0
    for v in candidates:
        if bytes_dropped >= level * total:
            break
        dropped.add(v)
        bytes_dropped += size[v]
    if not dropped:
        return None
    kept = frozenset(layout.saved[i] - dropped)
    available = kept | set(layout.joint[i - 1]) | set(layout.joint[0])
    # what the backward computes again: the dropped values and what they need, in the segment
    again = _ancestry(dropped, preds, lambda v: v in segment and v not in available)
    if not all(index.node(v).recomputable for v in again):
        return None
    position = {v: k for k, v in enumerate(layout.forward[i])}
    order: list[int] = []
    placed: set[int] = set()
    for w in layout.backward[i]:
        # the values w reads that are computed again, with their own needs, in forward order
        wanted = _ancestry([u for u in preds[w] if u in again], preds,
                           lambda v: v in again and v not in placed)
        order.extend(sorted(wanted, key=position.__getitem__))
        placed.update(wanted)
        order.append(w)
    return kept, tuple(order)


def _again_ms(graph: Graph, v: int, segment: set[int], resident: set[int]) -> float:
    """Compute of v and of its ancestors in `segment` that are not `resident`."""
    index = graph.index
    again = _ancestry([v], index.predecessors,
                      lambda w: w == v or (w in segment and w not in resident))
    return sum(index.node(w).compute_ms for w in again)


def _ancestry(start: Iterable[int], preds: Mapping[int, Sequence[int]],
              inside: Callable[[int], bool]) -> set[int]:
    """`start` and their ancestors, through and within the nodes `inside` admits."""
    out: set[int] = set()
    stack = [v for v in start if inside(v)]
    while stack:
        v = stack.pop()
        if v not in out:
            out.add(v)
            stack.extend(u for u in preds[v] if u not in out and inside(u))
    return out
