"""planner.runtime.agent.plan_for: against a real service on loopback, no service, and a dead
URL."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import TINY, eager_step, planned_step  # noqa: E402

from planner.core.errors import NoPlanFits  # noqa: E402
from planner.runtime.agent import plan_for  # noqa: E402


def _check_module(module, model, inputs) -> None:
    ref_loss, ref_grads = eager_step(model, inputs, seed=3)
    loss, grads = planned_step(module, inputs, seed=3)
    torch.testing.assert_close(loss, ref_loss)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad)


@pytest.mark.slow
def test_local_solve_then_cache_then_dead_url(tmp_path: Path) -> None:
    model, inputs = TINY["mlp"]()
    # Gradients held from backward on (the default): this weight-bound MLP peaks at the end of
    # backward, where every gradient is held and no recomputation helps, so store-all's peak is
    # the least any plan reaches.
    module = plan_for(model, inputs, 1.0, cache_dir=tmp_path, method="auto", time_limit_s=3)
    report = module.agent_report
    assert report.source == "local"
    assert report.plan.predicted.peak_bytes <= report.budget_bytes
    assert report.measured_activation_peak_bytes is not None
    assert report.measured_activation_peak_bytes <= 1.10 * report.predicted_activation_bytes
    assert any("measured step" in m for m in report.messages)
    assert list(tmp_path.rglob("*.json")), "the plan should be cached on disk"
    _check_module(module, model, inputs)
    # The first steps are timed and logged.
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    for _ in range(4):
        optimizer.zero_grad()
        module(*inputs).backward()
        optimizer.step()
    assert len(report.step_ms) == 3
    assert any("first 3 steps" in m for m in report.messages)

    # Same model and budget again: the cached plan, no solve.
    model.zero_grad(set_to_none=True)
    again = plan_for(model, inputs, report.budget_bytes, cache_dir=tmp_path, log_steps=0)
    assert again.agent_report.source == "cache"
    assert again.plan.actions == report.plan.actions

    # A dead URL: falls back to the cache, and says so.
    dead = plan_for(model, inputs, report.budget_bytes, server="http://127.0.0.1:9",
                    cache_dir=tmp_path, timeout_s=3, log_steps=0)
    assert dead.agent_report.source == "fallback-cache"
    assert "service unavailable" in dead.agent_report.messages[0]
    # A dead URL and an empty cache: the local baseline, and says so.
    empty = tmp_path / "empty"
    base = plan_for(model, inputs, report.budget_bytes, server="http://127.0.0.1:9",
                    cache_dir=empty, timeout_s=3, log_steps=0)
    assert base.agent_report.source == "fallback-baseline"
    assert "local baseline" in base.agent_report.messages[0]
    _check_module(base, model, inputs)


def test_budget_below_every_plan_says_so(tmp_path: Path) -> None:
    model, inputs = TINY["mlp"]()
    with pytest.raises(NoPlanFits, match="no plan fits"):
        plan_for(model, inputs, 1000, cache_dir=tmp_path, method="best-baseline", log_steps=0)


@pytest.mark.slow
def test_against_a_real_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    api_server = pytest.importorskip("api_server")
    model, inputs = TINY["gpt"]()
    with api_server.running_server(tmp_path, f"sqlite:///{tmp_path / 'service.db'}") as server:
        module = plan_for(model, inputs, 0.9, server=server.url, cache_dir=tmp_path / "cache",
                          method="auto", time_limit_s=3, timeout_s=90, log_steps=0)
        report = module.agent_report
        assert report.source == "service", report.messages
        assert report.plan.predicted.peak_bytes <= report.budget_bytes
        _check_module(module, model, inputs)
        # The service's answer is cached locally for when the service is away.
        assert list((tmp_path / "cache").rglob("*.json"))
        # A slow service (a method that takes 5 s): the agent stops waiting, cancels the job,
        # falls back to a local baseline and says so.
        slow = plan_for(model, inputs, 0.9, server=server.url, cache_dir=tmp_path / "cache",
                        method="slow-test", timeout_s=1.5, log_steps=0, calibrate=False)
        assert slow.agent_report.source == "fallback-baseline"
        assert "no plan after 1.5 s" in slow.agent_report.messages[0]
        assert "cancelled" in slow.agent_report.messages[0]


@pytest.mark.slow
def test_a_step_measured_over_budget_is_planned_again(tmp_path: Path, monkeypatch) -> None:
    """An allocation the traced graph does not see (simulated: a constant extra on every
    measured step) pushes the first plan over the budget by more than the re-plan tolerance;
    the agent plans again, once, for a budget tightened by the excess, and the step then fits
    as measured."""
    import dataclasses

    import planner.runtime.measure as measure
    from planner import zoo
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.tracing.api import trace

    # Activations well above fixed memory, so that tighter plans exist, and a tenth of them
    # above the tolerance's 64 KiB floor.
    model, inputs = zoo.mlp(batch_size=256, in_features=64, hidden=128, depth=4)
    graph = trace(model, inputs, level="op", dropout_masks="graph").graph
    budget = store_all_peak_bytes(graph)
    allowed = budget - graph.fixed_bytes
    first = plan_for(model, inputs, budget, cache_dir=tmp_path, time_limit_s=3, replan=False,
                     log_steps=0)
    measured = first.agent_report.measured_activation_peak_bytes
    assert first.agent_report.budget_bytes == budget
    extra = max(0, allowed - measured) + allowed // 10  # the first plan now measures 10 % over
    real = measure.measure_step

    def with_extra(*args, **kwargs):  # type: ignore[no-untyped-def]
        m = real(*args, **kwargs)
        return dataclasses.replace(m, activation_peak_bytes=m.activation_peak_bytes + extra,
                                   peak_bytes=m.peak_bytes + extra)

    monkeypatch.setattr(measure, "measure_step", with_extra)
    # Without replanning the first plan stays, over budget as measured.
    model.zero_grad(set_to_none=True)
    kept = plan_for(model, inputs, budget, cache_dir=tmp_path, replan=False, log_steps=0)
    assert kept.agent_report.budget_bytes == budget
    assert kept.agent_report.measured_activation_peak_bytes > allowed

    model.zero_grad(set_to_none=True)
    module = plan_for(model, inputs, budget, cache_dir=tmp_path, method="auto", time_limit_s=3,
                      log_steps=0)
    report = module.agent_report
    assert report.requested_budget_bytes == budget
    assert report.budget_bytes < budget, report.messages
    assert sum("planning again" in m for m in report.messages) == 1
    assert report.plan.predicted.peak_bytes <= report.budget_bytes
    assert report.measured_activation_peak_bytes <= allowed, "\n".join(report.messages)
    assert any("the step fits the budget as measured" in m for m in report.messages)
    _check_module(module, model, inputs)
