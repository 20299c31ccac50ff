"""Plan polishing (solvers/remat/polish.py): keep a value instead of computing it again where the
memory profile allows; never invalid, never over budget, never dearer, same first order."""

from __future__ import annotations

import math

from planner.core.graph import Graph
from planner.core.plan import Action, plan_nodes
from planner.core.synthetic import random_dag, training_graph
from planner.sim.simulator import simulate
from planner.solvers.baselines import chen_sqrt, recompute_all, store_all_peak_bytes
from planner.solvers.remat.auto import solve_auto
from planner.solvers.remat.polish import keep_instead_of_recompute


def _cases() -> list[tuple[Graph, list[Action]]]:
    out = []
    for seed in range(6):
        for g in (training_graph(12 + seed, skip=3, seed=seed), random_dag(14, seed=seed)):
            out += [(g, recompute_all(g)), (g, chen_sqrt(g))]
    return out


def test_polished_plans_are_valid_within_budget_and_never_dearer() -> None:
    changed = 0
    for g, actions in _cases():
        plain = simulate(g, actions)
        full = store_all_peak_bytes(g)
        for budget in sorted({plain.peak_bytes, max(plain.peak_bytes, full),
                              math.ceil(1.3 * plain.peak_bytes)}):
            out = keep_instead_of_recompute(g, actions, budget)
            sim = simulate(g, out.actions)  # raises on an invalid plan
            assert sim.peak_bytes <= budget
            assert math.isclose(sim.compute_cost, out.compute_cost)
            assert sim.compute_cost <= plain.compute_cost
            assert plan_nodes(out.actions) == plan_nodes(actions)
            if out.changed:
                changed += 1
                assert sim.compute_cost < plain.compute_cost
                assert sim.computations < plain.computations
            else:
                assert out.actions is actions
    assert changed >= 10


def test_with_room_for_everything_recompute_all_becomes_every_node_once() -> None:
    g = training_graph(20, skip=3, seed=4)
    actions = recompute_all(g)
    budget = max(store_all_peak_bytes(g), simulate(g, actions).peak_bytes)
    out = keep_instead_of_recompute(g, actions, budget)
    assert out.changed
    assert math.isclose(out.compute_cost, g.total_compute_ms)


def test_auto_offers_the_polished_plan_on_large_graphs() -> None:
    g = training_graph(200, skip=3, seed=1)  # 401 nodes: over the exact searches' size
    budget = math.ceil(0.5 * store_all_peak_bytes(g))
    r = solve_auto(g, budget, time_limit_s=4.0, threads=1)
    assert r.actions is not None and r.cost is not None
    sim = simulate(g, r.actions)
    assert sim.peak_bytes <= budget and math.isclose(sim.compute_cost, r.cost)
    assert r.source.endswith("+kept")  # the chain DP's and greedy's plans both leave slack
