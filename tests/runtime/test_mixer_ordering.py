"""The MLP-Mixer ordering defect (issue 12): backward ops that need no gradient input may not
run before the loss. The rule is the graph's (`order_predecessors`), the simulator enforces it,
every solver's order respects it, and the runtime runs the resulting plans with gradient parity.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import eager_step, planned_step  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.graph import Graph, Phase  # noqa: E402
from planner.core.plan import compute  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.sim.simulator import PlanError, simulate  # noqa: E402
from planner.solvers.baselines import BASELINES, store_all  # noqa: E402
from planner.solvers.order import respects_order_rule, schedule_order  # noqa: E402
from planner.solvers.remat.orders import candidate_orders, explore_orders, greedy_order  # noqa: E402
from planner.solvers.remat.problem import problem_from_graph  # noqa: E402


@pytest.fixture(scope="module")
def mixer():
    """The tiny mixer with dropout, traced at op level as `planner-cli trace` does."""
    from planner.tracing.api import trace

    model, inputs = zoo.mixer(**zoo.TINY["mixer"])
    result = trace(model, inputs, level="op")
    return model, inputs, result


def _first_backward_before_loss(graph: Graph, actions) -> bool:
    loss = set(graph.index.loss_nodes)
    seen: set[int] = set()
    for a in actions:
        if a.op.value != "compute":
            continue
        if graph.node(a.node).phase is Phase.backward and not loss <= seen:
            return True
        seen.add(a.node)
    return False


def test_mixer_has_backward_ops_without_gradient_input(mixer) -> None:
    graph = mixer[2].graph
    control = graph.index.control_predecessors
    assert control, "the defect needs backward nodes with no data path from the loss"
    assert respects_order_rule(graph.index, graph.index.topological_order)


def test_every_reordering_respects_the_loss_rule(mixer) -> None:
    graph = mixer[2].graph
    for name, order in candidate_orders(graph).items():
        assert respects_order_rule(graph.index, order), name
    sa = simulate(graph, store_all(graph)).peak_bytes
    deadline = __import__("time").perf_counter() + 1.0
    for name, order in explore_orders(graph, int(0.6 * sa), deadline):
        assert respects_order_rule(graph.index, order), name
    assert respects_order_rule(graph.index, greedy_order(graph, lambda d, p, pos: (p, pos)))


def test_a_stored_order_that_breaks_the_rule_is_repaired_for_solvers(mixer) -> None:
    graph = mixer[2].graph
    control = graph.index.control_predecessors
    # A backward op that needs no gradient input, moved right after its last data input.
    early = min(control)
    rest = [v for v in graph.index.topological_order if v != early]
    at = max(rest.index(u) for u in graph.index.predecessors[early]) + 1
    bad = rest[:at] + [early] + rest[at:]
    broken = graph.model_copy(update={"order": bad})
    assert not respects_order_rule(broken.index, broken.index.topological_order)
    fixed = schedule_order(broken)
    assert respects_order_rule(broken.index, fixed)
    assert problem_from_graph(broken, 10**15).node_ids == tuple(fixed)
    for name, fn in BASELINES.items():
        actions = fn(broken, None)
        assert not _first_backward_before_loss(broken, actions), name
        simulate(broken, actions)  # no PlanError
    # The given order itself is refused by the simulator, with the rule's message.
    with pytest.raises(PlanError, match="may not run before the loss"):
        simulate(broken, [compute(v) for v in bad])


@pytest.mark.slow
def test_auto_plan_at_60_percent_runs_with_gradient_parity(mixer) -> None:
    model, inputs, result = mixer
    graph = result.graph
    store_all_peak = simulate(graph, store_all(graph)).peak_bytes
    plan = solve(graph, int(0.6 * store_all_peak), "auto", time_limit_s=3.0)
    assert plan.status.value in ("optimal", "feasible"), plan.summary()
    assert not _first_backward_before_loss(graph, plan.actions)
    module = apply(model, plan, inputs)  # re-traces as the runtime runs it; eager masks match
    ref_loss, ref_grads = eager_step(model, inputs, seed=7)
    loss, grads = planned_step(module, inputs, seed=7)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")
