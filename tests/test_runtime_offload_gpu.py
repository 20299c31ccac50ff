"""The offload runtime on CUDA: copy streams, pinned pool, events. Every offload planner's plan
(and the boundary plans) against the prediction with the gradients counted once, gradient
parity over repeated steps, step time against the predicted makespan on measured costs and
links, and the plan side by side with torch.autograd.graph.save_on_cpu.

Traced with gradient lifetime "backward": the predicted peak holds each gradient from its
gradient node on, as the allocator does after `zero_grad(set_to_none=True)`, so the bound is
measured <= predicted peak - fixed bytes (no gradients added), within PEAK_TOLERANCE."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

# The targets in one place: benchmarks/fidelity_judge.py (predicted within 2 % of measured)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fidelity_judge import PEAK_TOLERANCE  # noqa: E402

from planner.engine.offload_checks import is_offload_method  # noqa: E402
from planner.engine.registry import method_names  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SOLVE_LIMIT_S = 5.0
OFFLOAD_METHODS = [m for m in method_names() if is_offload_method(m)]


def _setup(costs: str = "estimate") -> tuple[Any, ...]:
    from planner import zoo
    from planner.runtime.offload_measure import measured_resources
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=8, context=256, dim=512, layers=4, vocab=1024, dropout=0.1)
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
    host copies fits it), then 0.6 and 0.8 of the store-all peak for a planner that finds none
    there."""
    from planner.engine.solve import solve
    from planner.sim.simulator import simulate
    from planner.solvers.baselines import store_all as keep_all
    from planner.solvers.remat.min_budget import min_budget

    def store_all_peak_bytes(graph: Any) -> int:
        return simulate(graph, keep_all(graph)).peak_bytes

    _, _, result, resources = setup
    graph = result.graph
    store_all = store_all_peak_bytes(graph)
    least_remat = min_budget(graph, time_limit_s=SOLVE_LIMIT_S).peak_bytes
    everything = solve(graph, store_all, "offload-all", resources=resources).predicted
    assert everything is not None
    assert everything.peak_bytes < least_remat, "offload-all's plan no longer goes below remat"
    return (everything.peak_bytes + least_remat) // 2, int(0.6 * store_all), int(0.8 * store_all)


def check_offload_plan(model: Any, inputs: tuple[Any, ...], result: Any, plan: Any) -> Any:
    """Parity over repeated steps, then measured <= predicted <= budget, predicted within
    PEAK_TOLERANCE of measured; returns the module."""
    from runtime_helpers import eager_step, planned_step

    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step

    assert plan.status.value in ("optimal", "feasible") and plan.predicted is not None
    module = apply(model, plan, inputs, trace=result)
    ref_loss, ref_grads = eager_step(model, inputs, seed=5)
    for _ in range(3):  # repeated steps: pooled buffers reused, streams racing if unsafe
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
    return module


def test_cuda_offload_matches_eager_and_the_prediction(setup: tuple[Any, ...]) -> None:
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import chen_sqrt, store_all

    model, inputs, result, resources = setup
    graph = result.graph
    for base in (store_all(graph), chen_sqrt(graph)):
        plan = boundary_offload_plan(graph, base, resources, min_bytes=2**16)
        module = check_offload_plan(model, inputs, result, plan)
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
    for budget in must_offload_budget:
        plan = solve(result.graph, budget, method, time_limit_s=SOLVE_LIMIT_S,
                     resources=resources)
        if plan.status.value in ("optimal", "feasible"):
            break
    forced = budget == must_offload_budget[0]
    if forced:  # below the least remat peak only host copies can fit
        assert any(a.op is ActionOp.offload for a in plan.actions), plan.summary()
    module = check_offload_plan(model, inputs, result, plan)
    offloads = sum(a.op is ActionOp.offload for a in plan.actions)
    assert (module.last_transfer_stats.d2h_bytes > 0) == (offloads > 0)


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
