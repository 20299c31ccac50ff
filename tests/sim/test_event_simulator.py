"""The event simulator: version-1 figures unchanged, offload timelines and pipelines computed by
hand, and every error naming its step, rank and node."""

from __future__ import annotations

import math
import random
import re

import pytest
from conftest import make_graph

from planner.core.graph import Edge, Graph, ModelState, Node, ParameterState, Phase
from planner.core.pipeline_actions import Partition, PipelineStage, rank_actions_from_text
from planner.core.plan import Action, ActionOp, Plan, PlanStatus, actions_from_text
from planner.core.resources import Link, Resources
from planner.core.synthetic import random_dag, training_graph
from planner.sim.copy_streams import simulate_streams
from planner.sim.free_placement import place_frees
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.simulator import PlanError, SimulationResult, simulate
from planner.sim.stage_costs import stage_of_nodes
from planner.sim.step_memory import step_memory
from planner.solvers.baselines import chen_sqrt, recompute_all, store_all

# -- version 1: exactly the old figures ---------------------------------------------------------


def reference_v1(graph: Graph, actions: list[Action]) -> tuple[int, int, float, list[int]]:
    """The version-1 simulator's accounting (git 7d9daa9), for valid plans: peak, its action,
    cost and the timeline."""
    index = graph.index
    root = {v: index.storage_root(v) for v in index.position}
    live = graph.fixed_bytes
    peak, at = live, -1
    refs: dict[int, int] = {}
    cost: list[float] = []
    points: list[int] = []
    for i, a in enumerate(actions):
        r = root[a.node]
        if a.op is ActionOp.compute:
            refs[r] = refs.get(r, 0) + 1
            live += index.storage_bytes[r] if refs[r] == 1 else 0
            during = live + index.node(a.node).workspace_bytes
            cost.append(index.node(a.node).compute_ms)
            if during > peak:
                peak, at = during, i
            points.append(during)
        else:
            refs[r] -= 1
            live -= index.storage_bytes[r] if refs[r] == 0 else 0
            points.append(live)
    return peak, at, math.fsum(cost), points


def random_remat_plan(graph: Graph, rng: random.Random) -> list[Action]:
    """Store-all, but some values are freed after a consumer and recomputed before the next."""
    plan = store_all(graph)
    for _ in range(3):
        computed = [i for i, a in enumerate(plan) if a.op is ActionOp.compute]
        i = rng.choice(computed)
        v = plan[i].node
        users = [j for j, a in enumerate(plan) if a.op is ActionOp.compute and a.node in
                 graph.index.successors[v] and j > i]
        if len(users) < 2 or graph.index.predecessors[v]:
            continue  # recompute sources only: their inputs are always there
        first, second = users[0], users[1]
        plan = (plan[: first + 1] + [Action(op=ActionOp.free, node=v),
                                     Action(op=ActionOp.compute, node=v)] + plan[first + 1 :])
        assert second > first
    return plan


def corpus() -> list[Graph]:
    graphs = [random_dag(n, seed=s, edge_probability=0.2) for n, s in [(8, 1), (15, 2), (30, 3)]]
    graphs += [training_graph(n, skip=k, seed=n, fixed_bytes=77) for n, k in [(5, 0), (12, 3)]]
    views = make_graph({0: 100, 1: 100, 2: 10, 3: 4}, [(0, 1), (1, 2), (0, 2), (2, 3)],
                       alias_of={1: 0}, workspace_bytes={2: 9}, fixed_bytes=5)
    return [*graphs, views]


@pytest.mark.parametrize("graph", corpus(), ids=lambda g: g.metadata.model_name or "views")
def test_compute_free_plans_give_the_version_1_figures(graph: Graph) -> None:
    rng = random.Random(len(graph.nodes))
    plans = [store_all(graph), recompute_all(graph), random_remat_plan(graph, rng)]
    if any(n.phase == Phase.loss for n in graph.nodes):
        plans.append(chen_sqrt(graph))
    for actions in plans:
        peak, at, cost, points = reference_v1(graph, actions)
        for sim in (simulate(graph, actions), simulate_streams(graph, actions, None)):
            assert (sim.peak_bytes, sim.peak_action_index, sim.compute_cost) == (peak, at, cost)
            assert [p.live_bytes for p in sim.timeline] == points
            assert [p.action for p in sim.timeline] == [str(a) for a in actions]
        fast = simulate(graph, actions)
        assert fast.makespan_ms == fast.compute_cost and not fast.event_simulated
        assert fast.predicted().makespan_ms is None  # version-1 figures only


