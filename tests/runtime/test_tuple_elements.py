"""Outputs of a multi-output op that are nodes of their own (a dropout's mask, a layer norm's
statistics, a convolution backward's weight gradient): the op makes them all when it runs, so
their bytes are live from the op's computation on, not from their getitem's. Before this rule the
CPU runtime measured tight remat plans of a GPT 3.1 % and of a ResNet 4.6 % over their
prediction (exact storage accounting), the peak at the op or between it and its getitem."""

from __future__ import annotations

import pytest
from conftest import make_graph

from planner.core.plan import actions_from_text
from planner.core.resources import Link, Resources
from planner.sim.copy_streams import simulate_streams
from planner.sim.ledger import MemoryLedger
from planner.sim.simulator import simulate

# 0 (100 B) -> op 1 (10 B, with a second output: node 2, a getitem of 50 B); 3 (20 B) reads 0;
# 4 (5 B) reads 2 and 3.
GRAPH = make_graph(
    {0: 100, 1: 10, 2: 50, 3: 20, 4: 5},
    [(0, 1), (1, 2), (0, 3), (2, 4), (3, 4)],
    op={1: "aten.native_dropout", 2: "getitem"},
)
HOST = Resources(host_memory_bytes=10_000, h2d=Link(bandwidth_bytes_per_s=1e6),
                 d2h=Link(bandwidth_bytes_per_s=1e6))


def _all_replays(text: str) -> list[list[int]]:
    actions = actions_from_text(text)
    ledger = MemoryLedger.of(GRAPH)
    return [
        list(simulate(GRAPH, actions).live_bytes),
        list(ledger.replay(actions, check=False, timeline=True).live_bytes or []),
        [p.live_bytes for p in simulate_streams(GRAPH, actions, HOST).timeline],
    ]


def test_an_element_is_live_from_its_ops_computation() -> None:
    # 3 runs between op 1 and its getitem 2: the mask (50 B) is already there.
    text = "C0 C1 C3 C2 F0 F1 C4 F2 F3 F4"
    expected = [100, 160, 180, 180, 80, 70, 75, 25, 5, 0]
    for replay in _all_replays(text):
        assert replay == expected
    assert simulate(GRAPH, actions_from_text(text)).peak_bytes == 180


def test_an_element_not_taken_from_this_run_is_charged_while_the_op_runs() -> None:
    # the plan frees op 1 before computing its getitem: nothing is handed over, the second
    # output exists only while op 1 runs (the runtime drops it right after); the second run
    # hands it to node 2
    text = "C0 C1 F1 C3 C1 C2 F1 F0 C4 F2 F3 F4"
    expected = [100, 160, 100, 120, 180, 180, 170, 70, 75, 25, 5, 0]
    for replay in _all_replays(text):
        assert replay == expected


def test_an_element_freed_and_taken_again_from_its_op_stays() -> None:
    # node 2 is freed while op 1 stays resident and is computed again from it before op 1 is
    # touched: the runtime keeps it in op 1's tuple, so its bytes never leave
    text = "C0 C1 C2 F2 C3 C2 F0 F1 C4 F2 F3 F4"
    expected = [100, 160, 160, 160, 180, 180, 80, 70, 75, 25, 5, 0]
    for replay in _all_replays(text):
        assert replay == expected


def test_elements_follow_their_op_in_a_traced_order() -> None:
    torch = pytest.importorskip("torch")
    from models import tiny_gpt

    from planner.tracing.api import trace

    torch.manual_seed(0)
    model, inputs = tiny_gpt(dropout=0.1)
    graph = trace(model, inputs, dropout_masks="graph").graph
    ledger = MemoryLedger.of(graph)
    assert ledger.elements, "a GPT has dropouts and layer norms"
    order = graph.index.topological_order
    position = {v: k for k, v in enumerate(order)}
    for t, elements in ledger.elements.items():
        between = {order[k] for k in range(position[t] + 1, max(position[u] for u in elements))}
        assert between <= set(elements), (t, elements)


# Unmodelled bytes a CPU step allocates beyond the plan: a few scalars (the loss's seed
# gradient ...: 12 B on a GPT) and, unexplained yet, up to 2.6 % on a tiny ResNet with batch
# norms (its running statistics are graph outputs of every recomputation).
SCALARS_BYTES = 0  # the loss's copies are modelled now (planner.sim.ledger.LOSS_COPIES)
BATCH_NORM_SHARE = 0.03


@pytest.mark.parametrize("model", ["gpt", "cnn"])
def test_tight_remat_plans_measure_within_their_prediction(model: str) -> None:
    pytest.importorskip("torch")
    from runtime_helpers import TINY

    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step
    from planner.tracing.api import trace

    net, inputs = TINY[model]()
    result = trace(net, inputs, dropout_masks="graph")
    graph = result.graph
    high = solve(graph, 10**15, "store-all").predicted
    low = solve(graph, 10**15, "recompute-all").predicted
    assert high is not None and low is not None
    rows = []
    for fraction in (0.0, 0.3, 0.6):
        budget = low.peak_bytes + int(fraction * (high.peak_bytes - low.peak_bytes))
        plan = solve(graph, budget, "milp", time_limit_s=3)
        if plan.status.value not in ("optimal", "feasible") or plan.predicted is None:
            continue
        module = apply(net, plan, inputs, trace=result)
        net.zero_grad(set_to_none=True)
        measured = measure_step(training_step(module, inputs), net).peak_bytes
        predicted = plan.predicted.peak_bytes - graph.fixed_bytes
        rows.append((fraction, measured, predicted))
        slack = SCALARS_BYTES + (BATCH_NORM_SHARE * predicted if model == "cnn" else 0)
        assert measured <= predicted + slack, rows
    assert rows, "milp found no plan at any budget"
