"""The simulator and the runtime agree (issue 12): over zoo models x every registered method x
several budgets, each plan is either rejected by the simulator (not feasible) or runs in
`planner.runtime.apply` with loss and gradients equal to eager PyTorch (dropout replayed).

Each model is traced once per module; the solver methods get a short time limit (the whole
grid, 144 cases, takes about two minutes on two cores).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402
from runtime_helpers import eager_step, planned_step  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.plan import PlanStatus  # noqa: E402
from planner.core.resources import resources_preset  # noqa: E402
from planner.engine.offload_checks import is_offload_method  # noqa: E402
from planner.engine.registry import BUILTIN_METHODS, method_spec  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.sim.simulator import PlanError, simulate  # noqa: E402
from planner.solvers.baselines import store_all  # noqa: E402

MODELS: dict[str, Any] = {
    "mlp-dropout": lambda: zoo.mlp(batch_size=4, in_features=16, hidden=32, depth=2),
    "gpt": lambda: tiny_gpt(dropout=0.2),
    "resnet": lambda: zoo.resnet(batch_size=2, image=8, widths=(4, 8), blocks=1),
    "mixer": lambda: zoo.mixer(batch_size=2, image=8, patch=4, dim=16, blocks=1, dropout=0.2),
}
FRACTIONS = (1.0, 0.8, 0.6)
# Offload planners run on a machine with a host tier, at one budget
# (tests/runtime/test_runtime_offload.py covers them further): the suite's time stays bounded.
HOST = resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})
OFFLOAD_FRACTIONS = (0.6,)
TIME_LIMIT_S = 2.0
_TRACES: dict[str, Any] = {}


def _traced(name: str) -> Any:
    if name not in _TRACES:
        from planner.tracing.api import trace

        model, inputs = MODELS[name]()
        result = trace(model, inputs, level="op", dropout_masks="graph")  # as the runtime runs
        peak = simulate(result.graph, store_all(result.graph)).peak_bytes
        _TRACES[name] = (model, inputs, result, peak)
    return _TRACES[name]


def _cases() -> list[Any]:
    return [
        pytest.param(model, method, fraction, id=f"{model}-{method}-{fraction:g}")
        for model in MODELS
        for method in sorted(BUILTIN_METHODS)  # this project's methods: a plugin that another
        # test module registers is none of them (tests/conftest.py: plugin_methods)
        if not _pipeline(method)  # plans for one device: pipelines have their own tests
        for fraction in (OFFLOAD_FRACTIONS if _offloads(method) else FRACTIONS)
    ]


def _pipeline(method: str) -> bool:
    """A pipeline or FSDP method: its plans are per rank (tests/engine/test_fsdp_method.py)."""
    spec = method_spec(method)
    return spec is not None and (spec.pipeline or spec.fsdp)


def _offloads(method: str) -> bool:
    return is_offload_method(method)


@pytest.mark.parametrize(("model_name", "method", "fraction"), _cases())
@pytest.mark.slow
def test_plan_is_rejected_or_runs_like_eager(model_name: str, method: str, fraction: float
                                             ) -> None:
    model, inputs, result, store_all_peak = _traced(model_name)
    graph = result.graph
    budget = int(fraction * store_all_peak)
    resources = HOST if _offloads(method) else None
    plan = solve(graph, budget, method, time_limit_s=TIME_LIMIT_S, resources=resources)
    assert plan.status is not PlanStatus.error, f"{method} returned an invalid plan: {plan.notes}"
    if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
        # Not feasible: whatever actions it carries, the simulator must say why.
        if plan.actions:
            try:
                peak = simulate(graph, plan.actions, resources).peak_bytes
            except PlanError:
                return
            assert peak > budget, f"{method}: a plan within budget reported {plan.status}"
        return
    sim = simulate(graph, plan.actions, resources)
    assert sim.peak_bytes <= budget
    module = apply(model, plan, inputs, trace=result)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    ref_loss, ref_grads = eager_step(model, inputs, seed=4321)
    with torch.no_grad():  # BatchNorm running statistics: both steps start from the same
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    loss, grads = planned_step(module, inputs, seed=4321)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")


def test_importing_a_module_with_a_plugin_registers_nothing() -> None:
    """The grid above is this project's methods: a test module's plugin
    (tests/cli/test_offload_cli.py has one) is registered by a fixture for its own tests, never
    at import, where it joined every later `method_names()` (12 skipped cases here)."""
    import importlib.util
    from pathlib import Path

    from planner.engine.registry import method_names

    # by path: tests/cli is on sys.path only when a test there was collected first
    path = Path(__file__).resolve().parents[1] / "cli" / "test_offload_cli.py"
    spec = importlib.util.spec_from_file_location("offload_cli_module", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert "hand-offload" not in method_names()
    assert set(method_names()) == set(BUILTIN_METHODS)
    assert {c.values[1] for c in _cases()} == {m for m in BUILTIN_METHODS if not _pipeline(m)}
