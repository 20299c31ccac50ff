"""The peak lower bound counts what is held at each node's first computation (weight gradients
of its ancestors), and orders that compute held nodes late: a GPT-shaped graph with tied
embeddings (tests/held_graphs.py), the structure of a traced GPT-2 where 75 % of store-all took
46 s to be proven infeasible and 90 % found no plan for 20 s."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from held_graphs import tied_training_graph
from random_graphs import random_valid_plan

from planner.core.graph import Edge, Graph, Node, reachable
from planner.core.synthetic import training_graph
from planner.sim.ledger import MemoryLedger
from planner.sim.lower_bound import must_resident_bytes
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import chen_sqrt, recompute_all, store_all, store_all_peak_bytes
from planner.solvers.order import schedule_order
from planner.solvers.remat.auto import solve_auto
from planner.solvers.remat.held_orders import held_last_order
from planner.solvers.remat.orders import with_order


def _random_order(graph: Graph, rng: random.Random) -> list[int]:
    preds = graph.index.order_predecessors
    waiting = {v: len(us) for v, us in preds.items()}
    ready = sorted(v for v, k in waiting.items() if k == 0)
    out: list[int] = []
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        out.append(v)
        for w, us in preds.items():
            if v in us:
                waiting[w] -= 1
                if waiting[w] == 0:
                    ready.append(w)
    return out


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_the_bound_is_what_each_node_needs_with_its_ancestors_held(layers: int) -> None:
    graph = tied_training_graph(layers)
    ledger = MemoryLedger.of(graph)
    preds = graph.index.order_predecessors
    for v in ledger.node_ids:
        held = sum(ledger.held_bytes.get(u, 0) for u in reachable(v, preds))  # v included
        expected = ledger.fixed_bytes + held + ledger.working_set_bytes(v)
        assert must_resident_bytes(graph)[v] == expected
    working = graph.fixed_bytes + max(ledger.working_set_bytes(v) for v in ledger.node_ids)
    # the last node adds the two halves of the tied gradient, both layers' gradients aside
    assert lower_bound_peak_bytes(graph) > working


def test_no_plan_peaks_below_the_bound_in_any_order() -> None:
    graph = tied_training_graph(3)
    bound = lower_bound_peak_bytes(graph)
    rng = random.Random(0)
    plans = [store_all(graph), recompute_all(graph), chen_sqrt(graph)]
    for _ in range(30):
        plans.append(random_valid_plan(with_order(graph, _random_order(graph, rng)), rng))
    peaks = [simulate(graph, actions).peak_bytes for actions in plans]
    assert min(peaks) >= bound


def test_without_held_bytes_the_bound_is_the_working_set_one() -> None:
    graph = training_graph(6, skip=2, seed=3, fixed_bytes=1000)
    ledger = MemoryLedger.of(graph)
    assert not ledger.held_bytes
    assert lower_bound_peak_bytes(graph) == 1000 + max(
        ledger.working_set_bytes(v) for v in ledger.node_ids)
    assert held_last_order(graph, schedule_order(graph)) is None


def test_auto_proves_infeasible_below_the_bound_at_once() -> None:
    graph = tied_training_graph(4)
    bound = lower_bound_peak_bytes(graph)
    r = solve_auto(graph, bound - 1, time_limit_s=5.0)
    assert r.proven_infeasible and r.actions is None
    assert "hold to the end of the step" in r.notes[0]
    assert r.timings == {}  # decided before any search ran


def test_held_last_order_is_topological_and_lowers_store_all() -> None:
    graph = tied_training_graph(4)
    given = schedule_order(graph)
    late = held_last_order(graph, given)
    assert late is not None and sorted(late) == sorted(given)
    pos = {v: i for i, v in enumerate(late)}
    preds = graph.index.order_predecessors
    assert all(pos[u] < pos[v] for v in late for u in preds[v])
    assert store_all_peak_bytes(with_order(graph, late)) < store_all_peak_bytes(graph)


def test_auto_fits_store_all_in_the_held_last_order() -> None:
    # below store-all in every list-scheduled order, where nothing can be evicted at the last
    # node; computing the layers' weight gradients after it fits with every node once
    graph = tied_training_graph(4)
    late = held_last_order(graph, schedule_order(graph))
    assert late is not None
    budget = store_all_peak_bytes(with_order(graph, late))
    assert budget < store_all_peak_bytes(graph)
    r = solve_auto(graph, budget, time_limit_s=10.0)
    assert r.actions is not None and r.proven_optimal
    sim = simulate(graph, r.actions)
    assert sim.peak_bytes <= budget
    assert sim.compute_cost == pytest.approx(graph.total_compute_ms)


def test_auto_proves_infeasible_by_a_cut_before_any_search() -> None:
    # 0 (not recomputable) is read by 3 after 1 and 2: at 2's computation it is resident with
    # 1 and 2 (200 bytes), more than any node's inputs and output (160 at 3)
    nodes = [Node(id=0, compute_ms=1.0, output_bytes=100, recomputable=False),
             Node(id=1, compute_ms=1.0, output_bytes=50),
             Node(id=2, compute_ms=1.0, output_bytes=50),
             Node(id=3, compute_ms=1.0, output_bytes=10)]
    edges = [Edge(source=0, target=1), Edge(source=1, target=2), Edge(source=2, target=3),
             Edge(source=0, target=3)]
    graph = Graph(nodes=nodes, edges=edges)
    assert lower_bound_peak_bytes(graph) == 160
    r = solve_auto(graph, 180, time_limit_s=5.0)
    assert r.proven_infeasible and r.actions is None
    assert "must be resident" in r.notes[0]
    assert "first_phase_s" not in r.timings  # decided before the first phase
    assert solve_auto(graph, 200, time_limit_s=5.0).actions is not None


def test_info_says_where_the_bound_is_and_its_share_of_store_all(tmp_path: Path) -> None:
    from planner.cli.graph_cmds import graph_info

    graph = tied_training_graph(4)
    path = tmp_path / "graph.json"
    path.write_text(graph.model_dump_json())
    info = graph_info(path)
    assert info["lower_bound_peak_bytes"] == lower_bound_peak_bytes(graph)
    assert info["lower_bound_at"] == "node 19 (tied_grad_sum)"  # the last node
    assert info["lower_bound_of_store_all"] == round(
        lower_bound_peak_bytes(graph) / store_all_peak_bytes(graph), 4)


def test_every_holder_is_resident_when_the_last_one_runs() -> None:
    """A traced GPT: its weight gradients lie in separate branches (no node has them all as
    ancestors), yet every plan holds them all once the last is computed; the bound counts that
    (0.67 of store-all on a 12-layer GPT, where recompute-all peaks at 0.68)."""
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(layers=2, vocab=64)
    graph = trace(model, inputs).graph
    ledger = MemoryLedger.of(graph)
    held = {v: b for v, b in ledger.held_bytes.items() if b > 0}
    assert len(held) > 1
    at_end = ledger.fixed_bytes + sum(held.values()) + min(
        ledger.working_set_bytes(v) for v in held)
    assert at_end > max(must_resident_bytes(graph).values())  # the ancestors' sum misses it
    bound = lower_bound_peak_bytes(graph)
    assert bound == at_end
    rng = random.Random(1)
    plans = [store_all(graph), recompute_all(graph), chen_sqrt(graph)]
    for _ in range(20):
        plans.append(random_valid_plan(with_order(graph, _random_order(graph, rng)), rng))
    assert min(simulate(graph, actions).peak_bytes for actions in plans) >= bound


def test_the_least_known_budget_counts_store_all_with_held_nodes_last() -> None:
    """An infeasible budget is told the smallest budget known to work: store-all with the held
    nodes computed last beats every baseline on a tied GPT-shaped graph."""
    from planner.engine.deadline import least_baseline
    from planner.solvers.baselines import bounded_baselines

    graph = tied_training_graph(3)
    least = least_baseline(graph)
    assert least is not None and least.name == "store-all@held-last"
    assert least.peak_bytes < min(simulate(graph, actions).peak_bytes
                                  for _, actions in bounded_baselines(graph, None))
    assert simulate(graph, least.actions).peak_bytes == least.peak_bytes
    assert least.peak_bytes >= lower_bound_peak_bytes(graph)
