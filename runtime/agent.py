"""The runtime agent: a plan for this model and budget, applied, with honest numbers.

`plan_for(model, inputs, budget, server=URL | None)`:
1. traces one training step (op level);
2. gets a plan: from the service when `server` is given (POST /v1/plans, polled until done),
   else from the on-disk cache or an in-process solve. When the service is unreachable, slow or
   failing, it falls back to the cache, then to a local baseline plan, and says so. It sends
   `token`, else $PLANNER_API_KEY, as the CLI does; a key the service refuses (401, 403) is
   ServiceRefused, one line saying what to set, never a fallback;
3. caches the plan on disk by graph hash, budget and method (a fallback baseline plan is not
   the method's: it is never cached under its name);
4. applies it and measures one calibration step (exact live storage on CPU, allocator peak on
   CUDA; RNG and buffers restored afterwards); only when that step measured more than the
   budget plus a tolerance (`replan_tolerance_bytes`: 0.5 % of the budget, at least 64 KiB)
   it plans once more, for the budget less what the trace did not see and less a margin as
   large as the excess (`tighter_budget`), and keeps the plan that measured least. Never a
   third solve: a step still over says so in one warning (or raises NoPlanFits with `strict`);
5. logs the measured step time of the first training steps next to the prediction.

The gradient lifetime traced is the one asked for (`gradient_lifetime`, or "step" with
`grad_accumulation_steps` > 1), else what the loop shows at the call: "step" when parameters
already hold gradients, else torch's default "backward". The module then checks the loop's
gradients at its steps (planner.runtime.grad_lifetime) and says when they disagree.
Every decision is a line in `module.agent_report.messages` and on the `planner.runtime.agent`
logger, and so is the progress of a solve (planner.runtime.agent_solve); httpx's line per
request is kept to WARNING unless its level was set.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.core.budget import format_bytes, parse_budget_spec
from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.limits import DEFAULT_AGENT_TIME_LIMIT_S
from planner.core.plan import Plan
from planner.engine.request import ResolvedRequest, resolve_request
from planner.engine.request_fields import agent_words
from planner.runtime.agent_solve import (
    ServiceRefused,
    ServiceUnavailable,
    ask_service,
    cache_name,
    plan_outcome,
    solve_here,
)
from planner.runtime.apply import PlannedModule, apply
from planner.runtime.grad_lifetime import kept_gradients, warn
from planner.runtime.plan_cache import USABLE, PlanCache, default_cache_dir

log = logging.getLogger("planner.runtime.agent")
FALLBACK_METHOD = "best-baseline"  # fast, no solver: what runs when the service cannot answer
# Sources whose plan is another method's than the one asked for: never cached under its name
# (a later run without the service would take FALLBACK_METHOD's plan for `auto`'s).
STAND_INS = ("fallback-baseline",)
__all__ = ["AgentReport", "ServiceRefused", "ServiceUnavailable", "plan_for"]
# A measured step may exceed the budget by this much without a re-plan (see
# replan_tolerance_bytes).
REPLAN_TOLERANCE_FRACTION = 0.005
REPLAN_TOLERANCE_MIN_BYTES = 64 * 1024
AGENT_FIELDS = agent_words()  # request field -> plan_for's keyword (time_limit_s)


@dataclass
class AgentReport:
    source: str  # service / cache / local / fallback-cache / fallback-baseline
    plan: Plan
    graph: Graph
    budget_bytes: int
    messages: list[str] = field(default_factory=list)
    measured_peak_bytes: int | None = None  # calibration step, everything the step allocated
    # the measured figure comparable with predicted_activation_bytes: the peak without the
    # gradients when the graph holds them all step (in its fixed bytes), with the gradients
    # the step creates when it holds them from backward on
    measured_activation_peak_bytes: int | None = None
    calibration_ms: float | None = None
    step_ms: list[float] = field(default_factory=list)  # first training steps, forward to forward
    requested_budget_bytes: int = 0  # the user's budget (budget_bytes: the one planned for)

    def __post_init__(self) -> None:
        if not self.requested_budget_bytes:
            self.requested_budget_bytes = self.budget_bytes

    @property
    def predicted_activation_bytes(self) -> int | None:
        if self.plan.predicted is None:
            return None
        return self.plan.predicted.peak_bytes - self.graph.fixed_bytes

    def say(self, message: str, level: int = logging.INFO) -> None:
        self.messages.append(message)
        log.log(level, message)


def plan_for(
    model: nn.Module,
    inputs: tuple[Any, ...] | Any,
    budget: int | str | float,
    server: str | None = None,
    *,
    loss_fn: Any = None,
    method: str = "auto",
    options: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    timeout_s: float = 60.0,
    time_limit_s: float = DEFAULT_AGENT_TIME_LIMIT_S,
    token: str | None = None,
    calibrate: bool = True,
    replan: bool = True,
    log_steps: int = 3,
    gradient_lifetime: str | None = None,
    grad_accumulation_steps: int = 1,
    strict: bool = False,
) -> PlannedModule:
    """A PlannedModule for `model` within `budget`, in the one budget grammar
    (planner.core.budget): an int is bytes (1 is one byte), a float a fraction of the store-all
    peak in (0, 1] (1.0 is all of it), a string '2GiB', '80%' or '0.8'. Checked before the
    model is traced: a bad budget is one InputError naming `budget`.

    With `calibrate`, one measured step checks the plan; with `replan` as well, a step that
    measured more than the budget plus `replan_tolerance_bytes` is planned once more for
    `tighter_budget`, and the plan that measured least is kept (and cached for this budget, so
    the next run starts from it). A step still over the budget plus the tolerance is one
    warning with the numbers, or NoPlanFits with `strict`.

    `gradient_lifetime` / `grad_accumulation_steps` as for planner.tracing.trace; neither given,
    parameters that already hold gradients mean "step" (the loop keeps them).

    `options`: the method's options (`planner-cli methods`), checked as every entry point
    checks them (planner.engine.request) and sent to the service with the request; a plan
    made with options is cached apart from the method's default one."""
    from planner.tracing.api import trace as trace_fn

    parse_budget_spec(budget, "budget")  # before the trace: a bad budget fails at once
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    observed = (gradient_lifetime is None and grad_accumulation_steps == 1
                and kept_gradients(model))
    # Dropout masks sized as the runtime (the joint graph) keeps them.
    traced = trace_fn(model, inputs, loss_fn=loss_fn, level="op", dropout_masks="graph",
                      gradient_lifetime="step" if observed else gradient_lifetime,
                      grad_accumulation_steps=grad_accumulation_steps)
    graph = traced.graph
    try:  # a method only the service knows is checked there
        request = resolve_request(graph, budget, method=method, options=options,
                                  time_limit=time_limit_s, method_here=server is None)
    except InputError as e:
        raise e.renamed(AGENT_FIELDS) from None
    cache = PlanCache(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    cached_as = cache_name(request)  # the method, and its options when given

    def planned(planning_budget: int) -> tuple[PlannedModule, AgentReport]:
        report = _obtain(replace(request, budget_bytes=planning_budget), server, cache,
                         timeout_s, token)
        plan = report.plan
        if plan.status not in USABLE:
            smallest = plan.details.get("smallest_feasible_bytes")
            raise NoPlanFits(
                f"no plan fits {format_bytes(planning_budget)} ({plan.method}: "
                f"{plan.status.value}); smallest feasible found: {format_bytes(smallest)}",
                smallest,
            )
        if report.source not in STAND_INS:
            cache.put(graph, planning_budget, cached_as, plan)
        module = apply(model, plan, inputs, trace=traced)
        object.__setattr__(module, "agent_report", report)
        module.gradient_lifetime_check.say = _both(report.say, warn)
        predicted = plan.predicted
        lifetime = graph.model_state.gradient_lifetime if graph.model_state else "step"
        report.say(
            f"plan {plan.summary()} from {report.source}; predicted peak "
            f"{format_bytes(predicted.peak_bytes if predicted else None)} incl. "
            f"{format_bytes(graph.fixed_bytes)} fixed; gradient lifetime {lifetime}"
            + (" (the parameters hold gradients already)" if observed else "")
        )
        return module, report

    module, report = planned(request.budget_bytes)
    if calibrate:
        _calibrate(module, model, inputs, report)
        if replan and tighter_budget(report) is not None:
            module, report = _replan(planned, module, report, model, inputs)
            kept_retry = report.budget_bytes != request.budget_bytes
            if kept_retry and report.source not in STAND_INS:
                cache.put(graph, request.budget_bytes, cached_as, report.plan)
        _judge_fit(report, strict)
    if log_steps > 0:
        _StepTimer(module, report, log_steps).install()
    return module


def _both(*sinks: Callable[[str], None]) -> Callable[[str], None]:
    def say(message: str) -> None:
        for sink in sinks:
            sink(message)

    return say


def replan_tolerance_bytes(budget_bytes: int) -> int:
    """How far a measured step may exceed the budget without a re-plan: 0.5 % of the budget,
    at least 64 KiB. Less buys nothing a user sees (CUDA's caching allocator reserves several
    % above what it allocates) and costs a full solve; the floor covers the small tensors a
    trace does not see (the loss, RNG state, 512 B blocks on CUDA)."""
    return max(int(REPLAN_TOLERANCE_FRACTION * budget_bytes), REPLAN_TOLERANCE_MIN_BYTES)


def measured_excess_bytes(report: AgentReport) -> int | None:
    """How far the calibration step measured above the user's budget (< 0: below it)."""
    measured = report.measured_activation_peak_bytes
    if measured is None:
        return None
    return measured - (report.requested_budget_bytes - report.graph.fixed_bytes)


def tighter_budget(report: AgentReport) -> int | None:
    """The one re-plan's budget when the calibration step exceeded the user's budget by more
    than `replan_tolerance_bytes`; None when it did not or nothing tighter is possible.

    budget - (measured - predicted) - (measured - budget): the first term takes off what the
    traced graph does not see, so that the new plan measures its prediction plus that; the
    margin, as large as the excess measured, covers that amount changing with a plan that
    recomputes other nodes (so the new plan aims as far below the budget as the first measured
    above it)."""
    over = measured_excess_bytes(report)
    measured = report.measured_activation_peak_bytes
    predicted = report.predicted_activation_bytes
    if (over is None or measured is None or predicted is None
            or over <= replan_tolerance_bytes(report.requested_budget_bytes)):
        return None
    unseen = max(0, measured - predicted)
    tighter = report.requested_budget_bytes - unseen - over
    if tighter <= report.graph.fixed_bytes:
        return None
    return tighter if tighter < report.budget_bytes else None


def _replan(
    planned: Callable[[int], tuple[PlannedModule, AgentReport]],
    module: PlannedModule,
    report: AgentReport,
    model: nn.Module,
    inputs: tuple[Any, ...],
) -> tuple[PlannedModule, AgentReport]:
    """Plan once more for `tighter_budget(report)`; keep the plan whose step measured least."""
    tighter = tighter_budget(report)
    assert tighter is not None
    over = measured_excess_bytes(report) or 0
    unseen = (report.measured_activation_peak_bytes or 0) - (
        report.predicted_activation_bytes or 0)
    report.say(
        f"the measured step exceeds the budget by {format_bytes(over)} (tolerance "
        f"{format_bytes(replan_tolerance_bytes(report.requested_budget_bytes))}): planning "
        f"again, once, for {format_bytes(tighter)} (the budget less the "
        f"{format_bytes(unseen)} the trace does not see, less a {format_bytes(over)} margin)"
    )
    try:
        retry_module, retry = planned(tighter)
    except NoPlanFits as e:
        report.say(f"no plan fits the tighter budget ({e})")
        return module, report
    retry.requested_budget_bytes = report.requested_budget_bytes
    report.messages.extend(retry.messages)
    retry.messages = report.messages  # one log for both attempts
    _calibrate(retry_module, model, inputs, retry)
    if (retry.measured_activation_peak_bytes or 0) < (report.measured_activation_peak_bytes or 0):
        return retry_module, retry
    report.say("kept the first plan: the step measured less with it")
    return module, report


def _judge_fit(report: AgentReport, strict: bool) -> None:
    """One line on how the kept plan's measured step compares with the user's budget: a warning
    when it exceeds it by more than the tolerance (NoPlanFits with `strict`)."""
    over = measured_excess_bytes(report)
    if over is None or over <= 0:
        if over is not None and report.budget_bytes != report.requested_budget_bytes:
            report.say(f"kept the plan for {format_bytes(report.budget_bytes)}: the step fits "
                       "the budget as measured")
        return
    budget = report.requested_budget_bytes
    tolerance = replan_tolerance_bytes(budget)
    measured = report.graph.fixed_bytes + (report.measured_activation_peak_bytes or 0)
    predicted = report.plan.predicted
    numbers = (f"measured {format_bytes(measured)}, predicted "
               f"{format_bytes(predicted.peak_bytes if predicted else None)}, budget "
               f"{format_bytes(budget)} ({format_bytes(over)} over, tolerance "
               f"{format_bytes(tolerance)})")
    if over <= tolerance:
        report.say(f"the measured step is within the re-plan tolerance: {numbers}")
    elif strict:
        message = (f"the measured step exceeds the budget: {numbers}; give a budget of at least "
                   f"{format_bytes(measured)}, or strict=False to run with this plan")
        report.say(message, logging.ERROR)
        raise NoPlanFits(message, measured)
    else:
        report.say(f"the measured step exceeds the budget: {numbers}; running with this plan",
                   logging.WARNING)


# -- getting a plan ------------------------------------------------------------------------------
def _obtain(
    request: ResolvedRequest, server: str | None, cache: PlanCache, timeout_s: float,
    token: str | None,
) -> AgentReport:
    graph, budget_bytes, method = request.graph, request.budget_bytes, request.method
    cached_as = cache_name(request)

    def report(source: str, plan: Plan) -> AgentReport:
        return AgentReport(source, plan, graph, budget_bytes)

    if server is not None:
        started = time.monotonic()
        try:
            plan = ask_service(server, graph, budget_bytes, method, timeout_s,
                               request.time_limit_s, token, options=request.options)
            out = report("service", plan)
            out.say(f"plan from the service at {server}: "
                    f"{plan_outcome(plan, time.monotonic() - started)}")
            return out
        except ServiceUnavailable as e:
            reason = str(e)
        cached = cache.get(graph, budget_bytes, cached_as)
        if cached is not None:
            out = report("fallback-cache", cached)
            path = cache.path_of(graph, budget_bytes, cached_as)
            out.say(f"service unavailable ({reason}); using the cached plan {path}")
            return out
        baseline = replace(request, method=FALLBACK_METHOD, options={})
        plan, _ = solve_here(baseline, f"service unavailable: solving with {FALLBACK_METHOD}")
        out = report("fallback-baseline", plan)
        out.say(
            f"service unavailable ({reason}); no cached plan: using the local baseline "
            f"{FALLBACK_METHOD} ({plan.details.get('backend', plan.backend)})"
        )
        return out
    cached = cache.get(graph, budget_bytes, cached_as)
    if cached is not None:
        out = report("cache", cached)
        out.say(f"cached plan {cache.path_of(graph, budget_bytes, cached_as)}")
        return out
    plan, outcome = solve_here(request, f"solving in-process with {method}")
    out = report("local", plan)
    out.say(f"solved in-process with {method}: {outcome}")
    return out


# -- measuring ------------------------------------------------------------------------------------
def _calibrate(
    module: PlannedModule, model: nn.Module, inputs: tuple[Any, ...], report: AgentReport
) -> None:
    """One measured step; the RNG, buffers and gradients are as before afterwards."""
    from planner.runtime.measure import measure_step, training_step

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    grads = {n: p.grad for n, p in model.named_parameters()}
    try:
        measured = measure_step(training_step(module, inputs), model, device)
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])
        for n, p in model.named_parameters():
            p.grad = grads[n]
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
        module.gradient_lifetime_check.reset()  # the user's loop has not run yet
    # The calibration step starts without gradients and creates them in backward: with a graph
    # that holds them from backward on, the prediction counts them too.
    late = bool(report.graph.index.model_state_resident[1])
    comparable = measured.peak_bytes if late else measured.activation_peak_bytes
    report.measured_peak_bytes = measured.peak_bytes
    report.measured_activation_peak_bytes = comparable
    report.calibration_ms = measured.duration_ms
    predicted = report.predicted_activation_bytes
    ratio = f" ({comparable / predicted:.2f}× predicted)" if predicted else ""
    what = "activations and the gradients made in backward" if late else "activations"
    report.say(
        f"measured step: {what} {format_bytes(comparable)}{ratio}, "
        f"predicted {format_bytes(predicted)}; with gradients "
        f"{format_bytes(measured.peak_bytes)}; budget {format_bytes(report.budget_bytes)}"
    )


class _StepTimer:
    """Times the first steps (forward to next forward) and logs them once."""

    def __init__(self, module: PlannedModule, report: AgentReport, steps: int) -> None:
        self.module, self.report, self.steps = module, report, steps
        self.last: float | None = None
        self.handle: Any = None

    def install(self) -> None:
        self.handle = self.module.register_forward_pre_hook(self._tick)

    def _tick(self, *_: Any) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.report.step_ms.append((now - self.last) * 1e3)
        self.last = now
        if len(self.report.step_ms) >= self.steps:
            self.handle.remove()
            predicted = self.report.plan.predicted
            overhead = f"{100 * predicted.overhead:+.1f}%" if predicted else "?"
            self.report.say(
                f"first {len(self.report.step_ms)} steps: median "
                f"{statistics.median(self.report.step_ms):.1f} ms per step; predicted "
                f"recomputation overhead {overhead}"
            )
