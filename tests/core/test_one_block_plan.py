"""One BlockPlan (planner.core.block_plan): the chain solver derives it, the plan carries it."""

from __future__ import annotations

import pytest

from planner.core.block_plan import BlockMode, BlockPlan
from planner.core.plan import BlockPlan as PlanBlockPlan
from planner.solvers.chain import blocks
from planner.solvers.chain.blocks import (
    block_plan_from_ops,
    block_plan_from_solution,
    one_level_ops,
)
from planner.solvers.chain.sequence import chen_sqrt_ops, ops_from_text, store_all_ops


def test_exactly_one_block_plan_class() -> None:
    assert PlanBlockPlan is BlockPlan
    assert blocks.BlockMode is BlockMode
    assert not hasattr(blocks, "BlockPlan")  # the chain solver derives plans, defines none


def test_block_plan_forms() -> None:
    plan = block_plan_from_ops(6, store_all_ops(6))
    assert type(plan) is BlockPlan
    assert plan.text() == "blocks 0–5 kept" and plan.kept() == list(range(6))
    mixed = ops_from_text(
        "Fall1 Fall2 Fck3 Fn4 Fn5 Fck6 Fn7 Fn8 Fall9 B9 D8 Fall6 Fall7 Fall8 B8 B7 B6 D5 "
        "Fall3 Fall4 Fall5 B5 B4 B3 B2 B1"
    )
    plan = block_plan_from_ops(9, mixed)
    assert plan.to_json() == {"schema": "block-plan-1", "modes": "KKCRRCRRK",
                              "forward_runs": [1, 1, 2, 2, 2, 2, 2, 2, 1]}
    assert plan.segments() == [(2, 4), (5, 7)]
    assert plan.text() == "blocks 0–1 kept, 2–7 checkpointed every 3rd, 8 kept"
    assert BlockPlan.from_json(plan.to_json()) == plan == BlockPlan.model_validate(plan.to_json())
    chen = block_plan_from_ops(24, chen_sqrt_ops(24))
    assert chen.modes[0] == BlockMode.checkpoint and "checkpointed" in chen.text()
    with pytest.raises(ValueError, match="'R' must follow"):
        BlockPlan(modes=(BlockMode.keep, BlockMode.recompute), forward_runs=[1, 1])
    with pytest.raises(ValueError, match="schema"):
        BlockPlan.from_json({"modes": "K"})
    assert block_plan_from_solution(None) is None


def test_one_level_ops() -> None:
    mixed = ops_from_text("Fck1 Fn2 Fall3 B3 D2 Fall1 Fall2 B2 B1")
    plan = block_plan_from_ops(3, mixed)
    assert plan.modes == "CRK"
    assert " ".join(str(o) for o in one_level_ops(plan)) == "Fck1 Fn2 Fall3 B3 D2 Fall1 Fall2 B2 B1"
