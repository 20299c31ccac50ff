"""Per-device memory: model state under an optimizer, precision and ZeRO sharding, and per
pipeline rank (model state of its stages, activations x in-flight micro-batches, transient).

What DeepSpeed users estimate by hand: Adam under bf16-mixed costs 2 + 2 + 12 = 16 bytes a
parameter; ZeRO-1/2/3 over d data-parallel ranks divides the optimizer state, then also the
gradients, then also the weights, by d.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.model_state import OPTIMIZER_STATES, StateBytes
from planner.core.plan import Plan, PlanKind
from planner.sim.simulator import PlanError, simulate
from planner.sim.stage_costs import stage_costs, stage_of_nodes
from planner.sim.stage_state import model_state_per_stage
from planner.sim.step_memory import ModelStateBreakdown, model_state_breakdown, with_sharding

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")


def with_training_setup(
    graph: Graph, optimizer: str | None = None, precision: str | None = None,
    zero_stage: int | None = None, dp: int | None = None,
) -> Graph:
    """`graph` with another optimizer / precision / ZeRO stage / data-parallel degree."""
    if all(x is None for x in (optimizer, precision, zero_stage, dp)):
        return graph
    ms = graph.model_state
    if ms is None:
        raise InputError("no model_state: optimizer, precision, zero and dp need per-parameter "
                         "bytes (trace the model again, or build the graph with model_state)",
                         field="graph")
    if optimizer is not None and optimizer not in OPTIMIZER_STATES:
        raise InputError(f"no optimizer {optimizer!r}; use one of "
                         f"{', '.join(OPTIMIZER_STATES)}", field="optimizer")
    if precision is not None and precision not in PRECISIONS:
        raise InputError(f"no precision {precision!r}; use one of {', '.join(PRECISIONS)}",
                         field="precision")
    update = {k: v for k, v in (("optimizer", optimizer), ("precision", precision)) if v}
    ms = ms.model_copy(update=update) if update else ms
    ms = with_sharding(ms, zero_stage, dp)
    return graph.model_copy(update={"model_state": ms})


def device_breakdown(graph: Graph) -> ModelStateBreakdown:
    return model_state_breakdown(graph)


@dataclass(frozen=True)
class RankMemory:
    rank: int
    stages: list[int]
    state: StateBytes  # its stages' parameters (unplaced bytes: in `other_bytes`)
    other_bytes: int  # inputs, buffers, unplaced parameters: its even share
    activations_bytes: int  # saved per micro-batch x in flight, at the peak (peak - the rest)
    peak_bytes: int


def rank_breakdown(graph: Graph, plan: Plan, check_hash: bool = True) -> list[RankMemory]:
    """Per rank of a pipeline plan, from the simulator (its peak) and the placement of each
    parameter on its stage. `check_hash` False: the graph's training setup was changed on
    purpose (another ZeRO stage, optimizer...), the plan's stages still apply."""
    if plan.kind is not PlanKind.pipeline or plan.partition is None:
        raise InputError("not a pipeline plan (kind pipeline, with a partition)", field="plan")
    try:
        sim = simulate(graph, plan, check_hash=check_hash)
    except PlanError as e:
        raise InputError(str(e), field="plan") from None
    stage = stage_of_nodes(graph, plan.partition)
    costs = stage_costs(graph, plan.partition)
    per_stage = model_state_per_stage(graph, stage, len(costs))
    out = []
    for r in sim.ranks:
        stages = [s.stage_index for s in plan.partition.stages if s.rank == r.rank]
        state = StateBytes()
        for s in stages:
            state = state + per_stage[s]
        other = r.model_state_bytes - state.total_bytes
        out.append(RankMemory(r.rank, stages, state, other, r.peak_bytes - r.model_state_bytes,
                              r.peak_bytes))
    return out
