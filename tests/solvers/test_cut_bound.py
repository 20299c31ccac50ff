"""The cut bound: never above the true optimum (brute force over every schedule, any order),
non-trivial where activations cross the loss, and a proof of infeasibility only when no plan
fits."""

from __future__ import annotations

import math

import pytest
from remat_bruteforce import brute_force_cost
from test_remat_milp import CASES, budgets, varied_dag

from planner.core.graph import Edge, Graph, Node
from planner.core.synthetic import training_graph
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.remat.auto import solve_auto
from planner.solvers.remat.cut_bound import cut_lower_bound
from planner.solvers.remat.problem import problem_from_graph


def every_cut(graph: Graph, budget: int):  # type: ignore[no-untyped-def]
    return cut_lower_bound(graph, budget, candidates=[n.id for n in graph.nodes],
                           max_cuts=len(graph.nodes))


MORE_CASES = [(seed, b) for seed in range(12, 60) for b in budgets(varied_dag(seed))]


def test_never_above_the_optimum_of_any_schedule_on_tiny_dags() -> None:
    raised = 0
    for seed, budget in CASES + MORE_CASES:
        g = varied_dag(seed)
        optimum = brute_force_cost(problem_from_graph(g, budget), frontier=False)
        cut = every_cut(g, budget)
        where = f"seed {seed}, budget {budget}"
        if cut.infeasible:
            assert optimum is None, where
            continue
        if optimum is None:
            continue
        total = math.fsum(n.compute_ms for n in g.nodes)
        assert total + cut.extra_ms <= optimum * (1 + 1e-9), where
        raised += cut.extra_ms > 0
    assert raised >= 10  # the bound says something on these DAGs, not only "every node once"


@pytest.mark.parametrize("layers", [3, 4])
def test_training_chains_bound_is_sound_and_tight_enough(layers: int) -> None:
    g = training_graph(layers, seed=layers)
    total = math.fsum(n.compute_ms for n in g.nodes)
    least, most = lower_bound_peak_bytes(g), store_all_peak_bytes(g)
    gains = []
    for budget in sorted({least, (least + most) // 2, (least + 3 * most) // 4, most}):
        optimum = brute_force_cost(problem_from_graph(g, budget), frontier=False)
        cut = every_cut(g, budget)
        assert optimum is not None and not cut.infeasible
        assert total + cut.extra_ms <= optimum * (1 + 1e-9), budget
        gains.append(cut.extra_ms / max(optimum - total, 1e-12) if optimum > total else 1.0)
    assert max(gains) > 0.3  # below store-all the loss cut forces real recomputation


def test_views_share_storage_and_forced_values_prove_infeasibility() -> None:
    # 0 -> 1 (a view of 0) -> loss 2 -> 3 reads 0, 1 and 2. Storage of 0 counted once.
    nodes = [Node(id=0, compute_ms=5.0, output_bytes=100),
             Node(id=1, compute_ms=0.0, output_bytes=0, alias_of=0),
             Node(id=2, compute_ms=1.0, output_bytes=10),
             Node(id=3, compute_ms=1.0, output_bytes=10)]
    edges = [Edge(source=0, target=1), Edge(source=1, target=2), Edge(source=0, target=3),
             Edge(source=1, target=3), Edge(source=2, target=3)]
    g = Graph(nodes=nodes, edges=edges)
    fits = every_cut(g, 120)
    assert not fits.infeasible and fits.extra_ms == 0.0  # 0 and its view fit together
    g2 = Graph(nodes=[n.model_copy(update={"recomputable": n.id != 0}) for n in nodes],
               edges=edges)
    # at 2's computation 0 (not recomputable) and its view are resident with 2: 110 bytes
    proof = every_cut(g2, 109)
    assert proof.infeasible and proof.cut_node is not None and "109" in proof.reason
    assert brute_force_cost(problem_from_graph(g2, 109), frontier=False) is None


def test_auto_reports_the_cut_bound_and_stays_above_it() -> None:
    g = training_graph(12, seed=1)
    budget = math.ceil(0.7 * store_all_peak_bytes(g))
    r = solve_auto(g, budget, time_limit_s=3.0, threads=1)
    assert r.actions is not None and r.cost is not None
    cut = cut_lower_bound(g, budget)
    total = math.fsum(n.compute_ms for n in g.nodes)
    assert cut.extra_ms > 0
    assert r.bound >= total + cut.extra_ms * (1 - 1e-9)
    assert simulate(g, r.actions).compute_cost >= r.bound * (1 - 1e-9)
