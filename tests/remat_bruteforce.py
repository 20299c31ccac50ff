"""Brute-force optimal rematerialization for tiny graphs (test helper, not a test module)."""

from __future__ import annotations

import heapq
import itertools

from planner.solvers.remat.problem import RematProblem


def brute_force_cost(problem: RematProblem, *, frontier: bool) -> float | None:
    """Least compute cost of any schedule of compute/free actions within the budget.

    Dijkstra over states (resident set, computed set); frees cost nothing. frontier=True
    restricts to the schedules Checkmate's frontier-advancing stages express: first
    computations follow the topological order and the recomputations between two of them
    ascend, each at most once. Returns None when no schedule fits.
    """
    n, mem, ws, deps = problem.n, problem.mem_bytes, problem.workspace_bytes, problem.deps
    budget, fixed = problem.budget_bytes, problem.fixed_bytes
    # State: (resident bitmask, number of nodes computed so far (frontier) or computed bitmask,
    # last position computed in the current stage (frontier only)).
    start = (0, 0, -1)
    best = {start: 0.0}
    tie = itertools.count()
    heap = [(0.0, next(tie), start)]
    full = (1 << n) - 1
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best.get(state, float("inf")):
            continue
        resident, done, last = state
        if (frontier and done == n) or (not frontier and done == full):
            return cost
        live = fixed + sum(mem[i] for i in range(n) if resident >> i & 1)
        moves = []
        for i in range(n):
            if resident >> i & 1:
                moves.append((0.0, (resident & ~(1 << i), done, last)))
        for k in range(n):
            if resident >> k & 1 or any(not resident >> i & 1 for i in deps[k]):
                continue
            if live + mem[k] + ws[k] > budget:
                continue
            if frontier:
                if k == done:
                    nxt = (resident | 1 << k, done + 1, -1)
                elif k < done and k > last and problem.recomputable[k]:
                    nxt = (resident | 1 << k, done, k)
                else:
                    continue
            else:
                if done >> k & 1 and not problem.recomputable[k]:
                    continue
                nxt = (resident | 1 << k, done | 1 << k, -1)
            moves.append((problem.cost[k], nxt))
        for c, nxt in moves:
            if cost + c < best.get(nxt, float("inf")) - 1e-12:
                best[nxt] = cost + c
                heapq.heappush(heap, (cost + c, next(tie), nxt))
    return None


def brute_force_min_peak(problem: RematProblem) -> int:
    """The least budget for which a frontier-advancing schedule exists (bisection)."""
    lo = problem.fixed_bytes
    hi = problem.fixed_bytes + sum(problem.mem_bytes) + max(problem.workspace_bytes)
    while lo < hi:
        mid = (lo + hi) // 2
        if brute_force_cost(problem.with_budget(mid), frontier=True) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo
