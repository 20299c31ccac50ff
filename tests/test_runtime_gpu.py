"""The runtime on CUDA: gradient parity with dropout, and the allocator's peak vs prediction."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_plan_matches_eager_and_prediction() -> None:
    from runtime_helpers import eager_step, planned_step

    from planner import zoo
    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=8, context=64, dim=128, layers=2, vocab=512, dropout=0.1)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    result = trace(model, inputs)
    graph = result.graph
    hi = solve(graph, 10**15, "store-all").predicted.peak_bytes
    lo = solve(graph, 10**15, "recompute-all").predicted.peak_bytes
    peaks = []
    for budget in (hi, (hi + lo) // 2):
        plan = solve(graph, budget, "auto", time_limit_s=10)
        assert plan.status.value in ("optimal", "feasible"), plan.summary()
        module = apply(model, plan, inputs, trace=result)
        ref_loss, ref_grads = eager_step(model, inputs, seed=5)
        loss, grads = planned_step(module, inputs, seed=5)
        torch.testing.assert_close(loss, ref_loss)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad)
        measured = measure_step(training_step(module, inputs), model, "cuda")
        predicted = plan.predicted.peak_bytes - graph.fixed_bytes
        # On CUDA the allocator's peak includes the gradients (kept in .grad).
        assert measured.peak_bytes <= 1.10 * (predicted + measured.gradient_bytes), (
            measured, predicted
        )
        peaks.append(measured.peak_bytes)
    assert peaks[1] < peaks[0]
