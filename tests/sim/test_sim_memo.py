"""The simulator's per-layout memos (node placement, stage costs, stage plans' costs): a search
simulates the same stages many times; the memos must never hand back another layout's or
another plan's figures, nor let a caller's change leak into them."""

from __future__ import annotations

import pytest

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage
from planner.sim.stage_costs import stage_costs, stage_of_nodes
from planner.sim.stage_policies import (
    apply_unit_policies,
    policy_stage_costs,
    stage_facts,
    variant_unit_costs,
)

MODS = [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]]


@pytest.fixture(scope="module")
def op_gpt() -> Graph:
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    return trace(model, inputs).graph


def _part(mods: list[list[str]], policies: dict[str, str] | None = None) -> Partition:
    return Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m,
                                           unit_policies=policies if i == 0 and policies else {})
                             for i, m in enumerate(mods)])


def test_node_placement_is_per_layout_and_a_copy(op_gpt: Graph) -> None:
    first = stage_of_nodes(op_gpt, _part(MODS))
    first.clear()  # a caller's change stays its own
    again = stage_of_nodes(op_gpt, _part(MODS))
    assert again and set(again.values()) == {0, 1}
    moved = stage_of_nodes(op_gpt, _part([["tok", "pos", "h.0"], ["h.1", "h.2", "h.3", "ln_f",
                                                                    "head"]]))
    h1 = [n.id for n in op_gpt.nodes if n.module_path.startswith("h.1.")]
    assert {again[v] for v in h1} == {0} and {moved[v] for v in h1} == {1}


def test_stage_costs_follow_the_layout(op_gpt: Graph) -> None:
    two = stage_costs(op_gpt, _part(MODS))
    shifted = stage_costs(op_gpt, _part([["tok", "pos", "h.0"], ["h.1", "h.2", "h.3", "ln_f",
                                                                   "head"]]))
    assert two[0].forward_ms > shifted[0].forward_ms
    assert stage_costs(op_gpt, _part(MODS)) == two


def test_a_stage_plans_costs_follow_its_plan(op_gpt: Graph) -> None:
    costs = stage_costs(op_gpt, _part(MODS))
    keep = apply_unit_policies(op_gpt, _part(MODS), costs, None)
    recompute = apply_unit_policies(op_gpt, _part(MODS, {"h.0": "recompute"}), costs, None)
    both = {"h.0": "recompute", "h.1": "recompute"}
    twice = apply_unit_policies(op_gpt, _part(MODS, both), costs, None)
    assert recompute[0].costs.saved_bytes < keep[0].costs.saved_bytes
    assert twice[0].costs.saved_bytes < recompute[0].costs.saved_bytes
    assert recompute == apply_unit_policies(op_gpt, _part(MODS, {"h.0": "recompute"}), costs, None)
    # the memo holds what the rule gives without it
    nodes = [v for v, s in stage_of_nodes(op_gpt, _part(MODS)).items() if s == 0]
    direct = policy_stage_costs(op_gpt, stage_facts(op_gpt, nodes, MODS[0]), costs[0],
                                {"h.0": "recompute"}, None, {}, {})
    assert direct == recompute[0]
    assert variant_unit_costs(op_gpt, _part(MODS, {"h.0": "recompute"}), costs, None)[0][0] \
        == direct
