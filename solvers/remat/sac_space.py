"""The space torch.compile executes: selective activation checkpointing (SAC) decisions.

Under `planner.runtime.compile` each forward value is either saved (kept from its forward
computation to its last backward reader) or recomputed (freed after its last forward reader,
recomputed once in the backward just before its first reader there, or earlier when a recomputed
value that reads it is recomputed, and kept to its last backward reader). A plan of this space is
its recomputed set R; `compiled_schedule(graph, R)` is the step inductor runs, in the simulator's
model. `SacSpace` holds a graph's facts for the solvers that search over R (planner.solvers.remat
.sac): which forward values may be recomputed, and a cheap replay of any R.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from planner.core.graph import Graph, Phase
from planner.core.plan import Action, compute, free
from planner.sim.ledger import MemoryLedger, ViewRule
from planner.solvers.order import schedule_order

__all__ = ["SacSpace", "SacRun", "compiled_schedule", "compiled_steps"]

Step = tuple[int, bool]  # (node, whether this computation is the backward's recomputation)


def compiled_steps(graph: Graph, recomputed: Iterable[int]) -> list[Step]:
    """The computations of the compiled step in order: the forward once, then each backward node
    preceded by the recomputations it needs (recomputed ancestors first, each once)."""
    order = schedule_order(graph)
    backward = frozenset(v for v in order if graph.node(v).phase is Phase.backward)
    return _steps(order, backward, graph.index.predecessors, frozenset(recomputed))


def _steps(order: list[int], backward: frozenset[int], preds: Mapping[int, Sequence[int]],
           recomputed: frozenset[int]) -> list[Step]:
    steps: list[Step] = [(v, False) for v in order if v not in backward]
    done: set[int] = set()

    def recompute(v: int) -> None:  # v's recomputed ancestors first (topological)
        stack = [(v, False)]
        while stack:
            u, expanded = stack.pop()
            if u in done:
                continue
            if expanded:
                done.add(u)
                steps.append((u, True))
                continue
            stack.append((u, True))
            stack.extend((w, False) for w in preds[u] if w in recomputed and w not in done)

    for v in order:
        if v in backward:
            for u in preds[v]:
                if u in recomputed:
                    recompute(u)
            steps.append((v, False))
    return steps


def compiled_schedule(graph: Graph, recomputed: frozenset[int]) -> list[Action]:
    """The compiled step in the simulator's model: the forward computes every forward value
    once; a value is freed after its last reader (in the forward unless the backward reads it
    and it is not recomputed); the backward computes each recomputed value once, just before
    its first reader, and frees it after its last."""
    order = schedule_order(graph)
    backward = frozenset(v for v in order if graph.node(v).phase is Phase.backward)
    index = graph.index
    steps = _steps(order, backward, index.predecessors, frozenset(recomputed))
    return _actions(steps, backward, index.predecessors, index.successors,
                    frozenset(recomputed))[0]


def _actions(steps: list[Step], backward: frozenset[int], preds: Mapping[int, Sequence[int]],
             succs: Mapping[int, Sequence[int]], recomputed: frozenset[int]
             ) -> tuple[list[Action], list[int]]:
    """The steps as compute/free actions, and the step index of each action."""
    # Which copy a reader reads: the backward copy of a recomputed value once it exists.
    last_read: dict[tuple[int, bool], int] = {}
    for i, (v, again) in enumerate(steps):
        for u in preds[v]:
            late = u in recomputed and (again or v in backward)
            last_read[(u, late)] = i
    ending: dict[int, list[int]] = {}
    for i, (v, again) in enumerate(steps):
        ending.setdefault(last_read.get((v, again), i) if succs[v] else i, []).append(v)
    actions: list[Action] = []
    step_of: list[int] = []
    for i, (v, _) in enumerate(steps):
        actions.append(compute(v))
        step_of.append(i)
        for u in ending.get(i, ()):
            actions.append(free(u))
            step_of.append(i)
    return actions, step_of


@dataclass(frozen=True)
class SacRun:
    """One recomputed set replayed: the simulator's peak and compute, where the peak is."""

    recomputed: frozenset[int]
    peak_bytes: int
    compute_ms: float
    peak_step: int  # index into `steps` of the computation at the peak (-1: none)
    steps: list[Step]


