"""The simulator: peaks computed by hand, an independent recount on random DAGs, every error."""

from __future__ import annotations

import networkx as nx
import pytest
from conftest import make_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.core.graph import Edge, FixedMemory, Graph, Node
from planner.core.plan import (
    Action,
    ActionOp,
    Plan,
    PlanStatus,
    actions_from_text,
    compute,
    drop,
    free,
    offload,
)
from planner.core.resources import Link, Resources
from planner.sim.copy_streams import simulate_streams
from planner.sim.simulator import PlanError, lower_bound_peak_bytes, simulate
from planner.solvers.baselines import store_all


def acts(text: str) -> list[Action]:
    return actions_from_text(text)


# -- peaks by hand ------------------------------------------------------------------------------


def test_chain_peak_includes_workspace_and_fixed(chain3: Graph) -> None:
    # C0: 100+10=110; C1: 100+10+20 +50 ws=180; F0: 120; C2: 100+20+30=150; F1: 130; F2: 100
    sim = simulate(chain3, acts("C0 C1 F0 C2 F1 F2"))
    assert sim.peak_bytes == 180
    assert sim.peak_action_index == 1
    assert sim.fixed_bytes == 100
    assert [p.live_bytes for p in sim.timeline] == [110, 180, 120, 150, 130, 100]
    assert [p.action for p in sim.timeline] == ["C0", "C1", "F0", "C2", "F1", "F2"]
    assert list(sim.live_bytes) == [110, 180, 120, 150, 130, 100]
    points = tuple(sim.timeline)  # made when read: the same points as a tuple, indexable
    assert sim.timeline == points and hash(sim.timeline) == hash(points)
    assert sim.timeline[-1] == points[-1] and sim.timeline[1:3] == points[1:3]
    assert sim.compute_cost == 6.0
    assert sim.overhead == 0.0
    assert sim.recomputations == 0


def test_workspace_is_transient(chain3: Graph) -> None:
    # Workspace of node 1 is counted while it runs only: without it the peak would be at C2.
    no_ws = make_graph({0: 10, 1: 20, 2: 30}, [(0, 1), (1, 2)], fixed_bytes=100)
    assert simulate(no_ws, acts("C0 C1 F0 C2 F1 F2")).peak_bytes == 150
    assert simulate(no_ws, acts("C0 C1 F0 C2 F1 F2")).peak_action_index == 3


def test_freeing_late_raises_the_peak(chain3: Graph) -> None:
    # Keeping 0 until the end: C2 sees 100 + 10 + 20 + 30 = 160 (< 180 at C1 with workspace).
    sim = simulate(chain3, acts("C0 C1 C2 F0 F1 F2"))
    assert [p.live_bytes for p in sim.timeline] == [110, 180, 160, 150, 130, 100]


def test_recomputation_costs_time_not_memory() -> None:
    # 0 -> 1 -> 2, 0 -> 2; free 0 early and recompute it for 2.
    g = make_graph({0: 40, 1: 10, 2: 5}, [(0, 1), (1, 2), (0, 2)], costs={0: 4, 1: 1, 2: 1})
    kept = simulate(g, acts("C0 C1 C2 F0 F1 F2"))
    assert kept.peak_bytes == 55
    remat = simulate(g, acts("C0 C1 F0 C0 C2 F0 F1 F2"))
    # C1: 40+10=50; F0: 10; C0: 50; C2: 55
    assert remat.peak_bytes == 55
    assert remat.compute_cost == 10.0
    assert remat.recomputations == 1
    assert remat.overhead == pytest.approx(4 / 6)


def test_views_cost_nothing_and_keep_their_base_alive() -> None:
    # 1 is a view of 0 (100 bytes declared, but it shares 0's storage); 2 reads the view.
    g = make_graph({0: 100, 1: 100, 2: 10}, [(0, 1), (1, 2)], alias_of={1: 0})
    sim = simulate(g, acts("C0 C1 F0 C2 F1 F2"))
    # C0: 100; C1: 100 (no new storage); F0: 100 (the view holds it); C2: 110; F1: 10; F2: 0
    assert [p.live_bytes for p in sim.timeline] == [100, 100, 100, 110, 10, 0]
    assert sim.peak_bytes == 110


