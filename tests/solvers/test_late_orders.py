"""Peak-directed reordering (solvers/remat/late_orders.py) and its place in auto's portfolio."""

from __future__ import annotations

import math
import random
import time

import pytest

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.core.synthetic import random_layered_dag
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all, store_all_peak_bytes
from planner.solvers.order import respects_order_rule
from planner.solvers.remat.late_orders import OrderSearch, kicked, lowered_order
from planner.solvers.remat.orders import candidate_orders, with_order
from planner.solvers.remat.portfolio import run_portfolio
from planner.solvers.remat.problem import problem_from_graph


def _topological(graph_edges: list[tuple[int, int]], order: list[int]) -> bool:
    at = {v: k for k, v in enumerate(order)}
    return all(at[u] < at[v] for u, v in graph_edges)


@pytest.mark.slow
def test_lowered_order_is_valid_and_its_store_all_peak_lower() -> None:
    g = random_layered_dag(400, seed=1)
    orders = candidate_orders(g)
    lowest = min(store_all_peak_bytes(with_order(g, o)) for o in orders.values())
    target = math.ceil(0.5 * store_all_peak_bytes(g))  # out of reach: the search runs out
    order, peak = lowered_order(g, orders["given"], target, time.perf_counter() + 30,
                                iterate=False)
    assert sorted(order) == sorted(n.id for n in g.nodes)
    assert _topological([(e.source, e.target) for e in g.edges], order)
    assert respects_order_rule(g.index, order)
    assert simulate(with_order(g, order), _store_all(g, order)).peak_bytes == peak
    assert peak < 0.98 * lowest  # lower than every list scheduler's order


def test_search_accounting_matches_the_simulator_and_kicks_stay_valid() -> None:
    g = random_layered_dag(120, seed=2)
    problem = problem_from_graph(g, 0)
    search = OrderSearch(g, problem)
    seq = kicked(search, list(range(problem.n)), random.Random(0), 200)
    order = [problem.node_ids[i] for i in seq]
    assert _topological([(e.source, e.target) for e in g.edges], order)
    stages, _, _ = search.stage_bytes(seq)
    assert max(stages) == simulate(g, _store_all(g, order)).peak_bytes


def test_portfolio_fits_cheaper_through_a_lowered_order() -> None:
    g = random_layered_dag(400, seed=1)
    budget = math.ceil(0.7 * store_all_peak_bytes(g))
    offered: list[tuple[float, str]] = []

    def offer(actions: list[Action] | None, source: str) -> bool:
        if actions is None:
            return False
        sim = simulate(g, actions)
        if sim.peak_bytes <= budget:
            offered.append((sim.compute_cost, source))
        return False

    run_portfolio(g, budget, offer, time.perf_counter() + 8)
    lowered = [c for c, s in offered if "lowered" in s]
    others = [c for c, s in offered if "lowered" not in s]
    assert lowered, offered
    assert not others or min(lowered) < min(others)


def _store_all(g: Graph, order: list[int]) -> list[Action]:
    return store_all(with_order(g, order))


def test_moves_judged_on_their_span_match_the_whole_order() -> None:
    from planner.core.synthetic import training_graph
    from planner.solvers.remat.order_eval import OrderState

    for g in (random_layered_dag(150, seed=3), training_graph(25, skip=3, seed=2)):
        problem = problem_from_graph(g, 0)
        search = OrderSearch(g, problem)
        target = int(0.8 * max(search.stage_bytes(list(range(problem.n)))[0]))
        state = OrderState(problem, list(range(problem.n)), target)
        rng = random.Random(1)
        for _ in range(400):
            seq = state.order
            at = {v: k for k, v in enumerate(seq)}
            src = rng.randrange(problem.n)
            v = seq[src]
            low = max((at[u] for u in search.before[v]), default=-1) + 1
            high = min((at[w] for w in search.after[v]), default=problem.n) - 1
            move = state.try_move(src, rng.randint(low, high))
            if move is None:
                continue
            moved = seq[:src] + seq[src + 1:]
            moved.insert(move.dst, v)
            assert move.score == search.score(moved, target)
            if rng.random() < 0.5:
                state.commit(move)
                assert state.order == moved
                assert state.stages.tolist() == search.stage_bytes(moved)[0]
                assert state.score == search.score(moved, target)
        order = [problem.node_ids[i] for i in state.order]
        assert _topological([(e.source, e.target) for e in g.edges], order)
        assert respects_order_rule(g.index, order)


@pytest.mark.slow
def test_large_graphs_lower_their_own_order_first() -> None:
    g = random_layered_dag(5000, seed=0)  # at 0.9 the lowered given order's store-all fits
    budget = math.ceil(0.9 * store_all_peak_bytes(g))
    started = time.perf_counter()
    offered: list[tuple[str, float, float]] = []

    def offer(actions: list[Action] | None, source: str) -> bool:
        if actions is None:
            return False
        sim = simulate(g, actions)
        offered.append((source, sim.compute_cost, time.perf_counter() - started))
        return sim.peak_bytes <= budget

    fitted = run_portfolio(g, budget, offer, started + 40)
    assert [s for s, _, _ in offered] == ["store-all@lowered@given"]
    assert math.isclose(offered[0][1], g.total_compute_ms)  # every node once: optimal
    assert offered[0][2] < 15.0  # about 1.5 s alone, however loaded the machine
    assert fitted and fitted[0][1].peak_bytes <= budget
