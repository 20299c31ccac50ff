"""Planner in PyTorch Lightning: `PlannerCallback`.

    from planner.runtime.integrations.lightning import PlannerCallback
    trainer = lightning.Trainer(max_steps=1000, callbacks=[PlannerCallback(budget=0.6)])
    trainer.fit(MyModule(), data)      # MyModule.training_step returns self.model(*batch)

At fit start the callback swaps the forward of the LightningModule's model (`module`: the
submodule's name, default `model`, else its only child; "" for the LightningModule itself) for
a planned step (planner.runtime.integrations.planned_forward). That module must compute the
loss (return it, or an output with `.loss`; a transformers model given `labels`): the first
training call of each input shape is traced, planned (or taken from the plan cache:
`cache_dir`, default $PLANNER_CACHE_DIR or ~/.cache/planner/plans) and measured once, and the
call returns the loss (a ModelOutput holding it for a transformers model). Validation and
prediction run the model's own forward; at fit end it is back.

Every `log_every_n_steps`-th step (and the first) is measured and logged with `pl_module.log` as
`planner/peak_bytes` (measured: what the step allocated at its most) and
`planner/predicted_peak_bytes` (the plan's prediction of the same); `history` keeps them exactly.
Gradients are planned as held all step: with automatic optimization Lightning zeroes them after
`training_step`'s forward, so the last step's are alive through it (`gradient_lifetime=None`
lets the agent look at the loop instead).

Needs the `integrations` extra: pip install 'planner[torch,integrations]'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError as e:
    raise ImportError(
        f"planner.runtime.integrations.lightning needs lightning ({e}): "
        "pip install 'planner[torch,integrations]'"
    ) from None

from torch import nn

from planner.core.errors import InputError
from planner.core.limits import DEFAULT_AGENT_TIME_LIMIT_S
from planner.runtime.integrations.planned_forward import (
    PlannedForward,
    PlannerCallbackState,
)


class PlannerCallback(Callback, PlannerCallbackState):
    """Plans, applies and measures the training step of `pl_module.<module>` under `budget`:
    bytes (int; 1 is one byte), a fraction of the store-all peak (float in (0, 1]; 1.0 is all
    of it) or a budget string ('80%', '2GiB'): the one budget grammar (planner.core.budget).

    `method`, `time_limit_s`, `cache_dir`, `server` and any further `agent_options` (loss_fn,
    token, timeout_s, replan, ...) are planner.runtime.agent.plan_for's."""

    def __init__(
        self,
        budget: int | float | str,
        *,
        module: str | None = None,
        method: str = "auto",
        time_limit_s: float = DEFAULT_AGENT_TIME_LIMIT_S,
        cache_dir: str | Path | None = None,
        server: str | None = None,
        max_plans: int = 8,
        **agent_options: Any,
    ) -> None:
        self.module = module
        self._init_state(budget, max_plans, method=method, time_limit_s=time_limit_s,
                         cache_dir=cache_dir, server=server, **agent_options)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        inner = planned_module_of(pl_module, self.module)
        if self.planned is None or self.planned.model is not inner:
            loop: dict[str, Any] = {"grad_accumulation_steps": trainer.accumulate_grad_batches}
            if pl_module.automatic_optimization:
                # Lightning zeroes gradients after training_step's forward, before backward:
                # the last step's gradients are held through the forward.
                loop["gradient_lifetime"] = "step"
            options = {**loop, **self.options}
            self.planned = PlannedForward(inner, self.budget, options, self.max_plans)
        self.planned.install()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self.planned is not None:
            every = trainer.log_every_n_steps
            self.planned.arm(every > 0 and (trainer.global_step + 1) % every == 0)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.planned is not None:  # after backward: the optimizer's state is not the step's
            self.planned.finish_step(trainer.global_step + 1)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.planned is None:
            return
        # Accumulating (no optimizer step this batch): measure the window's last micro-batch,
        # whose gradients exist already, as the plan (gradients held all step) counts them.
        self.planned.restart_measure()
        record = self.planned.take_pending()
        if record is not None:
            pl_module.log_dict(record.logs(), on_step=True, on_epoch=False, batch_size=1)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.planned is not None:
            self.planned.uninstall()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_fit_end(trainer, pl_module)


def planned_module_of(pl_module: nn.Module, name: str | None) -> nn.Module:
    """`pl_module.<name>`; by default its `model` attribute, else its only child module."""
    if name is not None:
        try:
            return pl_module.get_submodule(name)
        except AttributeError:
            raise InputError(
                f"PlannerCallback(module={name!r}): {type(pl_module).__name__} has no such "
                f"submodule; its children: {_children(pl_module)}"
            ) from None
    model = getattr(pl_module, "model", None)
    if isinstance(model, nn.Module):
        return model
    children = list(pl_module.named_children())
    if len(children) == 1:
        return children[0][1]
    raise InputError(
        f"PlannerCallback: {type(pl_module).__name__} has no `model` attribute and "
        f"{len(children)} children ({_children(pl_module)}): name the module to plan, "
        "PlannerCallback(budget, module='...') ('' for the LightningModule itself)"
    )


def _children(module: nn.Module) -> str:
    return ", ".join(name for name, _ in module.named_children()) or "none"