def test_view_of_a_view_shares_the_root_storage() -> None:
    g = make_graph({0: 64, 1: 64, 2: 64, 3: 1}, [(0, 1), (1, 2), (2, 3)], alias_of={1: 0, 2: 1})
    sim = simulate(g, acts("C0 C1 C2 F0 F1 C3 F2 F3"))
    assert [p.live_bytes for p in sim.timeline] == [64, 64, 64, 64, 64, 65, 1, 0]


def test_recomputing_a_base_while_its_view_is_resident_adds_nothing() -> None:
    g = make_graph({0: 100, 1: 100, 2: 10}, [(0, 1), (1, 2), (0, 2)], alias_of={1: 0})
    sim = simulate(g, acts("C0 C1 F0 C0 C2 F0 F1 F2"))
    assert sim.peak_bytes == 110
    assert sim.recomputations == 1


def test_fixed_memory_counts_every_part() -> None:
    fixed = FixedMemory(
        parameters_bytes=1, gradients_bytes=2, optimizer_bytes=4, inputs_bytes=8, other_bytes=16
    )
    g = Graph(nodes=[Node(id=0, output_bytes=100)], fixed=fixed)
    sim = simulate(g, acts("C0 F0"))
    assert sim.peak_bytes == 131
    assert [p.live_bytes for p in sim.timeline] == [131, 31]


def test_lower_bound_is_the_largest_working_set() -> None:
    # Node 2 needs 0 and 1 resident plus its own output and workspace: 10 + 20 + 5 + 7.
    g = make_graph(
        {0: 10, 1: 20, 2: 5, 3: 30},
        [(0, 2), (1, 2), (2, 3)],
        fixed_bytes=1000,
        workspace_bytes={2: 7},
    )
    assert lower_bound_peak_bytes(g) == 1000 + max(10, 20, 10 + 20 + 5 + 7, 5 + 30)
    # A view adds no storage of its own to the working set.
    view = make_graph({0: 50, 1: 50, 2: 1}, [(0, 1), (1, 2)], alias_of={1: 0})
    assert lower_bound_peak_bytes(view) == 51


def test_plan_object_is_checked_like_actions(chain3: Graph) -> None:
    plan = Plan(
        graph_hash=chain3.content_hash(),
        method="hand",
        status=PlanStatus.feasible,
        actions=acts("C0 C1 F0 C2 F1 F2"),
    )
    assert simulate(chain3, plan).peak_bytes == 180


# -- invalid plans ------------------------------------------------------------------------------


def raises_at(graph: Graph, plan: list[Action] | Plan, index: int | None, node: int | None) -> str:
    with pytest.raises(PlanError) as info:
        simulate(graph, plan)
    assert info.value.action_index == index
    assert info.value.node == node
    return str(info.value)