# -- offload: a timeline by hand ----------------------------------------------------------------

# 0 (1000 B, 2 ms) ; 1 (10 B, 3 ms) ; 2 (800 B, 2 ms) reads 1 ; 3 (10 B, 1 ms) reads 0 and 2.
# One link: 1000 B at 1e6 B/s = 1 ms, plus 0.5 ms latency = 1.5 ms a copy.
def offload_graph() -> Graph:
    return make_graph({0: 1000, 1: 10, 2: 800, 3: 10}, [(1, 2), (0, 3), (2, 3)],
                      costs={0: 2.0, 1: 3.0, 2: 2.0, 3: 1.0})


LINK = Link(bandwidth_bytes_per_s=1e6, latency_s=0.5e-3)
HOST = Resources(host_memory_bytes=10_000, h2d=LINK, d2h=LINK)


def test_offload_timeline_by_hand() -> None:
    g = offload_graph()
    plan = actions_from_text("C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3 D0")
    sim = simulate(g, plan, HOST)
    # C0 [0,2]; O0 [2,3.5]; F0 is issued at 2 and releases at its issue, so the compute stream
    # first waits for the copy reading node 0: 1.5 ms exposed, C1 [3.5,6.5], C2 [6.5,8.5];
    # P0 issued at 8.5 -> [8.5,10]; C3 waits for it: [10,11], 1.5 ms more exposed.
    assert sim.makespan_ms == pytest.approx(11.0)
    assert sim.compute_ms == pytest.approx(8.0) and sim.compute_cost == pytest.approx(8.0)
    assert sim.transfer_ms == pytest.approx(3.0)
    assert sim.exposed_transfer_ms == pytest.approx(3.0)
    # memory moves in plan order: 1000 (C0), 0 (F0), 10, 810, 800 (F1), 1800 (P0 at its
    # issue), 1810 (C3), then the frees
    assert sim.peak_bytes == 1810 and sim.peak_action_index == 7
    assert sim.host_peak_bytes == 1000
    assert [p.live_bytes for p in sim.timeline] == [
        1000, 1000, 0, 10, 810, 800, 1800, 1810, 810, 10, 0, 0
    ]
    p = sim.predicted()
    assert (p.host_peak_bytes, p.makespan_ms, p.exposed_transfer_ms) == (1000, 11.0, 3.0)
    assert sim.memory_trace[-1].device_bytes == 0 and sim.memory_trace[-1].host_bytes == 0


def test_memory_moves_in_plan_order() -> None:
    """Every memory event is at its action's issue (or its compute's start): the trace's order
    is the plan's, as the CUDA allocator sees a program's allocations and frees."""
    g = offload_graph()
    for text in ("C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3 D0", "C0 O0 C1 F0 P0 C2 F1 C3 F0 F2 F3 D0"):
        trace = simulate(g, actions_from_text(text), HOST).memory_trace
        assert [m.action_index for m in trace] == sorted(m.action_index for m in trace)
        assert [m.time_ms for m in trace] == sorted(m.time_ms for m in trace)


def test_frees_are_placed_where_their_copies_end() -> None:
    g = offload_graph()
    placed, sim = place_frees(g, actions_from_text("C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3 D0"), HOST)
    # O0 ends at 3.5: C1 is issued at 2, before; C2 at 5, after: F0 goes between them
    assert " ".join(map(str, placed)) == "C0 O0 C1 F0 C2 F1 P0 C3 F0 F2 F3 D0"
    assert sim.makespan_ms == pytest.approx(9.5) and sim.exposed_transfer_ms == pytest.approx(1.5)
    assert [p.live_bytes for p in sim.timeline] == [
        1000, 1000, 1010, 10, 810, 800, 1800, 1810, 810, 10, 0, 0
    ]
    assert sim == simulate(g, placed, HOST)  # the placed plan simulates to the same figures
    # a held free never passes a use of its node: the prefetch comes first, the free waits
    placed, _ = place_frees(g, actions_from_text("C0 O0 F0 P0 C1 C2 F1 C3 F0 F2 F3 D0"), HOST)
    assert " ".join(map(str, placed)) == "C0 O0 F0 P0 C1 C2 F1 C3 F0 F2 F3 D0"
    # a plan without copies comes back as it is
    plain = actions_from_text("C0 C1 C2 F1 C3 F0 F2 F3")
    assert place_frees(g, plain, HOST)[0] == plain


