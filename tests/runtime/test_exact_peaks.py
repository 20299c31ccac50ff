"""Measured <= predicted, to the byte, on CPU (exact storage accounting) for every plan kind,
and no more than a few bytes under: the regressions the GPU runs found as KiB over the
prediction — BatchNorm's new running statistics held to the end of the forward, the unused
outputs of a multi-output op kept in its tuple, and tuple elements travelling in a host copy
past their own node's free."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import Traced  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.resources import resources_preset  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.runtime.measure import measure_step, training_step  # noqa: E402
from planner.runtime.offload_plans import boundary_offload_plan  # noqa: E402
from planner.solvers.baselines import chen_sqrt  # noqa: E402

RESOURCES = resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})
_CACHE: dict[str, Traced] = {}


# Small, but large enough that every offload planner has a plan at 0.6 of store-all's peak.
MODELS = {
    "cnn": lambda: zoo.resnet(batch_size=8, image=32, widths=(16, 32), blocks=1),
    "gpt": lambda: zoo.gpt(batch_size=4, context=32, dim=64, layers=2, vocab=128, dropout=0.1),
}
UNDER_FRACTION = 0.001  # measured may sit this far under the prediction (a loss scalar)


def model_named(name: str) -> Traced:
    from planner.tracing.api import trace

    if name not in _CACHE:
        model, inputs = MODELS[name]()
        result = trace(model, inputs, dropout_masks="graph")
        _CACHE[name] = Traced(name, model, inputs, result, 0, 0)
    return _CACHE[name]


def assert_holds(what: tuple[str, str], measured: int, predicted: int) -> None:
    assert measured <= predicted, (*what, measured, predicted)
    assert predicted - measured <= UNDER_FRACTION * predicted, (*what, measured, predicted)


def measured_and_predicted(t: Traced, plan: object) -> tuple[int, int]:
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    for _ in range(2):  # pooled host buffers and element drops settle in the first steps
        t.model.zero_grad(set_to_none=True)
        training_step(module, t.inputs)()
    t.model.zero_grad(set_to_none=True)
    # the allocator's count where it is the larger (a convolution's workspace: issue 47)
    measured = measure_step(training_step(module, t.inputs), t.model, "cpu").measured_peak_bytes
    return measured, plan.predicted.peak_bytes - t.graph.fixed_bytes  # type: ignore[attr-defined]


# Known gap (issue 47, found by the allocator's count): a GPT with dropout whose plan
# recomputes part of it measures a few bytes over its prediction, chen-sqrt 859,156 against
# 859,148 B: 8 B, a wrapped Python scalar that autograd saves and no graph node holds (the
# CPU generator states the runtime keeps for replays were 8 x 5,056 B more; they are host
# memory now, and recompute-all is exact).
GAP = pytest.mark.xfail(strict=True, reason="a saved scalar no graph node holds (8 B)")


def _cases(methods: list[str], gaps: set[str]) -> list[Any]:
    return [pytest.param(model, method, marks=[GAP] if model == "gpt" and method in gaps else [])
            for model in ("cnn", "gpt") for method in methods]


@pytest.mark.parametrize(("model", "method"), _cases(
    ["store-all", "recompute-all", "chen-sqrt"], {"chen-sqrt"}))
def test_remat_plans_measure_their_prediction(model: str, method: str) -> None:
    t = model_named(model)
    plan = solve(t.graph, 10**15, method)
    assert_holds((model, method), *measured_and_predicted(t, plan))


@pytest.mark.parametrize(("model", "method"), _cases(
    ["boundary", "offload-all", "offload-beaumont", "offload-milp"], {"boundary"}))
def test_offload_plans_measure_their_prediction(model: str, method: str) -> None:
    t = model_named(model)
    graph = t.graph
    if method == "boundary":  # host copies over a plan that recomputes
        plan = boundary_offload_plan(graph, chen_sqrt(graph), RESOURCES, min_bytes=2**10)
    else:
        plan = solve(graph, int(0.6 * store_all_peak(t)), method, resources=RESOURCES,
                     time_limit_s=3)
        assert plan.predicted is not None, plan.summary()
    assert_holds((model, method), *measured_and_predicted(t, plan))


def store_all_peak(t: Traced) -> int:
    plan = solve(t.graph, 10**15, "store-all")
    assert plan.predicted is not None
    return plan.predicted.peak_bytes
