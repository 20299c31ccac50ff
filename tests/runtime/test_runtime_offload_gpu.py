"""The offload runtime on CUDA: copy streams, pinned pool, events. Every offload planner's plan
(and the boundary plans) against the prediction with the gradients counted once, gradient
parity over repeated steps, step time against the predicted makespan on measured costs and
links, and the plan side by side with torch.autograd.graph.save_on_cpu.

Traced with gradient lifetime "backward": the predicted peak holds each gradient from its
gradient node on, as the allocator does after `zero_grad(set_to_none=True)`, so the bound is
measured <= predicted peak - fixed bytes (no gradients added), within PEAK_TOLERANCE."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import check_plan_on_cuda  # noqa: E402

from planner.engine.offload_checks import is_offload_method  # noqa: E402
from planner.engine.registry import method_names  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SOLVE_LIMIT_S = 5.0
OFFLOAD_METHODS = [m for m in method_names() if is_offload_method(m)]


def _setup(costs: str = "estimate", dim: int = 512, context: int = 256) -> tuple[Any, ...]:
    from planner import zoo
    from planner.runtime.offload_measure import measured_resources
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=8, context=context, dim=dim, layers=4, vocab=1024,
                            dropout=0.1)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    result = trace(model, inputs, costs=costs, dropout_masks="graph",
                   gradient_lifetime="backward")
    return model, inputs, result, measured_resources("cuda")


@pytest.fixture(scope="module")
def setup() -> tuple[Any, ...]:
    return _setup()


@pytest.fixture(scope="module")
def must_offload_budget(setup: tuple[Any, ...]) -> tuple[int, ...]:
    """A budget below the least remat plan's peak that offload-all's plan fits (no plan without
    host copies fits it) when there is one, then 0.6 and 0.8 of the store-all peak for a planner
    that finds none there. (With the CUDA workspaces traced, an attention backward's buffers can
    keep offload-all's peak above the least remat plan's: then only the larger budgets.)"""
    from planner.engine.solve import solve
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.solvers.remat.min_budget import min_budget

    _, _, result, resources = setup
    graph = result.graph
    store_all = store_all_peak_bytes(graph)
    least_remat = min_budget(graph, time_limit_s=SOLVE_LIMIT_S).peak_bytes
    everything = solve(graph, store_all, "offload-all", resources=resources).predicted
    assert everything is not None
    larger = (int(0.6 * store_all), int(0.8 * store_all))
    if everything.peak_bytes >= least_remat:
        return (0, *larger)  # no must-offload budget: the first one finds no plan
    return ((everything.peak_bytes + least_remat) // 2, *larger)


def test_cuda_offload_matches_eager_and_the_prediction(setup: tuple[Any, ...]) -> None:
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import chen_sqrt, store_all

    model, inputs, result, resources = setup
    graph = result.graph
    for base in (store_all(graph), chen_sqrt(graph)):
        plan = boundary_offload_plan(graph, base, resources, min_bytes=2**16)
        module = check_plan_on_cuda(model, inputs, result, plan, steps=3)[0]
        stats = module.last_transfer_stats
        assert plan.predicted is not None and stats.d2h_bytes > 0
        assert stats.host_peak_bytes == plan.predicted.host_peak_bytes


@pytest.mark.parametrize("method", OFFLOAD_METHODS)
def test_cuda_every_offload_planner_holds(setup: tuple[Any, ...], method: str,
                                          must_offload_budget: tuple[int, ...]) -> None:
    """Each offload planner's plan where it must offload (below every remat plan's peak), or,
    for a planner with no plan there, at the first larger budget where it has one."""
    from planner.core.plan import ActionOp
    from planner.engine.solve import solve

    model, inputs, result, resources = setup
    for budget in [b for b in must_offload_budget if b > 0]:
        plan = solve(result.graph, budget, method, time_limit_s=SOLVE_LIMIT_S,
                     resources=resources)
        if plan.status.value in ("optimal", "feasible"):
            break
    forced = budget == must_offload_budget[0] and budget > 0
    if forced:  # below the least remat peak only host copies can fit
        assert any(a.op is ActionOp.offload for a in plan.actions), plan.summary()
    module = check_plan_on_cuda(model, inputs, result, plan, steps=3)[0]
    offloads = sum(a.op is ActionOp.offload for a in plan.actions)
    assert (module.last_transfer_stats.d2h_bytes > 0) == (offloads > 0)


def test_cuda_step_time_near_the_predicted_makespan() -> None:
    from planner.runtime.apply import apply
    from planner.runtime.measure import time_steps, training_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import store_all

    # A size whose kernels, not the host's issuing of them, bound the step on any host: the
    # simulator has no CPU-issue model, and at dim 512, context 256 an H100 with a slow host
    # measured 37.4 ms against 18.2 predicted (docs/gpu_fidelity.md, "GPU tests again")
    model, inputs, result, resources = _setup(costs="measure", dim=1024, context=512)
    graph = result.graph
    plan = boundary_offload_plan(graph, store_all(graph), resources, min_bytes=2**16)
    assert plan.predicted is not None and plan.predicted.makespan_ms
    module = apply(model, plan, inputs, trace=result)
    step_ms = time_steps(training_step(module, inputs), warmup=2, repeats=5, cuda=True)
    ratio = step_ms / plan.predicted.makespan_ms
    # measured op costs leave out Python dispatch and the optimizer-free step's own overhead;
    # benchmarks/gpu_fidelity.py reports the ratio against the 5 % goal
    assert 0.75 <= ratio <= 1.25, (step_ms, plan.predicted.makespan_ms)


def test_cuda_side_by_side_with_save_on_cpu(setup: tuple[Any, ...]) -> None:
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, time_steps, training_step
    from planner.runtime.offload_measure import save_on_cpu_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import store_all

    model, inputs, result, resources = setup
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
