"""Checkpoint-set plans evaluated incrementally: the fast core of auto's heuristics at scale.

A checkpoint set K defines a plan through Checkmate's frontier scheduler (as
`planner.solvers.baselines.checkpoint_schedule`): stage t computes node t (position in the problem's
order) after recomputing, in ascending order, whichever of its ancestors are not resident; a
value stays resident after its stage while it is in K (until its last consumer has run), the
target of stage t is carried into stage t+1, anything else is freed as soon as the stage no
longer needs it. Memory is accounted as the simulator does (the problem's memory ledger in
stage form, `RematProblem.stage_bytes`; whole plans by `RematProblem.replay`).

Each stage's cost and peak depend on K only through which earlier values are resident, so
toggling one node v changes stages v+2 .. last_use(v) alone: `CheckpointPlan` keeps per-stage
costs and peaks and re-evaluates just that range (`try_toggle`), instead of building and
simulating whole action lists for every candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.plan import Action, compute, free
from planner.solvers.remat.problem import RematProblem


class _Cascade(Exception):
    """A stage would recompute more nodes than allowed."""


@dataclass(frozen=True)
class Trial:
    """The effect of toggling one node on the stages `span`: the stages whose recomputations
    involve the node are re-evaluated (`changed`: stage -> cost, peak, recomputed nodes); every
    other stage of the span only gains or loses the node's bytes (`shift`)."""

    node: int
    span: range
    shift: int
    changed: dict[int, tuple[float, int, list[int]]]
    delta_cost: float
    range_peak: int  # the largest peak over the span after the toggle

    def peak(self, t: int, stage_peak: list[int]) -> int:
        """Stage t's peak after the toggle (t in the span)."""
        hit = self.changed.get(t)
        return hit[1] if hit is not None else stage_peak[t] + self.shift