def test_an_early_prefetch_hides_the_copy() -> None:
    g = offload_graph()
    # P0 issued after C1 (t=5) overlaps C2 [5,7]: ready at 6.5, C3 does not wait.
    sim = simulate(g, actions_from_text("C0 O0 C1 F0 P0 C2 F1 C3 F0 F2 F3 D0"), HOST)
    assert sim.exposed_transfer_ms == 0.0
    assert sim.makespan_ms == pytest.approx(8.0)
    # the prefetched copy is on the device while C2 runs: 10 + 1000 + 800
    assert sim.peak_bytes == 1810 and sim.peak_action_index == 5


def test_a_plan_object_uses_its_own_resources() -> None:
    g = offload_graph()
    plan = Plan(graph_hash=g.content_hash(), method="hand", status=PlanStatus.feasible,
                resources=HOST, actions=actions_from_text("C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3 D0"))
    assert simulate(g, plan).makespan_ms == pytest.approx(11.0)


# -- errors name step, rank and node ------------------------------------------------------------


def fails(graph: Graph, text: str, index: int | None, node: int | None,
          resources: Resources | None = HOST) -> str:
    with pytest.raises(PlanError) as info:
        simulate(graph, actions_from_text(text), resources)
    assert (info.value.action_index, info.value.node) == (index, node)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "index", "node", "message"),
    [
        ("C0 P0", 1, 0, "action 1 (P0): cannot prefetch node 0 (n0): it has no host copy: "
         "offload it (O0) first"),
        ("C0 O0 F0 D0 P0", 4, 0, "its host copy was dropped at action 3"),
        ("C0 O0 F0 C1 C2 C3", 5, 3, "action 5 (C3): input node 0 (n0) of node 3 (n3) is not "
         "resident: it is on the host only (offloaded at action 1): prefetch it (P0) first"),
        ("C0 F0 O0", 2, 0, "action 2 (O0): cannot offload node 0 (n0): it was freed at action 1"),
        ("O1", 0, 1, "cannot offload node 1 (n1): it was never computed"),
        ("C0 O0 O0", 2, 0, "already has a host copy (offloaded at action 1)"),
        ("C0 O0 P0", 2, 0, "node 0 (n0) is already on the device"),
        ("C0 D0", 1, 0, "cannot drop the host copy of node 0 (n0): it was never offloaded"),
        ("C0 O0 D0 D0", 3, 0, "it was already dropped at action 2"),
        ("C0 O0 F0 F0", 3, 0, "cannot free node 0 (n0): it is on the host only"),
        ("C0 O9", 1, 9, "node 9 is not in the graph"),
        ("C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3", 11, None, None),  # valid: ends without dropping
    ],
)
def test_offload_errors(text: str, index: int, node: int | None, message: str | None) -> None:
    g = offload_graph()
    if message is None:
        assert simulate(g, actions_from_text(text), HOST).host_peak_bytes == 1000
        return
    assert message in fails(g, text, index, node)


def test_host_overflow_names_the_offload() -> None:
    small = Resources(host_memory_bytes=999, h2d=LINK, d2h=LINK)
    msg = fails(offload_graph(), "C0 O0 F0 C1 C2 F1 P0 C3 F0 F2 F3 D0", 1, 0, small)
    assert msg == ("action 1 (O0): host memory overflows: 1000 bytes of host copies > "
                   "host_memory_bytes 999")


@pytest.mark.parametrize("resources", [None, Resources(device_memory_bytes=10**6)])
def test_offload_without_a_host_tier(resources: Resources | None) -> None:
    msg = fails(offload_graph(), "C0 O0", 1, 0, resources)
    assert "action 1 (O0): moving memory to the host needs resources with a host tier" in msg


def test_offloading_a_view_names_its_base() -> None:
    g = make_graph({0: 100, 1: 100}, [(0, 1)], alias_of={1: 0})
    assert "node 1 (n1) is a view of node 0 (n0): offload that" in fails(g, "C0 C1 O1", 2, 1)


