"""Block plans go through the simulator before they are reported or run.

A chain solver's block plan (`Plan.block_plan`: K/C/R per chain block) is applied by the
module-level runtime with one level of checkpointing; that is a schedule of its own, not the
solver's operation sequence (whose actions the plan carries). Its actions on the graph's chain
(`planner.solvers.chain.methods.block_plan_actions`) are simulated like any plan: the engine keeps a
block plan only when that simulation passes within the budget, and the runtime refuses one
whose simulation fails, with the simulator's message.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.block_plan import BlockPlan
from planner.core.graph import Graph
from planner.sim.simulator import PlanError, SimulationResult, simulate


def simulate_block_plan(graph: Graph, block_plan: BlockPlan) -> SimulationResult:
    """The simulation of applying `block_plan` on `graph`; PlanError when it cannot run."""
    from planner.solvers.chain.methods import block_plan_actions

    try:
        actions = block_plan_actions(graph, block_plan)
    except ValueError as e:
        raise PlanError(f"block plan {block_plan}: {e}") from None
    try:
        return simulate(graph, actions)
    except PlanError as e:
        raise PlanError(f"block plan {block_plan}: {e}", e.action_index, e.node) from None


@dataclass(frozen=True)
class BlockPlanCheck:
    block_plan: BlockPlan | None  # None: rejected
    note: str | None  # why it was rejected
    one_level: dict[str, float] | None  # the simulator's peak and cost of applying it


def check_block_plan(graph: Graph, budget_bytes: int, block_plan: BlockPlan) -> BlockPlanCheck:
    """Keep `block_plan` only if its simulation passes within `budget_bytes`."""
    try:
        sim = simulate_block_plan(graph, block_plan)
    except PlanError as e:
        return BlockPlanCheck(None, f"block plan dropped: {e}", None)
    figures = {"peak_bytes": sim.peak_bytes, "compute_cost": sim.compute_cost}
    if sim.peak_bytes > budget_bytes:
        return BlockPlanCheck(
            None,
            f"block plan {block_plan} dropped: applied with one level of checkpointing it "
            f"peaks at {sim.peak_bytes} bytes, over the budget of {budget_bytes} (the "
            "op-level plan fits; apply that one)",
            figures,
        )
    return BlockPlanCheck(block_plan, None, figures)
