"""Tight budgets on generic DAGs: checkpoints retained while needed, stages run depth-first.

`CheckpointPlan` (the greedy eviction's model) keeps a checkpoint only until its last direct
reader: a value can then be dropped only where its inputs are still resident, and on wide
layered graphs every drop starts a recomputation cascade back to the sources, so greedy
eviction stops far above the least feasible memory. Here a kept value is retained until the
last stage that *needs* it (directly, or to recompute a dropped reader): dropping a wide
layer's values extends the retention of the narrower layer they are recomputed from, the
classic checkpointing trade, evaluated exactly.

Stage t (frontier-advancing, as Checkmate) computes t after its *closure*: the ancestors
reached through dropped values, stopping at kept ones (resident: first computed in their own
stage, retained through `retain[x]`, the last stage whose closure reads x). A stage runs its
closure in one of three ways, the cheapest that fits the budget (else the lowest peak):
ascending, or depth-first with inputs in Sethi and Ullman's order (the input whose own
computation needs the most memory beyond its result first), each value once and kept until
its last use in the stage; or as a tree unfolded depth-first in that order, each recomputed
value freed right after the reader it was computed for (reused while still resident), which
holds little more than the recursion path at the price of recomputing shared ancestors.
Peaks and costs are the simulator's (fixed and held bytes included; views charged their
base's bytes, as `problem_from_graph` does); values that may not be recomputed stay kept.

`RetentionPlan.reduce` drops, at the stage with the highest peak, the kept value whose drop
lowers the total excess over the budget at the least extra compute per byte; `improve`
re-keeps dropped values while the plan stays within budget and gets cheaper. Each trial
re-evaluates only the stages whose closure reads or contains the toggled value.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import numpy as np

from planner.core.plan import Action, compute, free
from planner.solvers.remat.problem import RematProblem

CLOSURE_CAP = 256  # nodes a stage's closure may hold (larger: a cascade, the drop is refused)
TREE_FACTOR = 8  # a depth-first tree may hold this many times its closure's nodes


@dataclass
class Stage:
    closure: list[int]  # ascending positions computed in the stage (its target last)
    reads: frozenset[int]  # kept values the closure reads
    cost: float
    work: int  # bytes above the retained ones at the stage's peak
    mode: str  # 'ascending', 'depth-first' (each once) or 'tree' (recomputed per use)
    steps: list[int]  # x: compute x, ~x: free x (the stage's own actions, target kept)


@dataclass
class Trial:
    node: int
    stages: dict[int, Stage]  # re-evaluated stages
    retain: dict[int, int]  # kept values whose retention changes -> new last stage
    delta_cost: float
    first: int  # peaks[k] = the new peak of stage first + k (where it may change)
    peaks: np.ndarray
    excess: int  # total bytes over budget after the toggle


class RetentionPlan:
    """A kept/dropped choice per value with per-stage closures, costs and peaks (module)."""

    def __init__(self, problem: RematProblem) -> None:
        p = self.p = problem
        n = p.n
        self.keep = [True] * n
        self.droppable = [p.recomputable[v] and p.mem_bytes[v] > 0 for v in range(n)]
        self.bytes = p.stage_bytes  # the stage arithmetic (the problem's ledger's rules)
        self.floor = self.bytes.floor  # fixed and earlier held bytes, through each stage
        self.stages = [self._stage(t, [t]) for t in range(n)]
        self.read_in: list[set[int]] = [set(p.users[x]) for x in range(n)]  # stages reading x
        self.inside: list[set[int]] = [set() for _ in range(n)]  # other stages computing x
        self.retain = [max(self.read_in[x], default=x) for x in range(n)]
        diff = np.zeros(n + 1, dtype=np.int64)
        for x in range(n):
            if self.retain[x] > x:
                diff[x + 1] += p.mem_bytes[x]
                diff[self.retain[x] + 1] -= p.mem_bytes[x]
        # stage -> bytes retained across it; stage -> its peak (numpy: a toggle shifts spans)
        self.base = np.cumsum(diff[:n])
        self.peak = (np.array(self.floor, dtype=np.int64) + self.base
                     + np.array([st.work for st in self.stages], dtype=np.int64))
        self.excess = int(np.maximum(self.peak - p.budget_bytes, 0).sum())

    # -- stages ----------------------------------------------------------------------------
    def _closure(self, t: int) -> list[int] | None:
        deps, keep = self.p.deps, self.keep
        seen, stack = {t}, [t]
        while stack:
            for u in deps[stack.pop()]:
                if u not in seen and not keep[u]:
                    seen.add(u)
                    stack.append(u)
            if len(seen) > CLOSURE_CAP:
                return None
        return sorted(seen)

    def _stage(self, t: int, closure: list[int]) -> Stage:
        p = self.p
        inside = set(closure)
        reads = frozenset(u for k in closure for u in p.deps[k] if u not in inside)
        if len(closure) == 1:
            return Stage(closure, reads, p.cost[t], self.bytes.alone(t), "ascending", [t])
        need, size = self._tree_tables(t, closure, inside)
        options = [(*self._run(t, closure, inside), "ascending"),
                   (*self._run(t, self._dfs_order(t, inside, need), inside), "depth-first")]
        if size[t] <= TREE_FACTOR * len(closure):
            options.append((*self._tree_steps(t, inside, need), "tree"))
        room = p.budget_bytes - self.floor[t] - int(self.base[t])
        fitting = [o for o in options if o[1] <= room]
        steps, work, cost, mode = (min(fitting, key=lambda o: (o[2], o[1])) if fitting
                                   else min(options, key=lambda o: (o[1], o[2])))
        return Stage(closure, reads, cost, work, mode, steps)

    def _run(self, t: int, order: list[int], inside: set[int]
             ) -> tuple[list[int], int, float]:
        """(steps, peak bytes, cost) of running the closure once in `order`, each value freed
        after its last use in the stage (the target stays)."""
        deps = self.p.deps
        uses: dict[int, int] = {}
        for k in order:
            for u in deps[k]:
                if u in inside:
                    uses[u] = uses.get(u, 0) + 1
        steps: list[int] = []
        for k in order:
            steps.append(k)
            for u in deps[k]:
                if u in inside:
                    uses[u] -= 1
                    if not uses[u]:
                        steps.append(~u)
        return steps, *self._measure(t, steps)

    def _tree_steps(self, t: int, inside: set[int], need: dict[int, int]
                    ) -> tuple[list[int], int, float]:
        """(steps, peak bytes, cost) of the closure unfolded depth-first: a missing input is
        recomputed for each reader unless still resident for an enclosing one, and freed by
        the reader it was computed for."""
        steps: list[int] = []
        resident: set[int] = set()
        path: list[tuple[int, list[int], int, list[int]]] = [(t, self.kids(t, inside, need), 0, [])]
        while path:
            x, kids, i, owned = path[-1]
            if i < len(kids):
                path[-1] = (x, kids, i + 1, owned)
                u = kids[i]
                if u not in resident:
                    owned.append(u)
                    path.append((u, self.kids(u, inside, need), 0, []))
                continue
            path.pop()
            steps.append(x)
            resident.add(x)
            for u in owned:
                steps.append(~u)
                resident.discard(u)
        return steps, *self._measure(t, steps)

    def _measure(self, t: int, steps: list[int]) -> tuple[int, float]:
        """(bytes above the retained ones at the stage's peak, cost) of stage t's steps."""
        cost = 0.0
        for k in steps:
            if k >= 0:
                cost += self.p.cost[k]
        return self.bytes.work(t, steps), cost

    def _dfs_order(self, t: int, inside: set[int], need: dict[int, int]) -> list[int]:
        """The closure in depth-first post-order, inputs in Sethi-Ullman order, each once."""
        order: list[int] = []
        seen = {t}
        path = [(t, self.kids(t, inside, need), 0)]
        while path:
            x, kids, i = path[-1]
            if i < len(kids):
                path[-1] = (x, kids, i + 1)
                u = kids[i]
                if u not in seen:
                    seen.add(u)
                    path.append((u, self.kids(u, inside, need), 0))
                continue
            path.pop()
            order.append(x)
        return order

    def _tree_tables(self, t: int, closure: list[int], inside: set[int]
                     ) -> tuple[dict[int, int], dict[int, int]]:
        """Need (Sethi-Ullman) and node count of the closure unfolded as a tree."""
        mem, running = self.p.mem_bytes, self.bytes.running
        need: dict[int, int] = {}
        size: dict[int, int] = {}
        cap = TREE_FACTOR * len(closure) + 1
        for x in closure:  # ascending: inputs before readers
            kids = self.kids(x, inside, need)
            acc = peak = 0
            for u in kids:
                peak = max(peak, acc + need[u])
                acc += mem[u]
            need[x] = max(peak, acc + running(t, x))
            size[x] = min(cap, 1 + sum(size[u] for u in kids))
        return need, size

    def kids(self, x: int, inside: set[int], need: dict[int, int]) -> list[int]:
        """x's inputs in the closure, largest need − bytes first (Sethi-Ullman)."""
        mem = self.p.mem_bytes
        kids = [u for u in self.p.deps[x] if u in inside]
        kids.sort(key=lambda u: need[u] - mem[u], reverse=True)
        return kids

    # -- trials ----------------------------------------------------------------------------
    def trial(self, v: int) -> Trial | None:
        """The plan with v's membership flipped (None: a stage's closure would cascade)."""
        p, budget = self.p, self.p.budget_bytes
        affected = sorted(self.read_in[v] | self.inside[v]) if self.keep[v] else sorted(
            self.inside[v])
        self.keep[v] = not self.keep[v]
        try:
            stages: dict[int, Stage] = {}
            for t in affected:
                closure = self._closure(t)
                if closure is None:
                    return None
                stages[t] = self._stage(t, closure)
        finally:
            self.keep[v] = not self.keep[v]
        gained: dict[int, set[int]] = {}
        lost: dict[int, set[int]] = {}
        for t, st in stages.items():
            old = self.stages[t].reads
            for x in st.reads - old:
                gained.setdefault(x, set()).add(t)
            for x in old - st.reads:
                lost.setdefault(x, set()).add(t)
        retain: dict[int, int] = {}
        for x in set(gained) | set(lost) | {v}:
            if x == v and self.keep[v]:
                retain[x] = x  # dropped: no longer retained past its own stage
                continue
            stages_reading = (self.read_in[x] - lost.get(x, set())) | gained.get(x, set())
            retain[x] = max(stages_reading, default=x)
        # retention spans that grow (+) or shrink (−), then each stage's new peak, in numpy
        spans: list[tuple[int, int, int]] = []
        for x, r in retain.items():
            old_r = self.retain[x] if self.keep[x] else x  # a dropped value: not retained
            if r != old_r:
                spans.append((min(r, old_r) + 1, max(r, old_r) + 1,
                              p.mem_bytes[x] if r > old_r else -p.mem_bytes[x]))
        first = min([lo for lo, _, _ in spans] + list(stages), default=0)
        end = max([hi for _, hi, _ in spans] + [t + 1 for t in stages], default=first)
        delta = np.zeros(end - first + 1, dtype=np.int64)
        for lo, hi, b in spans:
            delta[lo - first], delta[hi - first] = delta[lo - first] + b, delta[hi - first] - b
        delta = np.cumsum(delta[:-1])
        for t, st in stages.items():
            delta[t - first] += st.work - self.stages[t].work
        was = self.peak[first:end]
        peaks = was + delta
        over = np.maximum(peaks - budget, 0).sum() - np.maximum(was - budget, 0).sum()
        excess = self.excess + int(over)
        dc = math.fsum(st.cost - self.stages[t].cost for t, st in stages.items())
        return Trial(v, stages, retain, dc, first, peaks, excess)

    def commit(self, tr: Trial) -> None:
        v = tr.node
        self.keep[v] = not self.keep[v]
        for t, st in tr.stages.items():
            for x in self.stages[t].reads:
                self.read_in[x].discard(t)
            for x in self.stages[t].closure:
                if x != t:
                    self.inside[x].discard(t)
            self.stages[t] = st
            for x in st.reads:
                self.read_in[x].add(t)
            for x in st.closure:
                if x != t:
                    self.inside[x].add(t)
        for x, r in tr.retain.items():
            old_r = self.retain[x]
            self.retain[x] = r
            lo, hi = (old_r, r) if r > old_r else (r, old_r)
            self.base[lo + 1:hi + 1] += self.p.mem_bytes[x] if r > old_r else -self.p.mem_bytes[x]
        self.peak[tr.first:tr.first + len(tr.peaks)] = tr.peaks
        self.excess = tr.excess

    def reduce(self, deadline: float, rng: random.Random | None = None,
               candidates: int = 96) -> bool:
        """Drop kept values (or re-keep dropped ones) until every stage fits: at the stage
        with the highest peak, the toggle that lowers the total excess at the least extra
        compute per byte. False when stuck or out of time."""
        while self.excess > 0:
            if time.perf_counter() > deadline:
                return False
            ranked = self._candidates(rng)
            best = (self._best_toggle(ranked[:candidates], rng)
                    or self._best_toggle(ranked[candidates:], rng))  # the rest, when stuck
            if best is None:
                return False
            self.commit(best)
        return True

    def _candidates(self, rng: random.Random | None) -> list[int]:
        """Toggles that may lower the top stage: kept values retained across it, dropped
        values recomputed at or after it (their inputs are retained for them), most promising
        first."""
        p = self.p
        top = int(np.argmax(self.peak))
        out = [x for x in range(top) if self.droppable[x] and (
            (self.keep[x] and self.retain[x] >= top)
            or (not self.keep[x] and any(t >= top for t in self.inside[x])))]

        def estimate(x: int) -> float:  # extra compute per byte, far more for a cascade
            e = p.cost[x] * max(1, len(self.read_in[x])) / p.mem_bytes[x]
            if self.keep[x] and any(not self.keep[u] or self.retain[u] < self.retain[x]
                                    for u in p.deps[x]):
                e *= 100.0
            return e * (1.0 + 0.5 * rng.random()) if rng is not None else e

        out.sort(key=estimate)
        return out

    def _best_toggle(self, ranked: list[int], rng: random.Random | None) -> Trial | None:
        best: tuple[float, Trial] | None = None
        for x in ranked:
            tr = self.trial(x)
            if tr is None or tr.excess >= self.excess:
                continue
            score = max(tr.delta_cost, 0.0) / (self.excess - tr.excess)
            if rng is not None:  # restarts: randomised choice among comparable toggles
                score *= 1.0 + rng.random()
            if best is None or score < best[0]:
                best = (score, tr)
        return best[1] if best is not None else None

    def improve(self, deadline: float) -> None:
        """Re-keep dropped values while the plan stays within budget and gets cheaper."""
        p = self.p
        dropped = [x for x in range(p.n) if not self.keep[x] and self.inside[x]]
        dropped.sort(key=lambda x: -p.cost[x] * len(self.inside[x]))
        for x in dropped:
            if time.perf_counter() > deadline:
                return
            tr = self.trial(x)
            if tr is not None and tr.excess == 0 and tr.delta_cost < 0:
                self.commit(tr)

    @property
    def total_cost(self) -> float:
        return math.fsum(st.cost for st in self.stages)

    @property
    def peak_bytes(self) -> int:
        return int(self.peak.max()) if len(self.peak) else self.p.fixed_bytes

    def actions(self) -> list[Action]:
        p = self.p
        ids = p.node_ids
        out: list[Action] = []
        expiring: list[list[int]] = [[] for _ in range(p.n)]
        for x in range(p.n):
            if self.keep[x] and self.retain[x] > x:
                expiring[self.retain[x]].append(x)
        for t, st in enumerate(self.stages):
            out.extend(compute(ids[k]) if k >= 0 else free(ids[~k]) for k in st.steps)
            if not (self.keep[t] and self.retain[t] > t):
                out.append(free(ids[t]))
            out.extend(free(ids[x]) for x in expiring[t])
        return out


def tight_budget_plan(problem: RematProblem, deadline: float, seed: int = 0,
                      attempts: int = 6) -> list[Action] | None:
    """A plan within `problem.budget_bytes` for budgets near the least feasible memory, or
    None. Greedy toggles from store-all in the problem's order (up to `attempts` runs, the
    later ones with randomised candidate orders, while time is left), then re-keeps what the
    budget allows. Frees are implied as in `actions`; first computations follow the order."""
    rng: random.Random | None = None
    for _ in range(attempts):
        if time.perf_counter() > deadline:
            break
        plan = RetentionPlan(problem)
        if plan.reduce(deadline, rng):
            plan.improve(deadline)
            return plan.actions()
        rng = random.Random(seed if rng is None else rng.random())
    return None
