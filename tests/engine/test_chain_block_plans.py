"""Block plans go through the simulator (issue 12): the chain methods return a typed block plan,
the engine keeps it only when its own one-level application simulates within the budget, and
the runtime refuses one whose simulation fails, with the simulator's message."""

from __future__ import annotations

import random

import pytest

from planner.core.plan import BlockPlan, PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.block_plans import check_block_plan, simulate_block_plan
from planner.engine.solve import solve
from planner.sim.simulator import PlanError, simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.chain.layout import chain_graph
from planner.solvers.chain.methods import block_plan_actions
from planner.solvers.chain.model import Chain, Stage


def random_chain(seed: int, length: int) -> Chain:
    rng = random.Random(seed)
    prev = rng.randint(1, 9) * 1000
    x0, stages = prev, []
    for i in range(length):
        x = rng.randint(1, 9) * 1000
        stages.append(Stage(
            forward_ms=rng.uniform(0.5, 5), backward_ms=rng.uniform(1, 10), output_bytes=x,
            saved_bytes=x + rng.randint(0, 20) * 1000, forward_tmp_bytes=rng.randint(0, 3) * 500,
            backward_tmp_bytes=rng.randint(0, 3) * 500, grad_input_bytes=prev, name=f"b{i}",
        ))
        prev = x
    return Chain(tuple(stages), input_bytes=x0, fixed_bytes=777)


@pytest.mark.parametrize("method", ["rotor", "revolve", "chain-chen-sqrt"])
def test_chain_methods_return_a_simulated_typed_block_plan(method: str) -> None:
    graph, _ = chain_graph(random_chain(3, 8))
    budget = store_all_peak_bytes(graph)
    plan = solve(graph, budget, method, time_limit_s=5)
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible), plan.notes
    assert isinstance(plan.block_plan, BlockPlan)
    assert plan.details["block_plan"] == plan.block_plan.model_dump()  # version-1 readers
    sim = simulate(graph, block_plan_actions(graph, plan.block_plan))
    assert plan.details["block_plan_one_level"] == {
        "peak_bytes": sim.peak_bytes, "compute_cost": sim.compute_cost}
    assert sim.peak_bytes <= budget


def test_a_block_plan_over_budget_is_dropped_but_the_plan_stays() -> None:
    """Rotor's nested recomputations fit where one level of checkpointing does not: the plan
    keeps its op-level actions and says why the block plan is gone."""
    dropped = 0
    for seed in range(4):
        graph, _ = chain_graph(random_chain(seed, 10))
        full = store_all_peak_bytes(graph)
        for fraction in (0.6, 0.45, 0.35, 0.3):
            budget = int(fraction * full)
            plan = solve(graph, budget, "rotor", time_limit_s=5)
            if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
                continue
            bp = BlockPlan.model_validate(plan.details.get("block_plan") or "K")
            if plan.block_plan is None:
                dropped += 1
                assert any("block plan" in n and "dropped" in n for n in plan.notes)
                assert "block_plan" not in plan.details
                one_level = plan.details["block_plan_one_level"]
                assert one_level["peak_bytes"] > budget
            else:
                assert bp == plan.block_plan
                assert simulate_block_plan(graph, plan.block_plan).peak_bytes <= budget
    assert dropped, "no case where one level of checkpointing is over the budget"


def test_block_plans_of_linearised_graphs_are_simulated() -> None:
    graph = training_graph(12, skip=3, seed=5)
    full = store_all_peak_bytes(graph)
    plan = solve(graph, int(0.8 * full), "rotor", time_limit_s=5)
    assert plan.status in (PlanStatus.optimal, PlanStatus.feasible), plan.notes
    if plan.block_plan is not None:
        assert simulate_block_plan(graph, plan.block_plan).peak_bytes <= int(0.8 * full)


def test_a_block_plan_for_another_chain_is_refused() -> None:
    graph, _ = chain_graph(random_chain(1, 6))
    with pytest.raises(PlanError, match="block plan KKK: .*3 blocks, the graph's chain 6"):
        simulate_block_plan(graph, BlockPlan.model_validate("KKK"))
    check = check_block_plan(graph, 10**12, BlockPlan.model_validate("KKK"))
    assert check.block_plan is None and check.note is not None and "dropped" in check.note


def test_the_runtime_refuses_a_block_plan_the_simulator_refuses() -> None:
    pytest.importorskip("torch")
    from models import tiny_gpt

    from planner.runtime.block_executor import BlockPlanError, check_simulates, stage_names_of
    from planner.tracing.api import trace

    model, inputs = tiny_gpt(layers=2)
    result = trace(model, inputs, level="module", block_pattern="h.*")
    names = stage_names_of(result)
    check_simulates("K" * len(names), result.graph)  # a plan of the right shape runs
    check_simulates("K" + "C" * (len(names) - 1), result.graph)
    with pytest.raises(BlockPlanError, match="the graph's chain"):
        check_simulates("K" * (len(names) + 1), result.graph)
