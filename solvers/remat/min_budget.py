"""The least budget for which a plan exists: the least peak of the plans found, with a bound.

1. The baselines and store-all in memory-aware orders (held nodes computed late among them,
   `held_orders`): cheap plans whose peaks start the search.
2. On small graphs (≤ MILP_MAX_NODES) the Checkmate MILP whose objective is the peak, within
   MILP_SHARE of the limit: it proves the least peak among frontier-advancing schedules.
3. A bisection between the lower bound and the least peak found, each probe `auto` at the
   middle budget: the least budget `solve` can find is what min-budget must not exceed (a traced
   GPT-2 with 367 nodes: the MILP overran its 20 s and store-all's 811 MiB was the answer, where
   `solve --budget 90%` finds a 730 MiB plan).
Every plan found goes to the `Incumbent`, which a caller that gives up on the search at its
time limit reads (the least peak so far, never a worse one).
The lower bound is `lower_bound_peak_bytes` (what must be resident at some node's first
computation, in any plan), raised by budgets `auto` proves infeasible and, where the MILP ran,
by its bound (then it covers frontier-advancing schedules only, as the CLI says unless proven).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import bounded_baselines
from planner.solvers.remat.backends import solve_linear
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.held_orders import held_last_order
from planner.solvers.remat.milp import build_checkmate
from planner.solvers.remat.orders import candidate_orders, with_order
from planner.solvers.remat.problem import problem_from_graph, staged_actions, staged_from_actions

__all__ = ["MILP_MAX_NODES", "Incumbent", "MinBudget", "min_budget"]

MILP_MAX_NODES = 150  # above: no peak MILP (its O(n²) binaries take the whole limit at 367)
MILP_SHARE = 0.5  # of the limit, at most, for the MILP; the bisection gets the rest
PROBE_MIN_S = 1.0  # a bisection probe gets at least this long (auto's first plans: < 1 s)
RESOLUTION = 1 / 256  # the bisection stops when the interval is this fraction of the peak


@dataclass(frozen=True)
class MinBudget:
    peak_bytes: int  # the least peak of a plan found (that plan fits this budget)
    lower_bound_bytes: int  # no plan peaks lower (see the module text)
    proven: bool  # peak_bytes == lower_bound_bytes
    actions: list[Action]
    method: str
    wall_seconds: float


class Incumbent:
    """The least-peak plan found so far; safe to read from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.peak_bytes: int | None = None
        self.actions: list[Action] | None = None
        self.method = ""

    def offer(self, actions: list[Action], peak_bytes: int, method: str) -> bool:
        with self._lock:
            if self.peak_bytes is not None and peak_bytes >= self.peak_bytes:
                return False
            self.peak_bytes, self.actions, self.method = peak_bytes, actions, method
            return True

    def best(self) -> tuple[int, list[Action], str] | None:
        with self._lock:
            if self.peak_bytes is None or self.actions is None:
                return None
            return self.peak_bytes, self.actions, self.method


def min_budget(graph: Graph, *, backend: str = "cpsat", time_limit_s: float = 30.0,
               threads: int = 2, seed: int = 0, incumbent: Incumbent | None = None
               ) -> MinBudget:
    started = time.perf_counter()
    deadline = started + time_limit_s
    found = incumbent if incumbent is not None else Incumbent()
    _cheap_plans(graph, found, deadline)
    lower = lower_bound_peak_bytes(graph)
    best = found.best()
    assert best is not None  # store-all always finishes
    if best[0] > lower and len(graph.nodes) <= MILP_MAX_NODES:
        lower = max(lower, _peak_milp(graph, found, backend, threads, seed,
                                      started + MILP_SHARE * time_limit_s))
    lower = _bisect(graph, found, lower, threads, seed, deadline)
    peak, actions, method = found.best() or best
    lower = min(lower, peak)
    return MinBudget(peak, lower, peak <= lower, actions, method,
                     time.perf_counter() - started)


def _cheap_plans(graph: Graph, found: Incumbent, deadline: float) -> None:
    """The baselines (store-all first), then store-all in memory-aware orders."""
    for name, actions in bounded_baselines(graph, None, deadline=deadline):
        found.offer(actions, simulate(graph, actions).peak_bytes, f"baseline:{name}")
    orders = candidate_orders(graph)
    for name, order in list(orders.items()):
        late = held_last_order(graph, order)
        if late is not None:
            orders[f"held-last@{name}"] = late
    for name, order in orders.items():
        if time.perf_counter() > deadline:
            return
        plan = CheckpointPlan(problem_from_graph(with_order(graph, order), 0))
        if (seen := found.best()) is None or plan.peak_bytes < seen[0]:
            actions = plan.actions()
            found.offer(actions, simulate(graph, actions).peak_bytes, f"store-all@{name}")


def _peak_milp(graph: Graph, found: Incumbent, backend: str, threads: int, seed: int,
               until: float) -> int:
    """The Checkmate MILP minimising the peak, hinted with the best plan; its bound (bytes;
    frontier-advancing schedules only), 0 when it has none."""
    best = found.best()
    assert best is not None
    problem = problem_from_graph(graph, best[0])
    milp = build_checkmate(problem, minimise_peak=True)
    hint_sched = staged_from_actions(problem, best[1])
    hint = milp.hint(hint_sched) if hint_sched is not None else None
    if hint is not None:
        hint[milp.model.num_vars - 1] = float(problem.budget_units)
    raw = solve_linear(milp.model, backend, time_limit_s=max(0.5, until - time.perf_counter()),
                       threads=threads, seed=seed, hint=hint)
    if raw.values is not None:
        actions, _ = staged_actions(problem, milp.schedule(raw.values))
        found.offer(actions, simulate(graph, actions).peak_bytes, f"milp:{backend}")
    if raw.bound is None:
        return 0
    return math.ceil(raw.bound - 1e-6) * problem.memory_unit


def _bisect(graph: Graph, found: Incumbent, lower: int, threads: int, seed: int,
            deadline: float) -> int:
    """Probes with `auto` between `lower` and the least peak found, while time is left; the
    lower bound raised by the budgets auto proves infeasible (returned)."""
    from planner.solvers.remat.auto import solve_auto

    low = lower  # no probe below this: proven (lower) or where auto found nothing
    while (best := found.best()) is not None:
        high = best[0]
        if high - low <= max(1, int(RESOLUTION * high)):
            break
        left = deadline - time.perf_counter()
        probes = max(1, math.ceil(math.log2((high - low) / max(1.0, RESOLUTION * high))))
        probe_s = max(PROBE_MIN_S, left / probes)
        if left < PROBE_MIN_S:
            break
        mid = (low + high) // 2
        # auto's limit less a tenth: it may finish its last step past the limit
        r = solve_auto(graph, mid, time_limit_s=0.9 * min(probe_s, left), threads=threads,
                       seed=seed)
        if r.actions is not None:
            peak = simulate(graph, r.actions).peak_bytes
            found.offer(r.actions, peak, f"auto at {mid} B")
            if peak > mid:  # never (auto's plans fit): no progress, so stop
                break
        else:
            low = mid + 1
            lower = max(lower, mid + 1) if r.proven_infeasible else lower
    return lower
