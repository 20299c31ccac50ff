"""The torch layer: executing plans inside PyTorch training.

`runtime.apply(model, plan, example_inputs)` binds an op-level plan to a model (see
`runtime/apply.py`); `runtime.agent.plan_for(...)` traces, obtains, caches and applies a plan;
`runtime.block_executor` runs block-level plans; `runtime.measure` measures steps.
Note: `runtime.apply` is the function (the module is reached with `from runtime.apply import`).
"""

from runtime.apply import PlanMismatch, PlannedModule, apply

__all__ = ["PlanMismatch", "PlannedModule", "apply"]
