"""The fidelity suite's one-device rows: a model traced, planned by each method at each budget,
budgets store-all, the least a remat plan fits (min-budget) and midway; the plan run by
`planner.runtime.apply` over 1 or 4 micro-batches, measured by the allocator's
own records (planner.tracing.allocator_events), its gradients compared with eager's.

Accumulation over k micro-batches is what HF Trainer, Lightning and plain loops do: the
gradients from zero (`zero_grad(set_to_none=True)`), k forward/backward passes adding into
`.grad`, the optimizer after. The graph is traced with gradient_lifetime "step" for k > 1
(gradients held all step: fixed bytes) and "backward" for k = 1; the prediction compared with
the measurement is the plan's peak less what is resident before the first micro-batch
(parameters, inputs), i.e. the gradients counted once.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SEED = 7
Row = dict[str, Any]


@dataclass(frozen=True)
class DeviceCase:
    name: str  # the model's row label
    build: Callable[[], tuple[Any, tuple[Any, ...]]]
    methods: tuple[str, ...] = ("auto",)
    offload: bool = True  # an offload planner's row at the smallest budget too


def _steps(module: Any, inputs: tuple[Any, ...], microbatches: int) -> Callable[[], float]:
    """k micro-batches adding into .grad, the loss of the last."""
    def run() -> float:
        loss = 0.0
        for _ in range(microbatches):
            out = module(*inputs)
            out.backward()
            loss = float(out.detach())
        return loss
    return run


def reference(model: Any, inputs: tuple[Any, ...], microbatches: int
              ) -> tuple[float, dict[str, torch.Tensor]]:
    """Eager's loss and accumulated gradients from seed SEED."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    loss = _steps(model, inputs, microbatches)()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss, grads


def measured(model: Any, module: Any, inputs: tuple[Any, ...], microbatches: int,
             ref: dict[str, torch.Tensor]) -> Row:
    """The planned step's allocator peak above the start (gradients from none) and the
    largest gradient difference from eager's, relative to eager's largest entry."""
    from planner.tracing.allocator_events import measure_allocator_peak

    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    peak = measure_allocator_peak(_steps(module, inputs, microbatches))
    grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    scale = max((float(g.abs().max()) for g in ref.values()), default=0.0)
    missing = set(ref) ^ set(grads)
    diff = float("inf") if missing else max(
        (float((grads[n].float() - g.float()).abs().max()) for n, g in ref.items()), default=0.0)
    model.zero_grad(set_to_none=True)
    return {"meas_bytes": peak.peak_bytes, "grad_rel_diff": diff / max(scale, 1e-30)}


def device_rows(case: DeviceCase, microbatches: int, time_limit_s: float,
                emit: Callable[[Row], None]) -> None:
    """Every plan row of `case` at `microbatches` (see the module doc)."""
    from planner.core.resources import resources_preset
    from planner.runtime.apply import apply
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.tracing.api import trace

    model, inputs = case.build()
    lifetime = "backward" if microbatches == 1 else "step"
    started = time.perf_counter()
    result = trace(model, inputs, dropout_masks="graph", gradient_lifetime=lifetime,
                   grad_accumulation_steps=microbatches)
    graph = result.graph
    trace_s = time.perf_counter() - started
    before = _resident_before_bytes(graph)
    _, ref = reference(model, inputs, microbatches)
    store_peak = store_all_peak_bytes(graph)
    host = resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})
    least = _least_budget(graph, time_limit_s)
    mid = (least + store_peak) // 2
    jobs: list[tuple[str, str, int, Any]] = [("store-all", "store-all", store_peak, None)]
    jobs += [(m, label, b, None) for label, b in (("mid", mid), ("least", least))
             for m in case.methods]
    if case.offload:
        # Where the least budget is within 1 % of store-all (a tied 32k vocabulary's gradient
        # is most of the peak: held-last orders reach 0.9994 of it), midway leaves a few KB
        # that only reordering reaches, which offload-greedy does not do: it runs at store-all
        roomy = store_peak - mid > OFFLOAD_MIN_ROOM * store_peak
        jobs.append(("offload-greedy", "mid" if roomy else "store-all",
                     mid if roomy else store_peak, host))
    for method, label, budget, resources in jobs:
        row: Row = {"section": "device", "model": case.name, "mb": microbatches,
                    "method": method, "budget": label, "nodes": len(graph.nodes),
                    "trace_s": round(trace_s, 1)}
        try:
            plan = _solve(graph, budget, method, time_limit_s, resources)
            if plan.predicted is None:
                row["error"] = f"no plan ({plan.status.value})"
            else:
                row["pred_bytes"] = plan.predicted.peak_bytes - before
                module = apply(model, plan, inputs, trace=result)
                row.update(measured(model, module, inputs, microbatches, ref))
        except Exception as e:  # noqa: BLE001 - one plan's failure is its row
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            row["traceback"] = traceback.format_exc()[-1500:]
        emit(row)


OFFLOAD_MIN_ROOM = 0.01  # of store-all: the least room below it an offload row is run with
MIN_BUDGET_NODES = 800  # above: the least affordable baseline (min-budget's model at 2,308
# nodes, DenseNet-121, grew past 20 GB here)


def _least_budget(graph: Any, time_limit_s: float) -> int:
    """The least budget a remat plan fits: planner-cli min-budget's search on graphs up to
    MIN_BUDGET_NODES, else the least peak of the affordable baselines."""
    if len(graph.nodes) > MIN_BUDGET_NODES:
        from planner.engine.solve import smallest_baseline_peak_bytes

        least = smallest_baseline_peak_bytes(graph, time.perf_counter() + time_limit_s)
        if least is not None:
            return int(least)
    from planner.solvers.remat.min_budget import min_budget

    return int(min_budget(graph, time_limit_s=time_limit_s, threads=1).peak_bytes)


def _solve(graph: Any, budget: int, method: str, time_limit_s: float, resources: Any) -> Any:
    from planner.engine.solve import solve

    return solve(graph, budget, method, time_limit_s=time_limit_s, threads=1,
                 resources=resources)


def _resident_before_bytes(graph: Any) -> int:
    """What the step finds allocated: fixed bytes less the gradients counted in them
    (gradient lifetime "step": they appear during the first micro-batch's backward)."""
    ms = graph.model_state
    if ms is None or ms.gradient_lifetime == "backward":
        return int(graph.fixed_bytes)
    return int(graph.fixed_bytes - ms.total().gradients_bytes)