def test_using_a_freed_value_names_the_action_and_the_free(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C0 F0 C1"), 2, 1)
    assert "action 2" in msg and "freed at action 1" in msg and "node 0 (n0)" in msg


def test_input_never_computed(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C1"), 0, 1)
    assert "never computed" in msg and "node 1 (n1)" in msg


def test_double_free(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C0 F0 F0"), 2, 0)
    assert "already freed at action 1" in msg


def test_free_of_never_computed(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("F2"), 0, 2)
    assert "never computed" in msg and "node 2 (n2)" in msg


def test_unknown_node(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C0 C99"), 1, 99)
    assert "node 99 is not in the graph" in msg


def test_node_never_computed(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C0 C1 F0"), 3, 2)
    assert "never computes node 2 (n2)" in msg


def test_many_nodes_never_computed_are_summarised() -> None:
    g = make_graph({i: 1 for i in range(6)}, [])
    msg = raises_at(g, acts("C0"), 1, 1)
    assert "and 2 more" in msg


def test_computing_a_resident_node(chain3: Graph) -> None:
    msg = raises_at(chain3, acts("C0 C0"), 1, 0)
    assert "already resident" in msg


def test_non_recomputable_node_computed_twice() -> None:
    g = make_graph({0: 1, 1: 1}, [(0, 1)], recomputable={0: False})
    msg = raises_at(g, acts("C0 F0 C0 C1"), 2, 0)
    assert "not recomputable" in msg
    # Recomputing a recomputable node is fine.
    g2 = make_graph({0: 1, 1: 1}, [(0, 1)])
    assert simulate(g2, acts("C0 F0 C0 C1")).recomputations == 1


def test_plan_for_another_graph_is_rejected(chain3: Graph) -> None:
    other = make_graph({0: 10, 1: 20, 2: 31}, [(0, 1), (1, 2)])
    plan = Plan(
        graph_hash=other.content_hash(),
        method="hand",
        status=PlanStatus.feasible,
        actions=acts("C0 C1 F0 C2 F1 F2"),
    )
    msg = raises_at(chain3, plan, None, None)
    assert "not this graph" in msg
    assert simulate(chain3, plan, check_hash=False).peak_bytes == 180


# -- property tests on random DAGs --------------------------------------------------------------


@st.composite
def random_graphs(draw: st.DrawFn, max_nodes: int = 12, workspace: bool = True) -> Graph:
    """A DAG whose ids are a random permutation of its topological positions."""
    n = draw(st.integers(1, max_nodes))
    ids = draw(st.permutations(range(n)))
    sizes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    ws = draw(st.lists(st.integers(0, 20) if workspace else st.just(0), min_size=n, max_size=n))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    chosen = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    nodes = [
        Node(id=ids[i], name=f"v{ids[i]}", compute_ms=1.0 + i, output_bytes=sizes[i],
             workspace_bytes=ws[i])
        for i in range(n)
    ]
    nodes = draw(st.permutations(nodes))  # file order differs from topological order
    edges = [
        Edge(source=ids[i], target=ids[j])
        for (i, j), c in zip(pairs, chosen, strict=True)
        if c
    ]
    give_order = draw(st.booleans())
    return Graph(
        nodes=list(nodes),
        edges=edges,
        order=[ids[i] for i in range(n)] if give_order else None,
        fixed=FixedMemory(parameters_bytes=draw(st.integers(0, 100))),
    )


def published_store_all_peak(graph: Graph) -> int:
    """The published definition, recounted from scratch: when node k is computed, memory holds
    its output (and workspace) plus the output of every earlier-computed node that still has a
    consumer at step k or later, plus fixed memory."""
    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in graph.nodes)
    g.add_edges_from((e.source, e.target) for e in graph.edges)
    order = list(graph.order) if graph.order is not None else list(nx.topological_sort(g))
    pos = {v: k for k, v in enumerate(order)}
    size = {n.id: n.output_bytes for n in graph.nodes}
    ws = {n.id: n.workspace_bytes for n in graph.nodes}
    fixed = graph.fixed.parameters_bytes
    peak = fixed
    for k, v in enumerate(order):
        live = sum(
            size[u] for u in order[:k] if any(pos[w] >= k for w in g.successors(u))
        )
        peak = max(peak, fixed + live + size[v] + ws[v])
    return peak


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_store_all_peak_matches_the_published_definition(graph: Graph) -> None:
    actions = store_all(graph)
    sim = simulate(graph, actions)
    assert sim.peak_bytes == published_store_all_peak(graph)
    assert sim.recomputations == 0 and sim.overhead == 0.0
    computed = [a.node for a in actions if a.op is ActionOp.compute]
    assert computed == graph.index.topological_order
    assert sim.peak_bytes >= lower_bound_peak_bytes(graph)
    assert sim.peak_bytes == max(p.live_bytes for p in sim.timeline)


@settings(max_examples=100, deadline=None)
@given(random_graphs(), st.data())
def test_plan_using_a_freed_value_is_rejected_with_its_index(
    graph: Graph, data: st.DataObject
) -> None:
    actions = store_all(graph)
    succs = graph.index.successors
    with_consumers = [v for v in graph.index.topological_order if succs[v]]
    if not with_consumers:
        return
    u = data.draw(st.sampled_from(with_consumers))
    pos = {a.node: i for i, a in enumerate(actions) if a.op is ActionOp.compute}
    last = max(succs[u], key=pos.__getitem__)
    j = pos[last]
    f = actions.index(free(u))
    assert f > j  # store-all frees u only after its last consumer
    bad = actions[:j] + [free(u)] + actions[j:f] + actions[f + 1 :]
    with pytest.raises(PlanError) as info:
        simulate(graph, bad)
    assert info.value.action_index == j + 1
    assert info.value.node == last
    assert f"freed at action {j}" in str(info.value)


@settings(max_examples=100, deadline=None)
@given(random_graphs(workspace=False), st.integers(0, 10**6))
def test_fixed_memory_shifts_every_point(graph: Graph, extra: int) -> None:
    actions = store_all(graph)
    base = simulate(graph, actions)
    shifted_graph = graph.model_copy(
        update={"fixed": FixedMemory(parameters_bytes=graph.fixed.parameters_bytes + extra)}
    )
    shifted = simulate(shifted_graph, actions)
    assert shifted.peak_bytes == base.peak_bytes + extra
    assert [p.live_bytes - extra for p in shifted.timeline] == [p.live_bytes for p in base.timeline]


def test_compute_helpers_round_trip_text() -> None:
    actions = [compute(3), compute(10), free(3), free(10)]
    assert " ".join(str(a) for a in actions) == "C3 C10 F3 F10"
    assert actions_from_text("C3 C10 F3 F10") == actions
    with pytest.raises(ValueError, match="action 1"):
        actions_from_text("C3 X4")


# -- the event simulation agrees with the one-stream replay -------------------------------------


@settings(max_examples=100, deadline=None)
@given(random_graphs())
def test_event_simulation_of_compute_free_plans_is_the_replay(graph: Graph) -> None:
    actions = store_all(graph)
    replay = simulate(graph, actions)
    events = simulate_streams(graph, actions, None)
    assert (events.peak_bytes, events.peak_action_index) == (
        replay.peak_bytes, replay.peak_action_index
    )
    assert events.timeline == replay.timeline
    assert events.compute_cost == replay.compute_cost == events.makespan_ms


@settings(max_examples=100, deadline=None)
@given(random_graphs())
def test_instant_offloads_of_everything_keep_the_device_figures(graph: Graph) -> None:
    """O right after each compute, D at the end, on a link too fast to matter: the device sees
    the store-all figures and the host holds every output once."""
    fast = Link(bandwidth_bytes_per_s=1e300)
    resources = Resources(host_memory_bytes=10**9, h2d=fast, d2h=fast)
    base = store_all(graph)
    with_copies: list[Action] = []
    for a in base:
        with_copies.append(a)
        if a.op is ActionOp.compute:
            with_copies.append(offload(a.node))
    with_copies += [drop(v) for v in graph.index.topological_order]
    sim = simulate(graph, with_copies, resources)
    replay = simulate(graph, base)
    assert sim.peak_bytes == replay.peak_bytes
    assert sim.host_peak_bytes == sum(n.output_bytes for n in graph.nodes)
    assert [p.live_bytes for p in sim.timeline if p.action[0] in "CF"] == [
        p.live_bytes for p in replay.timeline
    ]
    assert sim.exposed_transfer_ms == 0.0
    assert sim.makespan_ms == pytest.approx(replay.compute_cost)
