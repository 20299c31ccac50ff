"""Greedy eviction: start from store-all and drop checkpoints until the budget fits.

Each step tries the checkpoints resident at the current peak and drops the one that lowers the
peak at the least extra compute per byte saved. Fast, always simulator-checked, and a good
first plan and hint for the exact solvers.
"""

from __future__ import annotations

import time

from planner.graph import Graph
from planner.plan import Action
from planner.simulator import SimulationResult, simulate
from solvers.baselines import checkpoint_schedule
from solvers.order import schedule_order


def _live_at_peak(graph: Graph, actions: list[Action], sim: SimulationResult) -> set[int]:
    resident: set[int] = set()
    for a in actions[: sim.peak_action_index + 1]:
        if a.op.value == "compute":
            resident.add(a.node)
        else:
            resident.discard(a.node)
    return resident


def greedy_eviction(
    graph: Graph, budget_bytes: int, *, time_limit_s: float = 10.0, max_candidates: int = 40
) -> list[Action] | None:
    """A plan within budget from greedy checkpoint removal, or None when it gets stuck."""
    started = time.perf_counter()
    kept = set(schedule_order(graph))
    actions = checkpoint_schedule(graph, kept)
    sim = simulate(graph, actions)
    while sim.peak_bytes > budget_bytes:
        if time.perf_counter() - started > time_limit_s:
            return None
        candidates = [v for v in _live_at_peak(graph, actions, sim) if v in kept]
        candidates.sort(key=lambda v: -graph.index.storage_bytes[v])
        best: tuple[float, set[int], list[Action], SimulationResult] | None = None
        for v in candidates[:max_candidates]:
            trial = kept - {v}
            trial_actions = checkpoint_schedule(graph, trial)
            trial_sim = simulate(graph, trial_actions)
            saved = sim.peak_bytes - trial_sim.peak_bytes
            extra = trial_sim.compute_cost - sim.compute_cost
            if saved < 0:
                continue
            # Removals that keep the peak unchanged may unlock later ones; they rank last.
            score = max(extra, 0.0) / saved if saved > 0 else 1e300 + extra
            if best is None or score < best[0]:
                best = (score, trial, trial_actions, trial_sim)
        if best is None:
            return None
        _, kept, actions, sim = best
    return improve(graph, budget_bytes, kept, actions, sim, started + time_limit_s)


def improve(graph: Graph, budget_bytes: int, kept: set[int], actions: list[Action],
            sim: SimulationResult, deadline: float) -> list[Action]:
    """Local search: add back dropped checkpoints (or swap one in for one out) while the plan
    stays within budget and gets cheaper."""
    dropped = [v for v in schedule_order(graph) if v not in kept]
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for v in sorted(dropped, key=lambda u: -graph.index.node(u).compute_ms):
            if time.perf_counter() > deadline:
                break
            for trial in (kept | {v}, *((kept | {v}) - {w} for w in kept if w != v)):
                if time.perf_counter() > deadline:
                    break
                trial_actions = checkpoint_schedule(graph, trial)
                trial_sim = simulate(graph, trial_actions)
                if (trial_sim.peak_bytes <= budget_bytes
                        and trial_sim.compute_cost < sim.compute_cost - 1e-12):
                    kept, actions, sim = set(trial), trial_actions, trial_sim
                    dropped = [u for u in schedule_order(graph) if u not in kept]
                    improved = True
                    break
            if improved:
                break
    return actions
