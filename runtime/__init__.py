"""The torch layer: executing plans inside PyTorch training.

`planner.runtime.apply(model, plan, example_inputs)` binds an op-level plan to a model (see
`runtime/apply.py`); `planner.runtime.agent.plan_for(...)` traces, obtains, caches and applies a
plan;
`planner.runtime.block_executor` runs block-level plans; `planner.runtime.measure` measures steps.
Note: `planner.runtime.apply` is the function (the module is reached with `from
planner.runtime.apply import`).
"""

from planner.runtime.apply import PlanMismatch, PlannedModule, apply

__all__ = ["PlanMismatch", "PlannedModule", "apply"]
