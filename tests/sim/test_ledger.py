"""The memory ledger (planner.sim.ledger): its replays are the simulator's, its incremental live
set is its replay, and its view relaxation is never below the simulator's figure."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_graphs import graphs, has_views, random_schedule, random_valid_plan

from planner.core.graph import Edge, FixedMemory, Graph, Node, Phase
from planner.core.model_state import ModelState, ParameterState
from planner.core.plan import Action, ActionOp, compute, free
from planner.core.synthetic import random_layered_dag
from planner.sim.ledger import MemoryLedger, ViewRule, resident_after
from planner.sim.simulator import PlanError, simulate
from planner.solvers.baselines import chen_sqrt, recompute_all, store_all
from planner.solvers.remat.problem import problem_from_graph

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plans(graph: Graph, seed: int) -> list[list[Action]]:
    return [store_all(graph), recompute_all(graph), chen_sqrt(graph),
            random_valid_plan(graph, random.Random(seed))]


# -- the replay is the simulator's -----------------------------------------------------------
@FAST
@given(graphs, st.integers(0, 10**6))
def test_replay_is_the_simulators(graph: Graph, seed: int) -> None:
    ledger = MemoryLedger.of(graph)
    for actions in plans(graph, seed):
        sim = simulate(graph, actions)
        for check in (True, False):
            r = ledger.replay(actions, check=check, timeline=True)
            assert r.peak_bytes == sim.peak_bytes
            assert r.peak_action_index == sim.peak_action_index
            assert r.compute_cost == sim.compute_cost
            assert r.computations == sim.computations
            assert r.fixed_bytes == sim.fixed_bytes
            assert r.live_bytes == list(sim.live_bytes)
            if r.peak_action_index >= 0:
                assert r.peak_node == actions[r.peak_action_index].node


@FAST
@given(graphs, st.integers(0, 10**6))
def test_charging_views_their_base_is_never_below_and_exact_without_views(
    graph: Graph, seed: int
) -> None:
    ledger = MemoryLedger.of(graph)
    problem = problem_from_graph(graph, 0)
    for actions in plans(graph, seed):
        shared = ledger.replay(actions, check=False)
        charged = ledger.replay(actions, views=ViewRule.charge_base, check=False)
        assert charged.peak_bytes >= shared.peak_bytes
        if not has_views(graph):
            assert charged.peak_bytes == shared.peak_bytes
        # the remat problem's ledger (position form) gives the graph ledger's charged figures
        figures = problem.replay(actions)
        assert (figures.peak_bytes, figures.compute_cost) == (charged.peak_bytes,
                                                              charged.compute_cost)


@FAST
@given(graphs, st.integers(0, 10**6))
def test_staged_schedules_replay_as_simulated(graph: Graph, seed: int) -> None:
    problem = problem_from_graph(graph, 10**12)
    from planner.solvers.remat.problem import staged_actions

    actions, peak = staged_actions(problem, random_schedule(problem, random.Random(seed)))
    assert peak == problem.replay(actions).peak_bytes
    assert MemoryLedger.of(graph).replay(actions).peak_bytes == simulate(graph, actions).peak_bytes


# -- the incremental live set ----------------------------------------------------------------
@FAST
@given(graphs, st.integers(0, 10**6), st.sampled_from(tuple(ViewRule)))
def test_live_set_is_the_replay(graph: Graph, seed: int, views: ViewRule) -> None:
    ledger = MemoryLedger.of(graph)
    for actions in plans(graph, seed):
        live = ledger.live_set(views)
        timeline = []
        for a in actions:
            if a.op is ActionOp.compute:
                would = live.peak_if_computed(a.node)
                assert live.compute(a.node) == would
                timeline.append(would)
            else:
                timeline.append(live.free(a.node))
        r = ledger.replay(actions, views=views, check=False, timeline=True)
        assert (live.peak_bytes, live.peak_node) == (r.peak_bytes, r.peak_node)
        assert live.compute_cost == r.compute_cost
        assert timeline == r.live_bytes
        resident: set[int] = set()
        for a in actions:
            (resident.add if a.op is ActionOp.compute else resident.discard)(a.node)
        assert live.resident == resident


# -- the rules, on hand-made graphs ----------------------------------------------------------
def view_graph() -> Graph:
    """0 -> 1 (a view of 0) -> 2; 0 is 100 bytes, 2 is 10, 2 has 5 bytes of workspace."""
    nodes = [
        Node(id=0, name="a", output_bytes=100, compute_ms=1.0),
        Node(id=1, name="v", output_bytes=100, alias_of=0, compute_ms=2.0),
        Node(id=2, name="b", output_bytes=10, workspace_bytes=5, compute_ms=3.0),
    ]
    return Graph(nodes=nodes, edges=[Edge(source=0, target=1), Edge(source=1, target=2)],
                 fixed=FixedMemory(inputs_bytes=7))


def test_a_view_adds_nothing_but_keeps_its_base_alive() -> None:
    graph = view_graph()
    ledger = MemoryLedger.of(graph)
    actions = [compute(0), compute(1), free(0), compute(2), free(1), free(2)]
    r = ledger.replay(actions, timeline=True)
    # the base's 100 bytes stay while the view is resident, though the base was freed
    assert r.live_bytes == [107, 107, 107, 122, 17, 7]
    assert (r.peak_bytes, r.peak_action_index, r.peak_node) == (122, 3, 2)
    assert r.compute_cost == 6.0
    charged = ledger.replay(actions, views=ViewRule.charge_base, check=False, timeline=True)
    assert charged.live_bytes == [107, 207, 107, 122, 17, 7]
    assert simulate(graph, actions).peak_bytes == 122


def grad_graph(lifetime: str) -> Graph:
    """forward 0 -> loss 1 -> backward 2 (the gradient of parameter p, 40 bytes)."""
    nodes = [
        Node(id=0, name="f", phase=Phase.forward, output_bytes=30, compute_ms=1.0),
        Node(id=1, name="loss", phase=Phase.loss, output_bytes=4, compute_ms=1.0),
        Node(id=2, name="g", phase=Phase.backward, output_bytes=40, compute_ms=1.0),
    ]
    ms = ModelState(parameters=[ParameterState(name="p", bytes=40, gradient_node=2)],
                    gradient_lifetime=lifetime)  # type: ignore[arg-type]
    return Graph(nodes=nodes, edges=[Edge(source=0, target=1), Edge(source=1, target=2),
                                     Edge(source=0, target=2)], model_state=ms)


@pytest.mark.parametrize("lifetime", ["backward", "step"])
def test_gradient_bytes_are_held_from_the_first_computation(lifetime: str) -> None:
    graph = grad_graph(lifetime)
    ledger = MemoryLedger.of(graph)
    actions = store_all(graph)
    r = ledger.replay(actions, timeline=True)
    sim = simulate(graph, actions)
    assert (r.peak_bytes, r.live_bytes) == (sim.peak_bytes, list(sim.live_bytes))
    if lifetime == "backward":
        assert ledger.held_bytes == {2: 40}
        assert ledger.storage_bytes[2] == 0  # the output is the held .grad: counted once
        # held from node 2's first computation to the end of the step
        assert r.live_bytes is not None and r.live_bytes[-1] == ledger.fixed_bytes + 40
    else:
        assert not ledger.held_bytes


def test_checked_replay_raises_the_simulators_errors() -> None:
    graph = view_graph()
    ledger = MemoryLedger.of(graph)
    with pytest.raises(PlanError, match="input .* is not resident: it was never computed"):
        ledger.replay([compute(1)])
    with pytest.raises(PlanError, match="already resident"):
        ledger.replay([compute(0), compute(0)])
    with pytest.raises(PlanError, match="never computes"):
        ledger.replay([compute(0), free(0)])
    with pytest.raises(ValueError):
        ledger.replay([compute(0)], views=ViewRule.charge_base)


def test_built_once_per_graph() -> None:
    graph = random_layered_dag(200, seed=1)
    assert MemoryLedger.of(graph) is MemoryLedger.of(graph)
    actions = recompute_all(graph)
    sim = simulate(graph, actions)
    r = MemoryLedger.of(graph).replay(actions, check=False)
    assert (r.peak_bytes, r.compute_cost, r.peak_action_index) == (
        sim.peak_bytes, sim.compute_cost, sim.peak_action_index)


@FAST
@given(graphs, st.integers(0, 10**6))
def test_resident_sets_and_their_bytes_are_the_replays(graph: Graph, seed: int) -> None:
    """The runtime's resident sets (`resident_after`) priced by `resident_bytes` give the
    replay's timeline: each storage once, held bytes from the first computation on."""
    ledger = MemoryLedger.of(graph)
    for actions in plans(graph, seed):
        r = ledger.replay(actions, timeline=True)
        assert r.live_bytes is not None
        seen: set[int] = set()
        for a, resident, live in zip(actions, resident_after(actions), r.live_bytes,
                                     strict=True):
            seen.add(a.node)
            during = ledger.workspace_bytes[a.node] if a.op is ActionOp.compute else 0
            assert ledger.resident_bytes(resident, seen) + during == live