def loss_graph() -> Graph:
    """0 forward -> 1 loss -> 3 backward; 2 is backward but needs no gradient (reads 0 only)."""
    nodes = [
        Node(id=0, name="mm", output_bytes=8, compute_ms=1.0),
        Node(id=1, name="loss", phase=Phase.loss, output_bytes=4, compute_ms=1.0),
        Node(id=2, name="sum_2", phase=Phase.backward, output_bytes=8, compute_ms=1.0),
        Node(id=3, name="mm_grad", phase=Phase.backward, output_bytes=8, compute_ms=1.0),
    ]
    edges = [(0, 1), (0, 2), (1, 3), (2, 3)]
    return Graph(nodes=nodes, edges=[Edge(source=u, target=v) for u, v in edges])


@pytest.mark.parametrize("host", [False, True])
def test_backward_ops_wait_for_the_loss(host: bool) -> None:
    g = loss_graph()
    extra = " O0" if host else ""
    msg = fails(g, "C0 C2 C1 C3" + extra, 1, 2)
    assert msg == ("action 1 (C2): node 2 (sum_2) is a backward op and may not run before the "
                   "loss, node 1 (loss), is computed")
    assert simulate(g, actions_from_text("C0 C1 C2 C3" + extra), HOST).peak_bytes == 28


def test_gradients_are_held_from_their_node() -> None:
    g = loss_graph().model_copy(update={"model_state": ModelState(
        parameters=[ParameterState(name="w", module_path="", bytes=100, gradient_node=3)],
        gradient_lifetime="backward",
    )})
    step = step_memory(g)
    assert step.start_bytes == 100 and dict(step.held_from_node) == {3: 100}
    actions = actions_from_text("C0 C1 C2 F0 C3 F1 F2 F3")
    for sim in (simulate(g, actions), simulate_streams(g, actions, None)):
        # 100 weights from the start; the gradient (100) from C3 to the end, whatever is freed
        assert [p.live_bytes for p in sim.timeline] == [108, 112, 120, 112, 220, 216, 208, 200]


# -- pipelines ----------------------------------------------------------------------------------


def pipe_graph() -> Graph:
    """Stage s0: a (1 ms); stage s1: b (1 ms), loss; backward gb (2 ms, s1), ga (2 ms, s0)."""
    nodes = [
        Node(id=0, name="a", compute_ms=1, output_bytes=10, module_path="s0"),
        Node(id=1, name="b", compute_ms=1, output_bytes=20, module_path="s1"),
        Node(id=2, name="loss", phase=Phase.loss, output_bytes=1, module_path="s1"),
        Node(id=3, name="gb", phase=Phase.backward, compute_ms=2, output_bytes=10,
             module_path="s1"),
        Node(id=4, name="ga", phase=Phase.backward, compute_ms=2, output_bytes=5,
             module_path="s0"),
    ]
    edges = [(0, 1), (1, 2), (2, 3), (0, 3), (1, 3), (3, 4), (0, 4)]
    return Graph(nodes=nodes, edges=[Edge(source=u, target=v) for u, v in edges])


PART = Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=["s0"]),
                         PipelineStage(stage_index=1, rank=1, modules=["s1"])])
ONE_MS = Resources(device_link=Link(bandwidth_bytes_per_s=10_000))  # 10 boundary bytes: 1 ms


def pipe(text: str, resources: Resources | None = None) -> SimulationResult:
    return simulate_pipeline(pipe_graph(), PART, rank_actions_from_text(text), resources)


def test_gpipe_by_hand() -> None:
    # f = 1, b = 2 per stage, m = 2: rank 0 F0 [0,1] F1 [1,2] B0 [5,7] B1 [7,9];
    # rank 1 F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]. Bubble (P-1)/(m+P-1) = 1/3.
    sim = pipe("0F0 0F1 0B0 0B1\n1F0 1F1 1B0 1B1")
    assert sim.makespan_ms == 9.0
    assert sim.bubble_fraction == pytest.approx(1 / 3)
    assert sim.throughput_per_s == pytest.approx(2 / 9e-3)
    assert [(r.busy_ms, r.end_ms) for r in sim.ranks] == [(6.0, 9.0), (6.0, 7.0)]
    # torch's receive buffers, one per micro-batch and stage: rank 0 the gradient of a (10 B),
    # rank 1 its input a (10 B). Rank 0 keeps a (10 B) per in-flight micro-batch, +5 transient
    # (ga's 5 B; the 10 B gradient it reads is in its receive buffer); rank 1 keeps b and the
    # loss (21 B) per micro-batch and the input gradient a B sends (10 B) from that B's start,
    # +10 transient (gb's output). GPipe: both micro-batches in flight at B0.
    assert [r.peak_bytes for r in sim.ranks] == [2 * 10 + 2 * 10 + 5, 2 * 10 + 2 * 21 + 10 + 10]
    assert sim.predicted().per_rank_peak_bytes == [45, 82]


