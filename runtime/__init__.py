"""The torch layer: executing plans inside PyTorch training.

`planner.runtime.apply(model, plan, example_inputs)` binds an op-level plan to a model (see
`runtime/apply.py`); `planner.runtime.agent.plan_for(...)` traces, obtains, caches and applies a
plan;
`planner.runtime.block_executor` runs block-level plans; `planner.runtime.measure` measures steps.
`planner.runtime.compile(model, plan, example_inputs)` runs a plan's save/recompute decisions
through torch.compile (`runtime/compiled.py`; imported on first use).
Note: `planner.runtime.apply` is the function (the module is reached with `from
planner.runtime.apply import`).
"""

from planner.runtime.apply import PlanMismatch, PlannedModule, apply

__all__ = ["PlanMismatch", "PlannedModule", "apply", "compile"]


def __getattr__(name: str) -> object:
    # Lazy: importing the runtime does not import torch.utils.checkpoint's SAC machinery.
    if name == "compile":
        from planner.runtime.compiled import compile

        return compile
    raise AttributeError(f"module 'planner.runtime' has no attribute {name!r}")
