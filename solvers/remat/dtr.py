"""Dynamic eviction (in the spirit of DTR, Kirisame et al. 2021): a feasible plan for any DAG.

Run the nodes in topological order; before a node runs, recompute its missing ancestors in
ascending order; when memory would exceed the budget, evict the unpinned resident value with the
lowest cost / (bytes × distance to its next use). Values no later node reads are freed at once.
Several scoring variants are tried and the cheapest plan within budget is kept. Bytes held from a
node's first computation on (gradient buffers) are tracked as the simulator does; they are never
evictable. Live bytes are the memory ledger's live set (`problem.ledger`, views charged their
base's bytes as the problem does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from itertools import product

from planner.core.plan import Action, compute, free
from planner.sim.ledger import ViewRule
from planner.solvers.remat.problem import RematProblem

Score = Callable[[float, int, int], float]  # (cost, bytes, distance to next use) -> keep value

SCORES: dict[str, Score] = {
    "cost/(bytes*dist)": lambda c, b, d: c / (b * d),
    "cost/bytes": lambda c, b, d: c / b,
    "1/dist": lambda c, b, d: 1.0 / d,
    "cost/(bytes*dist^2)": lambda c, b, d: c / (b * d * d),
}


class _Stuck(Exception):
    pass


def dtr_plan(problem: RematProblem, score: Score, deadline: float = math.inf
             ) -> list[Action] | None:
    n, deps, users = problem.n, problem.deps, problem.users
    mem, cost = problem.mem_bytes, problem.cost
    budget = problem.budget_bytes
    ids = problem.node_ids
    actions: list[Action] = []
    resident: set[int] = set()  # positions
    live = problem.ledger.live_set(ViewRule.charge_base)  # bytes (the ledger's ids: node ids)
    frontier = 0  # nodes with position < frontier have run at least once

    def next_use(u: int) -> int | None:
        for j in users[u]:
            if j >= frontier:
                return j
        return None

    def evict(x: int, pinned: set[int], soft: set[int]) -> None:
        """Free values until computing x fits; never `pinned` (inputs of the node about
        to run), `soft` (inputs its callers still need) only when nothing else is left."""
        while live.peak_if_computed(ids[x]) > budget:
            candidates = [u for u in resident if u not in pinned and mem[u] > 0
                          and (problem.recomputable[u] or next_use(u) is None)]
            preferred = [u for u in candidates if u not in soft] or candidates
            if not preferred:
                raise _Stuck("evict")
            best = min(
                preferred,
                key=lambda u: score(cost[u] + 1e-12, mem[u], (next_use(u) or n) - frontier + 1),
            )
            resident.discard(best)
            live.free(ids[best])
            actions.append(free(ids[best]))

    def run(v: int) -> None:
        """Make v resident: recompute its missing ancestors in ascending order (as the frontier
        scheduler does), pinning only what the rest of this batch still reads; evict others."""
        needed: set[int] = set()
        stack = [v]
        while stack:
            x = stack.pop()
            if x in needed or x in resident:
                continue
            if x != v and not problem.recomputable[x]:
                raise _Stuck("a non-recomputable input was evicted")
            needed.add(x)
            stack.extend(deps[x])
        uses_left: dict[int, int] = {}
        for x in needed:
            for u in deps[x]:
                uses_left[u] = uses_left.get(u, 0) + 1
        if time.perf_counter() > deadline:
            raise _Stuck("out of time")
        for x in sorted(needed):
            pinned = {u for u, k in uses_left.items() if k > 0 and u in resident}
            evict(x, pinned, set())
            actions.append(compute(ids[x]))
            resident.add(x)
            live.compute(ids[x])  # held bytes at v's first computation (its ancestors ran)
            for u in deps[x]:
                uses_left[u] -= 1

    try:
        for t in range(n):
            frontier = t
            run(t)
            frontier = t + 1
            for u in sorted(resident):
                if next_use(u) is None:
                    resident.discard(u)
                    live.free(ids[u])
                    actions.append(free(ids[u]))
    except _Stuck:
        return None
    return actions


def dtr_depth_first_plan(problem: RematProblem, score: Score, deadline: float = math.inf
                         ) -> list[Action] | None:
    """Like dtr_plan, but a missing input is rematerialized depth-first (as DTR does): only the
    inputs of the nodes on the current recomputation path are pinned, not a whole batch of
    ancestors, so deep recomputation cascades fit far smaller budgets."""
    run = _DepthFirst(problem, score, deadline)
    try:
        for t in range(problem.n):
            run.frontier = t
            if t not in run.resident:
                run.materialize(t)
            run.frontier = t + 1
            for u in sorted(run.resident):
                if run.distance(u) > problem.n:
                    run.release(u)
    except _Stuck:
        return None
    return run.actions


class _DepthFirst:
    """The state of a depth-first DTR run: what is resident, pinned and wanted, and the plan."""

    def __init__(self, problem: RematProblem, score: Score, deadline: float) -> None:
        self.problem, self.score, self.deadline = problem, score, deadline
        n = problem.n
        self.actions: list[Action] = []
        self.resident: set[int] = set()  # positions
        self.pins = [0] * n  # how many nodes on the recomputation path hold this value as input
        self.wanted = [0] * n  # how many nodes on the path still have to read it
        # bytes (the ledger's ids: node ids)
        self.live = problem.ledger.live_set(ViewRule.charge_base)
        self.frontier = 0
        self.computed = 0
        self.max_computations = 20 * n + 1000

    def distance(self, u: int) -> int:
        if self.wanted[u]:
            return 1  # the current path reads it next
        for j in self.problem.users[u]:
            if j >= self.frontier:
                return j - self.frontier + 1
        return self.problem.n + 1

    def release(self, u: int) -> None:
        ids = self.problem.node_ids
        self.resident.discard(u)
        self.live.free(ids[u])
        self.actions.append(free(ids[u]))

    def make_room(self, x: int) -> None:
        p = self.problem
        while self.live.peak_if_computed(p.node_ids[x]) > p.budget_bytes:
            candidates = [u for u in self.resident if not self.pins[u] and p.mem_bytes[u] > 0
                          and (p.recomputable[u] or self.distance(u) > p.n)]
            if not candidates:
                raise _Stuck("evict")
            # Cost of bringing a value back: itself plus its evicted ancestors (DTR's e*),
            # so that evictions that would start long cascades are avoided.
            remat = [0.0] * (max(candidates) + 1)
            for u in range(len(remat)):
                remat[u] = p.cost[u] + sum(remat[w] for w in p.deps[u]
                                           if w not in self.resident)
            self.release(min(candidates, key=lambda u: self.score(
                remat[u] + 1e-12, p.mem_bytes[u], self.distance(u))))

    def materialize(self, v: int) -> None:
        deps, pins, wanted = self.problem.deps, self.pins, self.wanted
        path: list[tuple[int, int]] = [(v, 0)]  # (node, index of its next input to secure)
        for u in deps[v]:
            wanted[u] += 1
        while path:
            x, i = path[-1]
            if i < len(deps[x]):
                path[-1] = (x, i + 1)
                u = deps[x][i]
                if u in self.resident:
                    pins[u] += 1
                    continue
                if not self.problem.recomputable[u]:
                    raise _Stuck("a non-recomputable input was evicted")
                path.append((u, 0))
                for w in deps[u]:
                    wanted[w] += 1
                continue
            self.make_room(x)  # held bytes from the first computation: the live set's
            self.compute(x)
            path.pop()
            for u in deps[x]:
                pins[u] -= 1
                wanted[u] -= 1
                if (not pins[u] and not wanted[u] and u in self.resident
                        and self.distance(u) > self.problem.n):
                    self.release(u)  # read by nothing left: free at once
            if path:
                pins[x] += 1  # secured for its caller

    def compute(self, x: int) -> None:
        self.actions.append(compute(self.problem.node_ids[x]))
        self.computed += 1
        if self.computed > self.max_computations:  # thrashing: cascades without end
            raise _Stuck("too many recomputations")
        if self.computed % 64 == 0 and time.perf_counter() > self.deadline:
            raise _Stuck("out of time")
        self.resident.add(x)
        self.live.compute(self.problem.node_ids[x])


def best_dtr(problem: RematProblem, *, time_limit_s: float = 10.0) -> list[Action] | None:
    """The cheapest plan within budget over the scoring variants (simulator-exact memory); each
    variant stops at the time limit (then it gives no plan)."""
    from planner.solvers.remat.intervals import plan_peak_and_cost

    started = time.perf_counter()
    deadline = started + time_limit_s
    best: tuple[float, list[Action]] | None = None
    for plan_fn, score in product((dtr_depth_first_plan, dtr_plan), SCORES.values()):
        if time.perf_counter() > deadline:
            break
        actions = plan_fn(problem, score, deadline)
        if actions is None:
            continue
        peak, c = plan_peak_and_cost(problem, actions)
        if peak <= problem.budget_bytes and (best is None or c < best[0]):
            best = (c, actions)
    return best[1] if best else None