def test_1f1b_by_hand() -> None:
    # m = 4. rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10] F3 [10,11] B3 [11,13]
    # rank 0: F0 [0,1] F1 [1,2] B0 [4,6] F2 [6,7] B1 [7,9] F3 [9,10] B2 [10,12] B3 [13,15]
    sim = pipe("0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3\n1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3")
    assert sim.makespan_ms == 15.0
    assert sim.bubble_fraction == pytest.approx(1 - 24 / 30)  # (P-1)/(m+P-1) = 1/5
    # 1F1B keeps at most P - s micro-batches' activations in flight (2 on rank 0, 1 on rank 1);
    # the receive buffers (4 micro-batches) and what a stage sends or its loss stay to the end;
    # rank 0's B reads the gradient in its receive buffer (no transient of its own for it)
    assert [r.peak_bytes for r in sim.ranks] == [85, 114]


def test_implied_transfers_over_the_device_link() -> None:
    # each boundary is 10 bytes: 1 ms. rank 1 F0 [2,3] F1 [3,4] B0 [4,6] B1 [6,8];
    # rank 0 B0 [7,9] B1 [9,11].
    sim = pipe("0F0 0F1 0B0 0B1\n1F0 1F1 1B0 1B1", ONE_MS)
    assert sim.makespan_ms == 11.0 and sim.transfer_ms == 4.0
    assert sim.bubble_fraction == pytest.approx(1 - 12 / 22)


def test_explicit_send_recv_by_hand() -> None:
    # rank 0 F0 [0,1], send -> arrives 2; rank 1 F0 [2,3] B0 [3,5], send -> 6; rank 0 B0 [6,8]
    sim = pipe("0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0", ONE_MS)
    assert sim.makespan_ms == 8.0 and sim.transfer_ms == 2.0
    assert sim.bubble_fraction == pytest.approx(1 - 6 / 16)


def pipe_fails(text: str, rank: int | None, index: int | None) -> str:
    with pytest.raises(PlanError) as info:
        pipe(text)
    assert (info.value.rank, info.value.action_index) == (rank, index)
    return str(info.value)


def test_deadlock_names_rank_and_action() -> None:
    msg = pipe_fails("0F0 0RECV_B0 0SEND_F0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0", 0, 1)
    assert msg.startswith(
        "deadlock: rank 0 waits at action 1 (0RECV_B0) for 1SEND_B0 on rank 1, which waits at "
        "action 0 (1RECV_F0); rank 1 waits at action 0 (1RECV_F0) for 0SEND_F0 on rank 0"
    )


def test_deadlock_without_explicit_communication() -> None:
    msg = pipe_fails("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0", 0, 1)
    assert msg.startswith("deadlock: rank 0 waits at action 1 (0B0) for 1B0 on rank 1, which "
                          "waits at action 0 (1F1)")


@pytest.mark.parametrize(
    ("text", "rank", "index", "message"),
    [
        ("0B0 0F0\n1F0 1B0", 0, 0, "rank 0, action 0 (0B0): needs the forward (0F0) earlier"),
        ("0F0 0F0 0B0\n1F0 1B0", 0, 1, "runs a second time (first at action 0)"),
        ("0F0 0B0\n1F0 1I0", 1, 2, "rank 1: stage 1 never completes the backward of micro-batch 0"),
        ("0F0 0SEND_F0 0B0\n1RECV_F0 1F0 1B0", 0, 2, "needs its gradient (0RECV_B0) earlier"),
        ("0F0 0SEND_F0 0SEND_F1\n1RECV_F0 1F0 1B0", 0, 2, "needs the forward (0F1) earlier"),
        ("0F0 0SEND_F0 0B0 0RECV_B0\n1RECV_F0 1F0 1B0 1SEND_B0", 0, 2, "needs its gradient"),
        ("0F0 0I0 0W0 0B0\n1F0 1B0", 0, 3, "mixes a full backward (B) with its split (I/W)"),
        ("0F0 0W0\n1F0 1B0", 0, 1, "needs the input-gradient backward (0I0) earlier"),
        ("0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0 1SEND_B0", 1, 4, "second time"),
    ],
)
def test_pipeline_errors(text: str, rank: int, index: int, message: str) -> None:
    assert message in pipe_fails(text, rank, index)


