"""The runtime agent plans again only when a measured step exceeds the budget by more than the
tolerance, then once, for the budget less what the trace missed and less the excess; it shows
progress while it solves, and does not let httpx log every poll of the service."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import planner.runtime.measure as measure  # noqa: E402
from planner import zoo  # noqa: E402
from planner.core.errors import NoPlanFits  # noqa: E402
from planner.core.plan import Plan  # noqa: E402
from planner.engine.request import ResolvedRequest, resolve_request  # noqa: E402
from planner.runtime.agent import plan_for, replan_tolerance_bytes  # noqa: E402
from planner.solvers.baselines import store_all_peak_bytes  # noqa: E402
from planner.tracing.api import trace  # noqa: E402

METHOD = "best-baseline"  # fast and deterministic: the tests count solves, not plan quality


@pytest.fixture
def mlp() -> tuple[Any, tuple[Any, ...], int, int]:
    """A model whose activations (about 1.3 MiB) dwarf the 64 KiB tolerance floor, and a budget
    at store-all's peak (the first plan predicts exactly the budget)."""
    model, inputs = zoo.mlp(batch_size=256, in_features=64, hidden=128, depth=4)
    graph = trace(model, inputs, level="op", dropout_masks="graph").graph
    budget = store_all_peak_bytes(graph)
    return model, inputs, budget, budget - graph.fixed_bytes


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[Plan]:
    """Every plan solved in-process, in order."""
    plans: list[Plan] = []
    real = ResolvedRequest.solve

    def counting(self: ResolvedRequest, **kwargs: Any) -> Plan:
        plans.append(real(self, **kwargs))
        return plans[-1]

    monkeypatch.setattr(ResolvedRequest, "solve", counting)
    return plans