class CheckpointPlan:
    """A checkpoint set with per-stage cost and peak, updated incrementally."""

    def __init__(self, problem: RematProblem, keep: list[bool] | None = None) -> None:
        p = problem
        n = p.n
        self.problem = p
        self.n = n
        self.deps = p.deps
        self.mem = p.mem_bytes
        self.cost = p.cost
        self.last_use = [max(u) if u else -1 for u in p.users]
        # values that must stay: not recomputable yet read later
        self.forced = [not p.recomputable[v] and bool(p.users[v]) for v in range(n)]
        self.keep = list(keep) if keep is not None else [True] * n
        for v in range(n):
            if self.forced[v]:
                self.keep[v] = True
        self.bytes = p.stage_bytes  # the stage arithmetic (the problem's ledger's rules)
        self.start = self.bytes.floor  # fixed and earlier held bytes, through each stage
        # base[t]: bytes of the values resident when stage t begins
        diff = [0] * (n + 1)
        for v in range(n):
            last = self.last_use[v]
            if last >= v + 1:  # carried into stage v+1 as the previous target
                diff[v + 1] += self.mem[v]
                diff[v + 2 if v + 2 <= n else n] -= self.mem[v]
            if self.keep[v] and last >= v + 2:
                diff[v + 2] += self.mem[v]
                diff[last + 1] -= self.mem[v]
        self.base = []
        acc = 0
        for t in range(n):
            acc += diff[t]
            self.base.append(acc)
        self.stage_cost = [0.0] * n
        self.stage_peak = [0] * n
        self.recomputed: list[list[int]] = [[] for _ in range(n)]  # stage -> nodes recomputed
        self.recomputed_in: list[set[int]] = [set() for _ in range(n)]  # node -> those stages
        for t in range(n):
            self.stage_cost[t], self.stage_peak[t], again = self._stage(t, self.base[t])
            self._set_recomputed(t, again)

    # -- evaluation --------------------------------------------------------------------------

    def _closure(self, t: int, cap: int | None = None) -> list[int]:
        """Stage t's nodes: t and its ancestors not resident (raises _Cascade past `cap`)."""
        deps, last_use, keep = self.deps, self.last_use, self.keep
        needed = {t}
        stack = [t]
        while stack:
            x = stack.pop()
            for u in deps[x]:
                if u in needed or (last_use[u] >= t and (u == t - 1 or keep[u])):
                    continue
                needed.add(u)
                stack.append(u)
            if cap is not None and len(needed) > cap:
                raise _Cascade
        return sorted(needed)

    def _set_recomputed(self, t: int, nodes: list[int]) -> None:
        for k in self.recomputed[t]:
            self.recomputed_in[k].discard(t)
        self.recomputed[t] = nodes
        for k in nodes:
            self.recomputed_in[k].add(t)

    def _stage(self, t: int, base: int, cap: int | None = None) -> tuple[float, int, list[int]]:
        """(cost, peak bytes, nodes recomputed) of stage t when `base` bytes are resident as it
        begins (raises _Cascade when it recomputes more than `cap` nodes)."""
        order = self._closure(t, cap)
        if len(order) == 1:  # the common case: nothing recomputed
            return self.cost[t], self.start[t] + base + self.bytes.alone(t), []
        peak = self.start[t] + base + self.bytes.work(t, self._steps(t, order))
        return math.fsum(self.cost[k] for k in order), peak, order[:-1]

    def _steps(self, t: int, order: list[int]) -> list[int]:
        """Stage t's own steps (x: compute x, ~x: free x) for its nodes `order`: each value is
        freed after its last use in the stage unless kept past it (or it is the target)."""
        deps, last_use, keep = self.deps, self.last_use, self.keep
        uses: dict[int, int] = {}
        for k in order:
            for u in deps[k]:
                uses[u] = uses.get(u, 0) + 1
        steps: list[int] = []
        step = steps.append
        for k in order:
            step(k)
            for u in deps[k]:
                left = uses[u] - 1
                uses[u] = left
                if not left and not (last_use[u] > t and (keep[u] or u == t)):
                    step(~u)
            if k not in uses and not (last_use[k] > t and (keep[k] or k == t)):
                step(~k)
        return steps

    @property
    def total_cost(self) -> float:
        return math.fsum(self.stage_cost)

    @property
    def peak_bytes(self) -> int:
        return max(self.stage_peak) if self.n else self.problem.fixed_bytes

    def peak_stage(self) -> int:
        peaks = self.stage_peak
        return peaks.index(max(peaks))

    def span(self, v: int) -> range:
        """Stages whose cost or peak depend on whether v is kept."""
        return range(v + 2, self.last_use[v] + 1)

    def try_toggle(self, v: int) -> Trial:
        """Evaluate K with v's membership flipped, without committing it."""
        trial = self.try_drop(v)
        assert trial is not None  # no cap: always evaluated
        return trial

    def try_drop(self, v: int, focus: int | None = None,
                 max_cost_per_byte: float | None = None, max_stage_nodes: int | None = None
                 ) -> Trial | None:
        """Evaluate K with v's membership flipped, without committing it. Only the stages that
        recompute one of v's readers change beyond v's own bytes.

        With `focus` and `max_cost_per_byte` (dropping v to lower stage `focus`): None as soon
        as the extra compute exceeds that many per byte saved at `focus` (or nothing is), or a
        stage would run more than `max_stage_nodes` nodes (a recomputation cascade)."""
        span = self.span(v)
        shift = -self.mem[v] if self.keep[v] else self.mem[v]
        touched: set[int] = set()
        for w in self.problem.users[v]:
            if w in span:
                touched.add(w)
            touched.update(t for t in self.recomputed_in[w] if t in span)
        changed: dict[int, tuple[float, int, list[int]]] = {}
        cap = math.inf
        stages = sorted(touched)
        self.keep[v] = not self.keep[v]
        try:
            if focus is not None and max_cost_per_byte is not None:
                hit = (self._stage(focus, self.base[focus] + shift, max_stage_nodes)
                       if focus in touched else None)
                peak = hit[1] if hit is not None else self.stage_peak[focus] + shift
                saved = self.stage_peak[focus] - peak
                if saved <= 0:
                    return None
                cap = max_cost_per_byte * saved
                if hit is not None:
                    changed[focus] = hit
                    stages.remove(focus)
            extra = math.fsum(c for c, _, _ in changed.values()) - math.fsum(
                self.stage_cost[t] for t in changed)
            for t in stages:
                changed[t] = hit = self._stage(t, self.base[t] + shift, max_stage_nodes)
                extra += hit[0] - self.stage_cost[t]
                if extra > cap:
                    return None
        except _Cascade:
            return None
        finally:
            self.keep[v] = not self.keep[v]
        delta = math.fsum(c for c, _, _ in changed.values()) - math.fsum(
            self.stage_cost[t] for t in changed)
        peaks = self.stage_peak
        top = max((pk for _, pk, _ in changed.values()), default=0)
        if len(changed) < len(span):
            top = max(top, max(peaks[t] for t in span if t not in changed) + shift)
        return Trial(v, span, shift, changed, delta, top)

    def commit(self, trial: Trial) -> None:
        v = trial.node
        self.keep[v] = not self.keep[v]
        for t in trial.span:
            self.base[t] += trial.shift
            hit = trial.changed.get(t)
            if hit is None:
                self.stage_peak[t] += trial.shift
            else:
                self.stage_cost[t], self.stage_peak[t], again = hit
                self._set_recomputed(t, again)

    def peak_with(self, trial: Trial) -> int:
        """The plan's peak if `trial` were committed."""
        a, b = trial.span.start, trial.span.stop
        outside = max(max(self.stage_peak[:a], default=0), max(self.stage_peak[b:], default=0))
        return max(outside, trial.range_peak)

    def resident_at(self, t: int) -> list[int]:
        """Kept values resident when stage t begins (candidates to drop for stage t)."""
        return [u for u in range(t - 1) if self.keep[u] and self.last_use[u] >= t]

    def droppable(self, v: int) -> bool:
        return self.keep[v] and not self.forced[v] and self.last_use[v] >= v + 2

    # -- actions -----------------------------------------------------------------------------

    def actions(self) -> list[Action]:
        """The plan as actions (node ids), as the frontier scheduler emits it."""
        ids, last_use, keep = self.problem.node_ids, self.last_use, self.keep
        out: list[Action] = []
        resident: set[int] = set()
        expiring: list[list[int]] = [[] for _ in range(self.n)]  # t -> values last read at t
        for u in range(self.n):
            if last_use[u] >= 0:
                expiring[last_use[u]].append(u)
        for t in range(self.n):

            def kept(u: int, t: int = t) -> bool:
                return last_use[u] > t and (keep[u] or u == t)

            order = self._closure(t)
            for k in self._steps(t, order):
                if k >= 0:
                    out.append(compute(ids[k]))
                    resident.add(k)
                else:
                    out.append(free(ids[~k]))
                    resident.discard(~k)
            ending = {u for u in (t - 1, *expiring[t], *order) if u in resident and not kept(u)}
            for u in sorted(ending):
                out.append(free(ids[u]))
                resident.discard(u)
        return out