def test_waiting_for_what_never_runs_is_a_deadlock() -> None:
    msg = pipe_fails("0F0 0B0\n1F0", 0, 1)
    assert msg == ("deadlock: rank 0 waits at action 1 (0B0) for 1B0 on rank 1, which has no "
                   "such action")


def test_unreceived_send_is_an_error() -> None:
    one_rank = Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=["s0"]),
                                 PipelineStage(stage_index=1, rank=0, modules=["s1"])])
    rows = rank_actions_from_text("0F0 0SEND_F0 1F0 1B0 0B0")
    with pytest.raises(PlanError) as info:
        simulate_pipeline(pipe_graph(), one_rank, rows)
    assert str(info.value) == ("rank 0, action 1 (0SEND_F0): never received (no 1RECV_F0 on "
                               "rank 0)")
    assert (info.value.rank, info.value.action_index) == (0, 1)
    # one rank, two stages, no communication: 1 + 1 + 2 + 2 ms, never idle
    sim = simulate_pipeline(pipe_graph(), one_rank, rank_actions_from_text("0F0 1F0 1B0 0B0"))
    assert sim.makespan_ms == 6.0 and sim.bubble_fraction == 0.0


def test_a_forward_needs_its_recv_when_communication_is_explicit() -> None:
    msg = pipe_fails("0F0 0SEND_F0 0RECV_B0 0B0 0F1 0SEND_F1 0RECV_B1 0B1\n"
                     "1RECV_F0 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1", 1, 4)
    assert "needs its input (1RECV_F1) earlier" in msg


def test_split_backward_and_microbatch_count() -> None:
    # I and W split B half and half (no model_state): 1 ms each
    sim = pipe("0F0 0I0 0W0\n1F0 1I0 1W0")
    # rank 1: F [1,2] I [2,3] W [3,4]; rank 0: F [0,1], I waits for 1I0 (3) -> [3,4], W [4,5]
    assert sim.makespan_ms == 5.0
    with pytest.raises(PlanError, match=re.escape("resources.microbatches is 3 but the rank "
                                                  "actions run 1 micro-batches")):
        pipe("0F0 0B0\n1F0 1B0", Resources(microbatches=3))


def test_partition_places_unnamed_nodes_after_their_inputs() -> None:
    # the loss (no module) follows b onto stage 1; ga, moved out of s0, follows its gradient
    # input gb onto stage 1 too
    g = pipe_graph()
    g = g.model_copy(update={"nodes": [
        n.model_copy(update={"module_path": {2: "", 4: "other"}.get(n.id, n.module_path)})
        for n in g.nodes]})
    assert stage_of_nodes(g, PART) == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1}


@pytest.mark.parametrize(
    ("stage1_nodes", "node", "message"),
    [
        ([0], 0, "partition: node 0 (a) is in stages 0 and 1"),
        ([7], 7, "partition: stage 1 names node 7, not in the graph"),
    ],
)
def test_bad_partitions_name_the_node(stage1_nodes: list[int], node: int, message: str) -> None:
    part = Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=["s0"]),
                             PipelineStage(stage_index=1, rank=1, nodes=stage1_nodes,
                                           modules=["s1"])])
    with pytest.raises(PlanError, match=re.escape(message)) as info:
        stage_of_nodes(pipe_graph(), part)
    assert info.value.node == node


def test_stages_must_follow_the_data_flow() -> None:
    part = Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=["s0"], nodes=[2]),
                             PipelineStage(stage_index=1, rank=1, nodes=[1, 3])])
    with pytest.raises(PlanError, match=re.escape(
        "partition: forward data flows from node 1 (b) (stage 1) to node 2 (loss) (stage 0): "
        "the stages must follow the forward pass"
    )):
        simulate_pipeline(pipe_graph(), part, rank_actions_from_text("0F0 0B0\n1F0 1B0"))
