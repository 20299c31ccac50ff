"""Planner inside the trainers people use: a Hugging Face `Trainer` callback and a PyTorch
Lightning callback (one `PlannerCallback` in each module).

    from planner.runtime.integrations.hf_trainer import PlannerCallback     # transformers
    from planner.runtime.integrations.lightning import PlannerCallback      # lightning

Each swaps the model's `forward` for a planned step (planner.runtime.agent: trace, plan,
apply, measure) at the first training call, keeps the plan in the on-disk plan cache, and
reports the measured peak next to the predicted one at each logging step
(planner.runtime.integrations.planned_forward). Nothing here imports transformers or lightning
until one of the two modules is imported.
"""

__all__ = ["hf_trainer", "lightning", "planned_forward"]