class SacSpace:
    """A graph's facts for searching recomputed sets (forward values by id)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ledger = MemoryLedger.of(graph)
        index = graph.index
        self.order = schedule_order(graph)
        self.backward = frozenset(v for v in self.order if graph.node(v).phase is Phase.backward)
        self.forward = [v for v in self.order if v not in self.backward]
        self.preds, self.succs = index.predecessors, index.successors
        # forward values the backward reads directly
        self.read_by_backward = frozenset(
            u for b in self.backward for u in self.preds[b] if u not in self.backward)
        self.candidates = self._candidates()
        self.candidate_set = frozenset(self.candidates)
        self.fpos = {v: i for i, v in enumerate(self.forward)}  # forward step of each value
        # last forward step reading each forward value (its own when none does)
        self.last_forward_read = {
            v: max((self.fpos[w] for w in self.succs[v] if w in self.fpos), default=self.fpos[v])
            for v in self.forward}

    def _candidates(self) -> list[int]:
        """Forward values worth recomputing: recomputable, and read in the backward directly or
        by a value that may be recomputed (in forward order)."""
        useful: set[int] = set()
        recomputable = self.ledger.recomputable
        for v in reversed(self.forward):
            if not recomputable[v]:
                continue
            if v in self.read_by_backward or any(w in useful for w in self.succs[v]):
                useful.add(v)
        return [v for v in self.forward if v in useful]

    def effective(self, recomputed: Iterable[int]) -> frozenset[int]:
        """The values of `recomputed` the step actually recomputes (read by the backward
        directly or through another one): the same schedule, canonically."""
        given = frozenset(recomputed)
        needed: set[int] = set()
        for v in reversed(self.forward):
            if v in given and (v in self.read_by_backward
                               or any(w in needed for w in self.succs[v])):
                needed.add(v)
        return frozenset(needed)

    def run(self, recomputed: Iterable[int]) -> SacRun:
        """Replay the compiled step of `recomputed` (unchecked: valid by construction)."""
        chosen = frozenset(recomputed)
        steps = _steps(self.order, self.backward, self.preds, chosen)
        actions, step_of = _actions(steps, self.backward, self.preds, self.succs, chosen)
        figures = self.ledger.replay(actions, views=ViewRule.share_base, check=False)
        peak_step = step_of[figures.peak_action_index] if figures.peak_action_index >= 0 else -1
        return SacRun(chosen, figures.peak_bytes, figures.compute_cost, peak_step, steps)

    def compute_ms(self, recomputed: Iterable[int]) -> float:
        """The compiled step's compute: every node once, each recomputed value once more."""
        extra = self.effective(recomputed)
        return self.ledger.cost_of({v: 2 if v in extra else 1 for v in self.ledger.node_ids})


# -- the heuristic: greedy relief of the peak, then local search --------------------------------
def search(space: SacSpace, budget_bytes: int, deadline: float) -> SacRun | None:
    """The cheapest recomputed set found by `deadline` (time.perf_counter()) whose compiled step
    fits `budget_bytes`; None when none was found. Greedy from saving everything, improved by
    dropping and swapping recomputations; then the same from recomputing every candidate."""
    best: SacRun | None = None
    for start in (frozenset(), frozenset(space.candidates)):
        if best is not None and best.compute_ms <= space.run(()).compute_ms:
            break  # nothing recomputed: nothing to improve
        run = relieve(space, space.run(start), budget_bytes, deadline)
        if run is None:
            continue
        run = improve(space, run, budget_bytes, deadline)
        if best is None or run.compute_ms < best.compute_ms:
            best = run
        if time.perf_counter() > deadline:
            break
    return best