def test_own_storage_profiles_count_each_value_alone() -> None:
    """The chain linearization's relative profile: a view adds nothing and keeps nothing alive;
    no fixed or held bytes."""
    graph = view_graph()
    live = MemoryLedger.of(graph).live_set(ViewRule.own_storage, start_bytes=0, held=False)
    assert [live.compute(0), live.compute(1), live.free(0), live.compute(2)] == [100, 100, 0, 15]
    assert (live.peak_bytes, live.live_bytes) == (100, 10)


@FAST
@given(graphs, st.integers(0, 10**6))
def test_storage_facts_are_the_simulators(graph: Graph, seed: int) -> None:
    """`is_view` is alias_of resolved; `storages_bytes` is `resident_bytes` without fixed and
    held bytes; `transient_bytes` plus first-time held bytes is what a store-all computation
    adds while it runs (the pipeline stages' transient)."""
    ledger = MemoryLedger.of(graph)
    rng = random.Random(seed)
    for n in graph.nodes:
        assert ledger.is_view(n.id) == (n.alias_of is not None)
    some = [v for v in ledger.node_ids if rng.random() < 0.5]
    assert ledger.storages_bytes(some) == ledger.resident_bytes(some) - ledger.fixed_bytes
    assert ledger.storages_bytes([]) == 0
    actions = store_all(graph)
    before = ledger.fixed_bytes
    for a, point in zip(actions, simulate(graph, actions).timeline, strict=True):
        if a.op is ActionOp.compute:
            added = ledger.transient_bytes(a.node) + ledger.held_bytes.get(a.node, 0)
            assert point.live_bytes - before == added
        before = point.live_bytes - (
            ledger.workspace_bytes[a.node] if a.op is ActionOp.compute else 0)


