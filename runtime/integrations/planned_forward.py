"""A model's `forward` swapped for a planned training step: what both trainer callbacks share.

`PlannedForward(model, budget, ...).install()` puts a callable in `model.forward` (an instance
attribute; `uninstall()` restores what was there). In training (module in train mode, grad
enabled) a call is planned at its first use of a new signature (tensor shapes, dtypes and
devices; plain keyword values such as `use_cache=False`; which arguments are the same tensor):
planner.runtime.agent.plan_for traces the call, resolves the budget (bytes, or a fraction of
the store-all peak), takes the plan from the on-disk cache or solves, applies it and measures
one calibration step. Later calls with that signature run the planned step. Evaluation and
no-grad calls run the model's own forward.

The planned step ends at the loss, so the model must compute its loss: a transformers model
needs `labels` (it then returns a ModelOutput holding the loss only); any other module must
return the loss, or an output with `.loss` (the loss tensor is returned).

RNG and buffers are as before after planning (tracing runs the model's forward once), so a
planned run draws the same dropout masks as an eager run from the same seed.

`StepMeter` measures the steps a trainer logs: the allocator's peak on CUDA; on CPU the exact
live storage (as planner.runtime.measure; it costs time on every op: armed steps only). Its
figure, like the predicted one reported with it, is what the step allocates: activations, and
the gradients it creates when the plan's graph charges them from backward on (not when it holds
them all step, in its fixed memory); memory held before the step (parameters, optimizer state)
is in neither.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from planner.core.budget import parse_budget_spec
from planner.core.errors import InputError
from planner.runtime.measure import _EventTracker, _gradient_storages  # the agent's measurement

log = logging.getLogger("planner.runtime.integrations")
PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


def checked_budget(budget: int | float | str, where: str) -> int | float | str:
    """`budget` as given, checked by the budget grammar (planner.core.budget) now rather than
    at the first training step: an int is bytes (1 is one byte), a float a fraction of the
    store-all peak in (0, 1], a string the grammar ('80%', '2GiB')."""
    try:
        parse_budget_spec(budget)
    except InputError as e:
        raise e.renamed({"budget": f"{where}(budget=...)"}) from None
    return budget


# -- the call's layout ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CallLayout:
    """Where each tensor of a call goes; plain values are part of the layout (baked in)."""

    args: tuple[tuple[str, Any], ...]  # ("tensor", index) or ("value", value)
    kwargs: tuple[tuple[str, tuple[str, Any]], ...]
    key: tuple[Any, ...]  # equal keys: the same plan serves both calls

    def rebuild(self, tensors: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
        def value(slot: tuple[str, Any]) -> Any:
            return tensors[slot[1]] if slot[0] == "tensor" else slot[1]

        return [value(s) for s in self.args], {k: value(s) for k, s in self.kwargs}


def split_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[CallLayout, tuple[Any, ...]]:
    """The layout of `model(*args, **kwargs)` and its distinct tensors, in order."""
    tensors: list[torch.Tensor] = []
    where: dict[int, int] = {}  # id(tensor) -> index: one input for a tensor passed twice

    def slot(name: str, v: Any) -> tuple[str, Any]:
        if isinstance(v, torch.Tensor):
            if id(v) not in where:
                where[id(v)] = len(tensors)
                tensors.append(v)
            return ("tensor", where[id(v)])
        if isinstance(v, PLAIN) or (isinstance(v, tuple) and all(isinstance(x, PLAIN) for x in v)):
            return ("value", v)
        raise InputError(
            f"planned forward: argument {name} is a {type(v).__name__}; a planned step takes "
            "tensors and plain values (numbers, strings, None): pass tensors, or leave the "
            "trainer without the planner for this model"
        )

    arg_slots = tuple(slot(f"#{i}", v) for i, v in enumerate(args))
    kw_slots = tuple((k, slot(k, v)) for k, v in sorted(kwargs.items()))
    shapes = tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)
    layout = CallLayout(arg_slots, kw_slots, (arg_slots, kw_slots, shapes))
    return layout, tuple(tensors)


class _CallWith(nn.Module):
    """`inner` called as the trainer called it, from the call's tensors only (what is traced),
    returning its loss.

    The loss is taken here, inside the traced model, so that the tracer's own loss step (a sum
    of this scalar, outside the model) is the graph's loss node: a loss computed by the model
    (transformers' `.loss`, divided by `num_items_in_batch`) would otherwise leave the graph
    without one, and nothing would keep a backward op that reads only the incoming gradient
    from being planned before the loss."""

    layout: CallLayout  # plain attributes (object.__setattr__: not registered by nn.Module)
    loss_fn: Any

    def __init__(self, inner: nn.Module, layout: CallLayout, loss_fn: Any = None) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "loss_fn", loss_fn)

    def forward(self, *tensors: Any) -> torch.Tensor:
        from planner.tracing.capture import compute_loss

        args, kwargs = self.layout.rebuild(tensors)
        return compute_loss(self.inner(*args, **kwargs), self.loss_fn)


# -- measuring ------------------------------------------------------------------------------------
class StepMeter:
    """Peak bytes a step allocates, from `start` (the planned forward) to `stop` (the callback,
    after backward, before the optimizer step), for armed steps."""

    def __init__(self) -> None:
        self.armed = False
        self._device: torch.device | None = None
        self._tracker: _EventTracker | None = None
        self._base_bytes = 0

    @property
    def active(self) -> bool:
        return self._device is not None

    def start(self, device: torch.device) -> None:
        if not self.armed or self.active:
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self._base_bytes = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            self._tracker = _EventTracker()
            self._tracker.__enter__()
        self._device = device

    def stop(self, model: nn.Module | None = None) -> tuple[int, int] | None:
        """(peak, peak without `model`'s gradient storages) since `start`, None when nothing
        was measured; disarms. On CUDA both are the allocator's peak (gradients that replace
        earlier ones reuse their memory)."""
        self.armed = False
        device, self._device = self._device, None
        if device is None:
            return None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            peak = int(torch.cuda.max_memory_allocated(device)) - self._base_bytes
            return peak, peak
        tracker, self._tracker = self._tracker, None
        assert tracker is not None
        tracker.__exit__(None, None, None)
        tracker.sweep()
        grads = set(_gradient_storages(model)) if model is not None else set()
        return tracker.peak_bytes, tracker.peak_without(grads)


@dataclass(frozen=True)
class PeakRecord:
    step: int
    peak_bytes: int  # measured: what the step allocated at its most
    predicted_peak_bytes: int  # the plan's predicted peak less the graph's fixed memory
    budget_bytes: int  # the user's budget (fixed memory included)

    def logs(self) -> dict[str, float]:
        return {"planner/peak_bytes": float(self.peak_bytes),
                "planner/predicted_peak_bytes": float(self.predicted_peak_bytes)}


class PlannerCallbackState:
    """What both trainer callbacks hold (planner.runtime.integrations.hf_trainer, .lightning):
    the checked budget, the agent's options, and the planned forward once the run starts."""

    def _init_state(self, budget: int | float | str, max_plans: int,
                    **options: Any) -> None:
        self.budget = checked_budget(budget, "PlannerCallback")
        self.options: dict[str, Any] = options  # planner.runtime.agent.plan_for's keywords
        self.max_plans = max_plans
        self.planned: PlannedForward | None = None

    @property
    def history(self) -> list[PeakRecord]:
        """Every measured step: step, measured and predicted peak, budget."""
        return self.planned.history if self.planned is not None else []

    @property
    def reports(self) -> list[Any]:
        """The agent's report of each plan in use (source: local, cache, service, ...)."""
        return self.planned.reports if self.planned is not None else []


# -- the swapped forward --------------------------------------------------------------------------
@dataclass(eq=False, repr=False)
class PlannedForward:
    """`model.forward` while installed; plans per call signature (see the module docstring).

    `plan_options` go to planner.runtime.agent.plan_for (method, time_limit_s, cache_dir,
    server, grad_accumulation_steps, ...); at most `max_plans` signatures are planned, later
    new ones run unplanned (with a warning): dynamic padding would otherwise plan every step.
    """

    model: nn.Module
    budget: int | float | str
    plan_options: dict[str, Any] = field(default_factory=dict)
    max_plans: int = 8
    modules: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # key -> PlannedModule
    history: list[PeakRecord] = field(default_factory=list)
    meter: StepMeter = field(default_factory=StepMeter)
    _previous: Any = None  # model.__dict__["forward"] before install (None: the class's)
    _installed: bool = False
    _last_module: Any = None  # the PlannedModule of the step being measured
    _pending: PeakRecord | None = None
    _warned: bool = False

    def install(self) -> None:
        if self._installed:
            return
        self._previous = self.model.__dict__.get("forward")
        # functools.update_wrapper: inspect.signature(model.forward) still shows the original.
        functools.update_wrapper(self, self._original)
        object.__setattr__(self.model, "forward", self)
        self._installed = True

    def uninstall(self) -> None:
        if self.meter.active:
            self.meter.stop()
        if not self._installed:
            return
        if self._previous is None:
            self.model.__dict__.pop("forward", None)
        else:
            object.__setattr__(self.model, "forward", self._previous)
        self._installed = False

    @property
    def _original(self) -> Any:
        if self._previous is not None:
            return self._previous
        return type(self.model).forward.__get__(self.model)

    @property
    def reports(self) -> list[Any]:
        """The agent's report of each plan in use (planner.runtime.agent.AgentReport)."""
        return [m.agent_report for m in self.modules.values()]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.model.training and torch.is_grad_enabled()):
            return self._original(*args, **kwargs)
        layout, tensors = split_call(args, kwargs)
        module = self.modules.get(layout.key)
        if module is None:
            if len(self.modules) >= self.max_plans:
                self._warn_unplanned()
                return self._original(*args, **kwargs)
            module = self._plan(layout, tensors, kwargs)
        self._last_module = module
        self.meter.start(_device_of(self.model, tensors))
        loss = module(*tensors)
        return _as_model_returns(self.model, loss, kwargs)

    def _plan(self, layout: CallLayout, tensors: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from planner.runtime.agent import plan_for

        if _is_transformers_model(self.model) and "labels" not in kwargs:
            raise InputError(
                f"planned forward: {type(self.model).__name__} is called without labels, so it "
                "returns no loss (the Trainer's label_smoothing_factor or compute_loss_func take "
                "them out): a planned step ends at the model's loss; drop those options"
            )
        if self.meter.active:  # tracing must not run under the measuring mode
            self.restart_measure()
        log.info("planning %s for inputs %s", type(self.model).__name__,
                 ", ".join(f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                           for t in tensors))
        options = dict(self.plan_options)
        traced = _CallWith(self.model, layout, options.pop("loss_fn", None))
        with self._detached(), preserved_state(self.model):
            module = plan_for(traced, tensors, self.budget, log_steps=0, **options)
        self.modules[layout.key] = module
        return module

    @contextlib.contextmanager
    def _detached(self) -> Iterator[None]:
        """The model's own forward while it is traced and measured (not this one)."""
        installed = self._installed
        self.uninstall()
        try:
            yield
        finally:
            if installed:
                self.install()

    def _warn_unplanned(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "planned forward: %d input signatures planned already; new ones run without "
                "a plan (pad batches to a few fixed shapes to keep every step planned)",
                self.max_plans,
            )

    # -- the trainer's steps ----------------------------------------------------------------
    def arm(self, will_log: bool) -> None:
        """Measure the coming step when the trainer logs it, and the first planned step."""
        self.meter.armed = will_log or not self.history

    def restart_measure(self) -> None:
        """Drop what an armed step measured so far; measure again from the next call."""
        if self.meter.armed or self.meter.active:
            self.meter.stop()
            self.meter.armed = True

    def finish_step(self, step: int) -> PeakRecord | None:
        """Stop measuring (after backward); the record of the step when it was measured."""
        measured = self.meter.stop(self.model)
        module, self._last_module = self._last_module, None
        if measured is None or module is None:
            return None
        report = module.agent_report
        # As the agent compares: gradients made in backward count when the graph charges them
        # from backward on; a graph holding them all step has them in its fixed memory.
        late = bool(report.graph.index.model_state_resident[1])
        record = PeakRecord(step, measured[0] if late else measured[1],
                            report.predicted_activation_bytes or 0, report.requested_budget_bytes)
        self.history.append(record)
        self._pending = record
        return record

    def take_pending(self) -> PeakRecord | None:
        """The measured step not yet reported, once."""
        record, self._pending = self._pending, None
        return record


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """RNG (CPU, CUDA) and buffers as before: tracing runs one forward (dropout, batch norm)."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                if k in buffers:
                    v.copy_(buffers[k])
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _device_of(model: nn.Module, tensors: tuple[Any, ...]) -> torch.device:
    param = next(model.parameters(), None)
    if param is not None:
        return param.device
    return tensors[0].device if tensors else torch.device("cpu")


def _is_transformers_model(model: nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def _as_model_returns(model: nn.Module, loss: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    """What the caller expects back: a transformers ModelOutput (or tuple, with
    return_dict=False) holding the loss; any other module returned its loss."""
    if not _is_transformers_model(model):
        return loss
    if kwargs.get("return_dict") is False:
        return (loss,)
    return _planned_output_class()(loss=loss)


@functools.cache
def _planned_output_class() -> type:
    from transformers.utils import ModelOutput

    @dataclass
    class PlannedOutput(ModelOutput):
        """A planned training step's output: the loss (logits are not kept by the plan)."""

        loss: torch.Tensor | None = None

    return PlannedOutput
