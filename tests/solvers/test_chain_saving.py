"""Saving options of the chain DP (solvers/chain/saving.py, rotor's `options`): each segment's
F_all may keep less and its backward recompute the rest; the DP picks per segment."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.engine.solve import solve
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.chain.linearize import linearize
from planner.solvers.chain.rotor import combined, solve_rotor
from planner.solvers.chain.saving import combined_layout, saving_options
from planner.solvers.chain.sequence import run_sequence
from planner.solvers.chain.translate import translate

EXAMPLE = Path(__file__).resolve().parents[2] / "planner" / "examples" / "resnet24.json"


def _graphs() -> list[tuple[str, Graph]]:
    out = [("resnet24", Graph.model_validate_json(EXAMPLE.read_text()))]
    try:
        from models import tiny_gpt

        from planner.tracing.api import trace
    except ImportError:  # torch missing: the bundled graph alone
        return out
    model, inputs = tiny_gpt(layers=3)
    # gradients held all step: the chain model charges 'backward' gradients for the whole step
    # too, so budgets as fractions of store-all keep the meaning these tests were written for
    out.append(("gpt", trace(model, inputs, gradient_lifetime="step").graph))
    return out


@pytest.fixture(scope="module")
def graphs() -> list[tuple[str, Graph]]:
    return _graphs()


def test_options_keep_less_and_recompute_only_what_they_drop(graphs) -> None:
    for name, g in graphs:
        lin = linearize(g)
        base = lin.layout
        options = saving_options(g, base)
        assert options, f"{name}: no segment has values cheap enough to drop"
        for option in options:
            for i in range(1, base.length + 1):
                assert option.layout.saved[i] <= base.saved[i]
                assert set(option.layout.joint[i]) <= option.layout.saved[i]
                extra = [v for v in option.layout.backward[i] if v not in base.backward[i]]
                assert set(extra) <= set(base.forward[i])  # forward nodes of the segment
                assert all(g.index.node(v).recomputable for v in extra)
                assert set(base.backward[i]) <= set(option.layout.backward[i])
            # a stage keeping less has fewer saved bytes and a backward at least as long
            for i, (st, plain) in enumerate(zip(option.chain.stages, lin.chain.stages,
                                               strict=True), start=1):
                if option.layout.saved[i] != base.saved[i]:
                    assert st.saved_bytes < plain.saved_bytes
                    assert st.backward_ms >= plain.backward_ms


def test_the_dp_with_options_is_exact_within_budget_and_never_worse(graphs) -> None:
    improved = 0
    for name, g in graphs:
        lin = linearize(g)
        options = saving_options(g, lin.layout)
        chains = [o.chain for o in options]
        full = store_all_peak_bytes(g)
        for fraction in (0.95, 0.8, 0.7, 0.6):
            budget = math.ceil(fraction * full)
            plain = solve_rotor(lin.chain, budget)
            lean = solve_rotor(lin.chain, budget, options=chains)
            if plain.ops is not None:
                assert lean.ops is not None and lean.cost is not None and plain.cost is not None
                assert lean.cost <= plain.cost + 1e-9, (name, fraction)
                improved += lean.cost < plain.cost - 1e-9
            if lean.ops is None:
                continue
            picks = lean.stage_options
            assert len(picks) == lin.chain.length
            chain = combined(lin.chain, chains, picks)
            run = run_sequence(chain, lean.ops)
            assert run.peak_bytes <= budget and math.isclose(run.cost, lean.cost)
            layout = combined_layout(lin.layout, [o.layout for o in options], picks)
            sim = simulate(g, translate(g, layout, lean.ops))
            # The chain model is exact or above, but for an output of a multi-output op that
            # the plan frees and takes again from the op in another segment (a dropout's mask):
            # the runtime keeps it in the op's tuple meanwhile, which segment profiles cannot
            # see (planner.sim.ledger_replay.ElementFlow.kept). At most one such output.
            assert sim.peak_bytes <= run.peak_bytes + _largest_element_bytes(g)
    assert improved >= 2  # keeping less pays on these graphs


def _largest_element_bytes(g: Graph) -> int:
    from planner.sim.ledger import MemoryLedger

    ledger = MemoryLedger.of(g)
    return max((ledger.storage_bytes[u] for u in ledger.element_op), default=0)


def test_rotor_method_option_and_its_check(graphs) -> None:
    name, g = graphs[-1]
    budget = math.ceil(0.8 * store_all_peak_bytes(g))
    plain = solve(g, budget, "rotor", time_limit_s=30.0, options={"refine": 0})
    lean = solve(g, budget, "rotor", time_limit_s=30.0, options={"refine": 0, "saving": True})
    assert plain.predicted is not None and lean.predicted is not None
    assert lean.predicted.peak_bytes <= budget
    assert lean.predicted.overhead <= plain.predicted.overhead + 1e-9
    levels = lean.details["rotor_saving_levels"]
    assert len(levels) == lean.details["chain"]["stages"] and any(levels)
    with pytest.raises(InputError, match="saving"):
        solve(g, budget, "rotor", options={"saving": "yes"})


def test_rotor_segments_option_caps_the_linearised_chain() -> None:
    from planner.core.synthetic import training_graph

    g = training_graph(300, seed=2)  # a 300-stage chain before merging
    budget = math.ceil(0.6 * store_all_peak_bytes(g))
    coarse = solve(g, budget, "rotor", time_limit_s=30.0,
                   options={"segments": 40, "saving": True, "refine": 0})
    assert coarse.details["chain"]["stages"] <= 40
    assert coarse.predicted is not None and coarse.predicted.peak_bytes <= budget
    assert simulate(g, coarse.actions).peak_bytes <= budget
    with pytest.raises(InputError, match="segments 1"):
        solve(g, budget, "rotor", time_limit_s=5.0, options={"segments": 1})


def test_more_saving_levels_never_cost_more(graphs) -> None:
    # 20 levels hold every option of the default 10 (k/20 for even k): the DP can only gain
    for name, g in graphs:
        budget = math.ceil(0.8 * store_all_peak_bytes(g))
        costs = []
        for levels in (10, 20):
            plan = solve(g, budget, "rotor", time_limit_s=30.0,
                         options={"saving": True, "saving_levels": levels, "refine": 0})
            assert plan.predicted is not None and plan.predicted.peak_bytes <= budget, name
            costs.append(plan.details["rotor"]["dp_cost"])
        assert costs[1] <= costs[0] + 1e-9, name
        layout = linearize(g).layout
        tenths = {o.layout.saved for o in saving_options(g, layout)}
        twentieths = {o.layout.saved for o in saving_options(
            g, layout, tuple(k / 20 for k in range(1, 21)))}
        assert tenths and tenths <= twentieths, name