def relieve(space: SacSpace, run: SacRun, budget_bytes: int, deadline: float,
            max_ms: float | None = None) -> SacRun | None:
    """Add recomputations until the step fits: at each peak, the values freed there with the
    most bytes per ms, enough of them to cover the excess; None when stuck or out of time."""
    for _ in range(len(space.candidates) + 1):
        if run.peak_bytes <= budget_bytes:
            return run
        if time.perf_counter() > deadline:
            return None
        picks = _relief(space, run, run.peak_bytes - budget_bytes, max_ms)
        if not picks:
            return None
        if max_ms is not None:
            max_ms -= sum(space.ledger.compute_ms[v] for v in picks)
        run = space.run(run.recomputed | picks)
    return None


def _relief(space: SacSpace, run: SacRun, excess_bytes: int, max_ms: float | None
            ) -> frozenset[int]:
    """Values whose recomputation frees bytes at the peak step, best bytes per ms first, until
    their net bytes cover `excess_bytes` (a value's inputs that would newly be saved across the
    peak count against it)."""
    k, chosen = run.peak_step, run.recomputed
    forward_steps = len(space.forward)
    late_first: dict[int, int] = {}  # forward value -> first backward step reading it
    for i in range(forward_steps, len(run.steps)):
        for u in space.preds[run.steps[i][0]]:
            if u in space.fpos:
                late_first.setdefault(u, i)
    own, ms = space.ledger.storage_bytes, space.ledger.compute_ms
    last_fwd, fpos = space.last_forward_read, space.fpos
    cands = space.candidate_set

    def newly_saved(u: int) -> bool:  # an input that recomputing its reader keeps across k
        return (u in fpos and u not in chosen and u not in late_first and fpos[u] <= k
                and last_fwd[u] < k)

    scored: list[tuple[float, float, float, frozenset[int]]] = []
    for v in space.candidates:
        slot = late_first.get(v)
        if v in chosen or slot is None or not (fpos[v] <= k and last_fwd[v] < k < slot):
            continue
        # Recompute v, and the inputs it would newly keep across the peak when that helps
        # (a softmax and the scores it reads), a few levels up.
        group, frontier = {v}, {u for u in space.preds[v] if newly_saved(u)}
        for _ in range(4):
            if own[v] > sum(own[u] for u in frontier):
                break
            grow = {u for u in frontier if u in cands}
            if not grow:
                break
            group |= grow
            frontier = (frontier - grow) | {w for u in grow for w in space.preds[u]
                                            if w not in group and newly_saved(w)}
        net = float(own[v] - sum(own[u] for u in frontier))
        cost_ms = math.fsum(ms[u] for u in group)
        if net > 0 and (max_ms is None or cost_ms <= max_ms):
            scored.append((net / max(cost_ms, 1e-12), net, cost_ms, frozenset(group)))
    scored.sort(key=lambda t: (-t[0], -t[1]))
    picks: set[int] = set()
    freed = spent = 0.0
    for _, net, cost_ms, members in scored:
        if freed >= excess_bytes:
            break
        if max_ms is not None and spent + cost_ms > max_ms:
            continue
        picks |= members
        freed += net
        spent += cost_ms
    return frozenset(picks)


def improve(space: SacSpace, run: SacRun, budget_bytes: int, deadline: float) -> SacRun:
    """Local search on a fitting run: drop a recomputation (the costliest first) when the step
    still fits, else swap it for cheaper ones that relieve the new peak; until no move helps
    or `deadline`."""
    ms = space.ledger.compute_ms
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for v in sorted(run.recomputed, key=lambda u: -ms[u]):
            if time.perf_counter() > deadline:
                break
            if v not in run.recomputed or ms[v] <= 0:
                continue
            trial = space.run(space.effective(run.recomputed - {v}))
            if trial.peak_bytes > budget_bytes:
                fixed = relieve(space, trial, budget_bytes, deadline, max_ms=ms[v])
                if fixed is None:
                    continue
                trial = fixed
            if trial.compute_ms < run.compute_ms - 1e-12 * max(1.0, run.compute_ms):
                run, improved = trial, True
    return run
