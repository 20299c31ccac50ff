"""The offload runtime on CUDA: copy streams, pinned pool, events. Gradient parity, the
allocator's peak against the simulator's (≤ 1.05x), step time against the predicted makespan on
measured costs and links, and the plan side by side with torch.autograd.graph.save_on_cpu."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _setup(costs: str = "estimate") -> tuple[Any, ...]:
    from planner import zoo
    from planner.runtime.offload_measure import measured_resources
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=8, context=256, dim=512, layers=4, vocab=1024, dropout=0.1)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    result = trace(model, inputs, costs=costs, dropout_masks="graph")
    return model, inputs, result, measured_resources("cuda")


def test_cuda_offload_matches_eager_and_the_prediction() -> None:
    from runtime_helpers import eager_step, planned_step

    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import chen_sqrt, store_all

    model, inputs, result, resources = _setup()
    graph = result.graph
    for base in (store_all(graph), chen_sqrt(graph)):
        plan = boundary_offload_plan(graph, base, resources, min_bytes=2**16)
        assert plan.predicted is not None
        module = apply(model, plan, inputs, trace=result)
        ref_loss, ref_grads = eager_step(model, inputs, seed=5)
        for _ in range(3):  # repeated steps: pooled buffers reused, streams racing if unsafe
            loss, grads = planned_step(module, inputs, seed=5)
            torch.testing.assert_close(loss, ref_loss)
            for name, grad in ref_grads.items():
                torch.testing.assert_close(grads[name], grad)
        stats = module.last_transfer_stats
        assert stats.d2h_bytes > 0 and stats.host_peak_bytes == plan.predicted.host_peak_bytes
        measured = measure_step(training_step(module, inputs), model, "cuda")
        predicted = plan.predicted.peak_bytes - graph.fixed_bytes
        # the allocator's peak includes the gradients (kept in .grad)
        assert measured.peak_bytes <= 1.05 * (predicted + measured.gradient_bytes), (
            measured, predicted)


def test_cuda_step_time_near_the_predicted_makespan() -> None:
    from planner.runtime.apply import apply
    from planner.runtime.measure import time_steps, training_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import store_all

    model, inputs, result, resources = _setup(costs="measure")
    graph = result.graph
    plan = boundary_offload_plan(graph, store_all(graph), resources, min_bytes=2**16)
    assert plan.predicted is not None and plan.predicted.makespan_ms
    module = apply(model, plan, inputs, trace=result)
    step_ms = time_steps(training_step(module, inputs), warmup=2, repeats=5, cuda=True)
    ratio = step_ms / plan.predicted.makespan_ms
    # measured op costs leave out Python dispatch and the optimizer-free step's own overhead;
    # the benchmark (benchmarks/offload_runtime_gpu.py) reports the ratio against the 10% goal
    assert 0.75 <= ratio <= 1.25, (step_ms, plan.predicted.makespan_ms)


def test_cuda_side_by_side_with_save_on_cpu() -> None:
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, time_steps, training_step
    from planner.runtime.offload_measure import save_on_cpu_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import store_all

    model, inputs, result, resources = _setup()
    graph = result.graph
    plan = boundary_offload_plan(graph, store_all(graph), resources, min_bytes=2**16)
    module = apply(model, plan, inputs, trace=result)
    baseline = save_on_cpu_step(model, inputs)
    ours_mem = measure_step(training_step(module, inputs), model, "cuda")
    theirs_mem = measure_step(baseline, model, "cuda")
    ours_ms = time_steps(training_step(module, inputs), warmup=2, repeats=5, cuda=True)
    theirs_ms = time_steps(baseline, warmup=2, repeats=5, cuda=True)
    # save_on_cpu copies on the compute stream (no overlap) and moves the weights it saves too
    assert ours_ms <= 1.10 * theirs_ms, (ours_ms, theirs_ms)
    assert ours_mem.peak_bytes <= 1.5 * theirs_mem.peak_bytes, (ours_mem, theirs_mem)
