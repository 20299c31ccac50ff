"""Dynamic eviction (in the spirit of DTR, Kirisame et al. 2021): a feasible plan for any DAG.

Run the nodes in topological order; before a node runs, recompute its missing ancestors in
ascending order; when memory would exceed the budget, evict the unpinned resident value with the
lowest cost / (bytes × distance to its next use). Values no later node reads are freed at once.
Several scoring variants are tried and the cheapest plan within budget is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.plan import Action, compute, free
from solvers.remat.problem import RematProblem

Score = Callable[[float, int, int], float]  # (cost, bytes, distance to next use) -> keep value

SCORES: dict[str, Score] = {
    "cost/(bytes*dist)": lambda c, b, d: c / (b * d),
    "cost/bytes": lambda c, b, d: c / b,
    "1/dist": lambda c, b, d: 1.0 / d,
    "cost/(bytes*dist^2)": lambda c, b, d: c / (b * d * d),
}


class _Stuck(Exception):
    pass


def dtr_plan(problem: RematProblem, score: Score) -> list[Action] | None:
    n, deps, users = problem.n, problem.deps, problem.users
    mem, ws, cost = problem.mem_bytes, problem.workspace_bytes, problem.cost
    budget = problem.budget_bytes
    ids = problem.node_ids
    actions: list[Action] = []
    resident: set[int] = set()
    live = problem.fixed_bytes
    frontier = 0  # nodes with position < frontier have run at least once

    def next_use(u: int) -> int | None:
        for j in users[u]:
            if j >= frontier:
                return j
        return None

    def evict(needed: int, pinned: set[int], soft: set[int]) -> None:
        """Free values until `needed` more bytes fit; never `pinned` (inputs of the node about
        to run), `soft` (inputs its callers still need) only when nothing else is left."""
        nonlocal live
        while live + needed > budget:
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
            live -= mem[best]
            actions.append(free(ids[best]))

    def run(v: int) -> None:
        """Make v resident: recompute its missing ancestors in ascending order (as the frontier
        scheduler does), pinning only what the rest of this batch still reads; evict others."""
        nonlocal live
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
        for x in sorted(needed):
            pinned = {u for u, k in uses_left.items() if k > 0 and u in resident}
            evict(mem[x] + ws[x], pinned, set())
            actions.append(compute(ids[x]))
            resident.add(x)
            live += mem[x]
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
                    live -= mem[u]
                    actions.append(free(ids[u]))
    except _Stuck:
        return None
    return actions


def best_dtr(problem: RematProblem, *, time_limit_s: float = 10.0) -> list[Action] | None:
    """The cheapest plan within budget over the scoring variants (simulator-exact memory)."""
    from solvers.remat.intervals import plan_peak_and_cost

    started = time.perf_counter()
    best: tuple[float, list[Action]] | None = None
    for score in SCORES.values():
        if time.perf_counter() - started > time_limit_s:
            break
        actions = dtr_plan(problem, score)
        if actions is None:
            continue
        peak, c = plan_peak_and_cost(problem, actions)
        if peak <= problem.budget_bytes and (best is None or c < best[0]):
            best = (c, actions)
    return best[1] if best else None