# -- the remat solvers' stage arithmetic (RematProblem.stage_bytes) is the ledger's -------------
@FAST
@given(graphs, st.integers(0, 10**6))
def test_stage_bytes_are_the_problems_ledger(graph: Graph, seed: int) -> None:
    from planner.solvers.remat.checkpoints import CheckpointPlan
    from planner.solvers.remat.order_eval import OrderState
    from planner.solvers.remat.retention import RetentionPlan

    rng = random.Random(seed)
    problem = problem_from_graph(graph, 10**12)
    n = problem.n
    # checkpoint sets (Checkmate's stages, a value kept until its last reader)
    plan = CheckpointPlan(problem, [rng.random() < 0.5 for _ in range(n)])
    figures = problem.replay(plan.actions())
    assert (plan.peak_bytes, plan.total_cost) == (figures.peak_bytes, figures.compute_cost)
    # retention (stages run ascending, depth-first or as a tree)
    retention = RetentionPlan(problem)
    for _ in range(6):
        trial = retention.trial(rng.randrange(n))
        if trial is not None:
            retention.commit(trial)
    assert retention.peak_bytes == problem.replay(retention.actions()).peak_bytes
    # store-all in another topological order (each value freed after its last reader)
    order: list[int] = []
    indegree = [len(set(d)) for d in problem.deps]
    ready = [v for v in range(n) if not indegree[v]]
    while ready:
        v = ready.pop(rng.randrange(len(ready)))
        order.append(v)
        for w in problem.users[v]:
            indegree[w] -= 1
            if not indegree[w]:
                ready.append(w)
    state = OrderState(problem, order, 0)
    at = {v: k for k, v in enumerate(order)}
    actions: list[Action] = []
    for k, v in enumerate(order):
        actions.append(compute(problem.node_ids[v]))
        for u in sorted({*problem.deps[v], v}):
            if max((at[w] for w in problem.users[u]), default=at[u]) == k:
                actions.append(free(problem.node_ids[u]))
    assert state.score[0] == problem.replay(actions).peak_bytes
