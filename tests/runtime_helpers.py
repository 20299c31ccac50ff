"""Helpers of the runtime tests: tiny zoo models traced once, eager reference steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from planner import zoo  # noqa: E402
from planner.core.plan import Plan  # noqa: E402
from planner.engine.registry import method_names  # noqa: E402
from planner.engine.solve import solve  # noqa: E402

# Tiny versions of the zoo models: every solver finishes in seconds on their graphs.
TINY = {
    "mlp": lambda: zoo.mlp(batch_size=4, in_features=16, hidden=32, depth=3),
    "cnn": lambda: zoo.resnet(batch_size=2, image=8, widths=(4, 8), blocks=1),
    "gpt": lambda: zoo.gpt(batch_size=2, context=8, dim=16, layers=1, vocab=32, dropout=0.2),
}
SOLVE_LIMIT_S = 3.0


@dataclass
class Traced:
    name: str
    model: Any
    inputs: tuple[Any, ...]
    trace: Any
    store_all_peak: int
    recompute_all_peak: int

    @property
    def graph(self) -> Any:
        return self.trace.graph


def traced(name: str) -> Traced:
    from planner.tracing.api import trace

    model, inputs = TINY[name]()
    result = trace(model, inputs, dropout_masks="graph")  # as the runtime runs it
    hi = solve(result.graph, 10**15, "store-all").predicted
    lo = solve(result.graph, 10**15, "recompute-all").predicted
    assert hi is not None and lo is not None
    return Traced(name, model, inputs, result, hi.peak_bytes, lo.peak_bytes)


def plan_or_skip(t: Traced, method: str, budget_bytes: int) -> Plan:
    # a renamed or removed method must fail here, not skip every test that names it
    assert method in method_names(), f"method {method!r} is not registered"
    plan = solve(t.graph, budget_bytes, method, time_limit_s=SOLVE_LIMIT_S)
    smallest = plan.details.get("smallest_feasible_bytes")
    if plan.status.value == "infeasible" and smallest and smallest < t.store_all_peak:
        # Below what this method can reach (e.g. rotor on a linearised graph): halfway between
        # its smallest feasible budget and store-all instead.
        budget_bytes = (smallest + t.store_all_peak) // 2
        plan = solve(t.graph, budget_bytes, method, time_limit_s=SOLVE_LIMIT_S)
    if plan.status.value not in ("optimal", "feasible"):
        pytest.skip(f"{method} found no plan within {budget_bytes} bytes: {plan.summary()}")
    return plan


def eager_step(model: Any, inputs: tuple[Any, ...], seed: int) -> tuple[Any, dict[str, Any]]:
    """Loss and gradients of one eager step from the RNG seed `seed`."""
    from planner.tracing.capture import compute_loss

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = compute_loss(model(*inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def planned_step(module: Any, inputs: tuple[Any, ...], seed: int) -> tuple[Any, dict[str, Any]]:
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = module(*inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)
    return loss.detach(), grads


def check_plan_on_cuda(model: Any, inputs: tuple[Any, ...], result: Any, plan: Plan,
                       steps: int = 2) -> tuple[Any, int]:
    """Gradient parity with eager over `steps` planned steps, then measured <= predicted <=
    budget, predicted within benchmarks/fidelity_judge.PEAK_TOLERANCE of measured (gradients
    counted once: traced with lifetime "backward", the prediction holds them); the module and
    the measured peak."""
    import sys
    from pathlib import Path

    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from fidelity_judge import PEAK_TOLERANCE

    assert plan.status.value in ("optimal", "feasible") and plan.predicted is not None
    module = apply(model, plan, inputs, trace=result)
    ref_loss, ref_grads = eager_step(model, inputs, seed=5)
    for _ in range(steps):  # later steps reuse the allocator's blocks, pooled buffers, streams
        loss, grads = planned_step(module, inputs, seed=5)
        torch.testing.assert_close(loss, ref_loss)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad)
    measured = measure_step(training_step(module, inputs), model, "cuda").peak_bytes
    predicted = plan.predicted.peak_bytes - result.graph.fixed_bytes  # gradients inside, once
    what = (f"{plan.method} ({plan.kind}) at {plan.budget_bytes} B: measured {measured} B, "
            f"predicted {predicted} B ({measured / predicted:.4f})")
    if plan.budget_bytes is not None:
        assert plan.predicted.peak_bytes <= plan.budget_bytes, what
    assert measured <= predicted, what
    assert predicted - measured <= PEAK_TOLERANCE * measured, what
    return module, measured
