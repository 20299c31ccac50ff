"""Planner in a Hugging Face `Trainer`: `PlannerCallback`.

    from planner.runtime.integrations.hf_trainer import PlannerCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[PlannerCallback(budget=0.6)])   # or budget=2 * 2**30 (bytes)
    trainer.train()

At train begin the callback swaps `trainer.model`'s forward for a planned step
(planner.runtime.integrations.planned_forward): the Trainer calls `model(**inputs)` with
`labels`, so a transformers model computes its own loss, and the planned step returns a
ModelOutput holding that loss, which is all `Trainer.compute_loss` reads. The first training
call of each input shape is traced, planned (or taken from the plan cache: `cache_dir`, default
$PLANNER_CACHE_DIR or ~/.cache/planner/plans) and measured once; the Trainer's optimizer keeps
working on the same parameters. At train end the model's own forward is back.

Each logging step is measured, and its logs get `planner/peak_bytes` (measured: what the step
allocated at its most) and `planner/predicted_peak_bytes` (the plan's prediction of the same),
in the logs the later callbacks see and in `trainer.state.log_history`. Reporters (report_to:
wandb, tensorboard, ...) come before user callbacks; `add_planner(trainer, ...)` puts the
callback first so that they log the planner's figures too. `history` keeps every measured step.

Gradient accumulation (`gradient_accumulation_steps` > 1) is planned with gradients held all
step. Trainer options that take the labels out of the model call (`label_smoothing_factor`,
`compute_loss_func`) leave the model without a loss to plan to: refused at the first step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - the torch extra installs transformers
    raise ImportError(
        f"planner.runtime.integrations.hf_trainer needs transformers ({e}): "
        "pip install 'planner[torch,integrations]'"
    ) from None

from planner.core.limits import DEFAULT_AGENT_TIME_LIMIT_S
from planner.runtime.integrations.planned_forward import (
    PlannedForward,
    PlannerCallbackState,
)


class PlannerCallback(TrainerCallback, PlannerCallbackState):
    """Plans, applies and measures `trainer.model`'s training step under `budget`: bytes (int;
    1 is one byte), a fraction of the store-all peak (float in (0, 1]; 1.0 is all of it) or a
    budget string ('80%', '2GiB'): the one budget grammar (planner.core.budget).

    `method`, `time_limit_s`, `cache_dir`, `server` and any further `agent_options` (token,
    timeout_s, replan, ...) are planner.runtime.agent.plan_for's."""

    def __init__(
        self,
        budget: int | float | str,
        *,
        method: str = "auto",
        time_limit_s: float = DEFAULT_AGENT_TIME_LIMIT_S,
        cache_dir: str | Path | None = None,
        server: str | None = None,
        max_plans: int = 8,
        **agent_options: Any,
    ) -> None:
        self._init_state(budget, max_plans, method=method, time_limit_s=time_limit_s,
                         cache_dir=cache_dir, server=server, **agent_options)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            return
        if self.planned is None or self.planned.model is not model:
            options = {"grad_accumulation_steps": args.gradient_accumulation_steps, **self.options}
            self.planned = PlannedForward(model, self.budget, options, self.max_plans)
        self.planned.install()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.planned is not None:
            self.planned.arm(_will_log(args, state))

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Accumulating: measure the window's last micro-step, whose gradients exist already,
        # as the plan (gradients held all step) counts them.
        if self.planned is not None:
            self.planned.restart_measure()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.planned is not None:
            self.planned.finish_step(state.global_step + 1)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        record = self.planned.take_pending() if self.planned is not None else None
        if record is None or logs is None:
            return
        # Trainer.log has put {**logs, "step": ...} into log_history before calling back.
        latest = state.log_history[-1] if state.log_history else None
        if latest is not None and set(latest) - {"step"} == set(logs):
            latest.update(record.logs())
        logs.update(record.logs())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.planned is not None:
            self.planned.uninstall()


def add_planner(trainer: Any, budget: int | float | str, **options: Any) -> PlannerCallback:
    """A PlannerCallback put first among `trainer`'s callbacks, so that reporters see its logs."""
    callback = PlannerCallback(budget, **options)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback


def _will_log(args: Any, state: Any) -> bool:
    """Whether the coming optimizer step is a logging step (as DefaultFlowCallback decides)."""
    step = state.global_step + 1
    if step == 1 and args.logging_first_step:
        return True
    every = state.logging_steps or 0
    return args.logging_strategy == "steps" and every > 0 and step % every == 0