def fake_measurements(monkeypatch: pytest.MonkeyPatch, activation_bytes: list[int | None]
                      ) -> None:
    """The calibration steps measure these activation bytes in turn (None: what was measured;
    the last repeats): an allocation the traced graph does not see."""
    real = measure.measure_step
    queue = list(activation_bytes)

    def measured(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        target = queue.pop(0) if len(queue) > 1 else queue[0]
        if target is None:
            return result
        return dataclasses.replace(result, peak_bytes=target, activation_peak_bytes=target)

    monkeypatch.setattr(measure, "measure_step", measured)


def test_an_excess_within_the_tolerance_is_not_planned_again(
        mlp: Any, solves: list[Plan], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model, inputs, budget, allowed = mlp
    tolerance = replan_tolerance_bytes(budget)
    assert tolerance == 64 * 1024  # the floor: 0.5 % of this budget is less
    fake_measurements(monkeypatch, [allowed + tolerance // 2])
    module = plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path, log_steps=0)
    report = module.agent_report
    assert len(solves) == 1, report.messages
    assert report.budget_bytes == budget
    assert any("within the re-plan tolerance" in m for m in report.messages)


def test_a_large_excess_is_planned_again_once_for_a_budget_less_the_excess(
        mlp: Any, solves: list[Plan], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model, inputs, budget, allowed = mlp
    over = allowed // 10
    assert over > replan_tolerance_bytes(budget)
    fake_measurements(monkeypatch, [allowed + over, None])  # the second plan measures as is
    module = plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path, log_steps=0)
    report = module.agent_report
    assert len(solves) == 2, report.messages
    first = solves[0].predicted
    assert first is not None
    unseen = allowed + over - (first.peak_bytes - report.graph.fixed_bytes)
    assert report.budget_bytes == budget - unseen - over
    assert report.plan.predicted.peak_bytes <= report.budget_bytes
    assert report.requested_budget_bytes == budget
    assert any("planning again, once" in m for m in report.messages)
    assert any("fits the budget as measured" in m for m in report.messages)

    # The plan settled on is cached for the user's budget: the next run neither solves nor
    # plans again.
    model.zero_grad(set_to_none=True)
    again = plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path, log_steps=0)
    assert len(solves) == 2
    assert again.agent_report.source == "cache"
    assert again.plan.actions == report.plan.actions


def test_never_a_third_solve(mlp: Any, solves: list[Plan], monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every plan measures far over the budget: one re-plan, then a warning with the numbers
    (or NoPlanFits in strict mode)."""
    model, inputs, budget, allowed = mlp
    fake_measurements(monkeypatch, [allowed + allowed // 10])
    with caplog.at_level(logging.INFO, logger="planner.runtime.agent"):
        module = plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path, log_steps=0)
    assert len(solves) == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert all(word in warned[0] for word in ("measured", "predicted", "budget", "over"))
    assert module.agent_report.requested_budget_bytes == budget

    model.zero_grad(set_to_none=True)
    with pytest.raises(NoPlanFits, match="the measured step exceeds the budget"):
        plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path / "strict",
                 log_steps=0, strict=True)
    assert len(solves) == 4


def test_progress_lines_while_solving(mlp: Any, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, inputs, budget, _ = mlp
    monkeypatch.setenv("PLANNER_PROGRESS_EVERY_S", "0.05")
    real = ResolvedRequest.solve

    def slow(self: ResolvedRequest, **kwargs: Any) -> Plan:  # a solver that takes a while
        kwargs["progress"](None, None)
        time.sleep(0.4)
        return real(self, **kwargs)

    monkeypatch.setattr(ResolvedRequest, "solve", slow)
    with caplog.at_level(logging.INFO, logger="planner.runtime.agent"):
        plan_for(model, inputs, budget, method=METHOD, cache_dir=tmp_path, log_steps=0,
                 time_limit_s=7)
    lines = [r.getMessage() for r in caplog.records if r.name == "planner.runtime.agent"]
    assert any(line.startswith(f"solving in-process with {METHOD} for a budget of ")
               and "time limit 7 s" in line for line in lines), lines
    assert any(" s of 7 s · best - · bound -" in line for line in lines), lines
    assert any(line.startswith(f"solved in-process with {METHOD}: peak ") and "overhead" in line
               for line in lines), lines


class _StubClient:
    """A service that answers with `plan` after a few polls, reporting progress."""

    plan: Plan

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __enter__(self) -> _StubClient:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def submit_plan(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 202, {"id": "7", "status": "queued"}

    def wait(self, job_id: str, *, timeout_s: float, on_change: Any) -> dict[str, Any]:
        on_change({"id": job_id, "status": "running",
                   "progress": {"best_objective": None, "best_bound": None}})
        time.sleep(0.3)
        return {"id": job_id, "status": "done", "plan": self.plan.model_dump(mode="json")}


def test_the_agent_asks_the_service_without_a_log_line_per_poll(
        mlp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    import planner.api.client as client

    model, inputs, budget, _ = mlp
    graph = trace(model, inputs, level="op", dropout_masks="graph").graph
    _StubClient.plan = resolve_request(graph, budget, method=METHOD, time_limit=5).solve()
    monkeypatch.setattr(client, "PlannerClient", _StubClient)
    monkeypatch.setenv("PLANNER_PROGRESS_EVERY_S", "0.05")
    for name in ("httpx", "httpcore"):  # as a fresh process has them; restored afterwards
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    with caplog.at_level(logging.INFO):
        module = plan_for(model, inputs, budget, server="http://stub", method=METHOD,
                          cache_dir=tmp_path, log_steps=0, time_limit_s=5)
    assert module.agent_report.source == "service", module.agent_report.messages
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("httpcore").level == logging.WARNING
    lines = [r.getMessage() for r in caplog.records if r.name == "planner.runtime.agent"]
    assert any(line.startswith("asking the service at http://stub") for line in lines), lines
    assert any("s of 5 s · running" in line for line in lines), lines
    assert any(line.startswith("plan from the service at http://stub: peak ")
               for line in lines), lines
