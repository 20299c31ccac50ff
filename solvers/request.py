"""What every planning method takes and gives back: the contract between the engine and solvers.

The engine (`planner.engine.solve`) builds a `SolveRequest`, calls a method, and judges the
`MethodResult` with the simulator; methods never build a `Plan` themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.core.limits import DEFAULT_TIME_LIMIT_S
from planner.core.plan import Action, BlockPlan, FsdpSettings, PlanStatus
from planner.core.resources import Resources

if TYPE_CHECKING:  # the graph type for annotations only: the specs load without networkx
    from planner.core.graph import Graph
    from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem


@dataclass(frozen=True)
class SolveRequest:
    graph: Graph
    budget_bytes: int
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    threads: int = 2
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    # Called with (best objective, best bound) whenever the method's incumbent or bound
    # improves (either None when unknown), possibly from a solver's threads; the engine passes
    # on only changes. Long-running methods call it: auto, milp, lp-rounding, cpsat-intervals.
    progress: Callable[[float | None, float | None], None] | None = None
    # Called with (actions, source label, a lower bound covering the plan or None) for each
    # better in-budget plan as the method finds it, possibly from its threads. The engine
    # keeps the latest and answers with it if the method overruns its limit (anytime); the
    # method may keep editing its own lists (they are copied). None: nobody keeps them.
    incumbent: Callable[[list[Action], str, float | None], None] | None = None
    # The machine (links, host memory); None: one device, the budget alone.
    resources: Resources | None = None
    # Pipeline partitioners only: the problem the engine built and checked (ranks,
    # micro-batches, schedule, device memory; planner.engine.partition).
    pipeline: PipelineProblem | None = None


@dataclass(frozen=True)
class MethodResult:
    """What a method hands back; the engine turns it into a checked Plan."""

    actions: list[Action] | None  # None: no plan found
    status: PlanStatus  # optimal only when the method proved it
    backend: str = "none"
    objective: float | None = None
    lower_bound: float | None = None
    smallest_feasible_bytes: int | None = None  # what the method knows of the least budget
    # status infeasible as a proof (a solver proved no plan of its space fits), which the judge
    # holds against known plans; False: none found by this method (a heuristic, a chain DP)
    infeasibility_proven: bool = False
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    # Chain solvers: the block modes a module-level runtime applies (one level of
    # checkpointing); the engine simulates it before it goes into the Plan.
    block_plan: BlockPlan | None = None
    # Pipeline partitioners: the split chosen, its rank actions and per-rank peaks; the engine
    # builds the pipeline plan from it and judges it (planner.engine.partition).
    partition: PartitionOutcome | None = None
    # FSDP planners: the rank's settings (actions None); the engine judges them with the
    # graph's FSDP model (planner.engine.fsdp_solve).
    fsdp: FsdpSettings | None = None


MethodFn = Callable[[SolveRequest], MethodResult]
