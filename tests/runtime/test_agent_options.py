"""The runtime agent takes the method's options (`plan_for(..., options=)`): checked by the one
request resolution (planner.engine.request), solved with in-process, sent to the service with
the request, and cached apart from the method's default plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from planner import zoo  # noqa: E402
from planner.core.errors import InputError  # noqa: E402
from planner.core.plan import Plan  # noqa: E402
from planner.engine.request import ResolvedRequest, resolve_request  # noqa: E402
from planner.runtime.agent import plan_for  # noqa: E402
from planner.runtime.agent_solve import cache_name  # noqa: E402
from planner.solvers.baselines import store_all_peak_bytes  # noqa: E402
from planner.tracing.api import trace  # noqa: E402


@pytest.fixture(scope="module")
def mlp() -> tuple[Any, tuple[Any, ...], int]:
    model, inputs = zoo.mlp(batch_size=8, in_features=16, hidden=32, depth=3)
    graph = trace(model, inputs, level="op", dropout_masks="graph").graph
    return model, inputs, 2 * store_all_peak_bytes(graph)  # room for any method's rounding


def test_options_reach_the_in_process_solve(mlp: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs, budget = mlp
    seen: list[dict[str, Any]] = []
    real = ResolvedRequest.solve

    def recording(self: ResolvedRequest, **kwargs: Any) -> Plan:
        seen.append(dict(self.options))
        return real(self, **kwargs)

    monkeypatch.setattr(ResolvedRequest, "solve", recording)
    module = plan_for(model, inputs, budget, method="rotor", options={"slots": 50},
                      cache_dir=tmp_path, calibrate=False, log_steps=0, time_limit_s=10)
    assert seen == [{"slots": 50}]
    assert module.agent_report.source == "local"
    # Cached under the method and its options: the default request does not take it.
    (cached,) = [p.name for p in tmp_path.rglob("*.json")]
    assert cached.startswith("rotor_"), cached
    plan_for(model, inputs, budget, method="rotor", cache_dir=tmp_path, calibrate=False,
             log_steps=0, time_limit_s=10)
    assert seen == [{"slots": 50}, {}]


def test_a_bad_option_is_one_line_naming_it(mlp: Any, tmp_path: Path) -> None:
    model, inputs, budget = mlp
    with pytest.raises(InputError, match=r"^options\.slots: 0 is below 1"):
        plan_for(model, inputs, budget, method="rotor", options={"slots": 0},
                 cache_dir=tmp_path, calibrate=False, log_steps=0)
    with pytest.raises(InputError, match=r"^options\.nope: method 'rotor' has no option 'nope' "
                       r"\(its options: slots, refine"):
        plan_for(model, inputs, budget, method="rotor", options={"nope": 1},
                 cache_dir=tmp_path, calibrate=False, log_steps=0)


class _StubClient:
    """A service that records the body it was sent and answers with `plan` at once."""

    plan: Plan
    bodies: list[dict[str, Any]] = []

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __enter__(self) -> _StubClient:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def submit_plan(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.bodies.append(body)
        return 202, {"id": "7", "status": "queued"}

    def wait(self, job_id: str, *, timeout_s: float, on_change: Any) -> dict[str, Any]:
        return {"id": job_id, "status": "done", "plan": self.plan.model_dump(mode="json")}


def test_options_are_sent_to_the_service(mlp: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.api.client as client

    model, inputs, budget = mlp
    graph = trace(model, inputs, level="op", dropout_masks="graph").graph
    _StubClient.plan = resolve_request(graph, budget, method="store-all", time_limit=5).solve()
    _StubClient.bodies = []
    monkeypatch.setattr(client, "PlannerClient", _StubClient)
    module = plan_for(model, inputs, budget, server="http://stub", method="milp",
                      options={"backend": "highs", "hint": False}, cache_dir=tmp_path,
                      calibrate=False, log_steps=0, time_limit_s=5)
    assert module.agent_report.source == "service"
    (body,) = _StubClient.bodies
    assert body["method"] == "milp" and body["options"] == {"backend": "highs", "hint": False}


def test_the_cache_name_keeps_options_apart() -> None:
    from planner.core.synthetic import training_graph

    graph = training_graph(4, seed=1)
    plain = resolve_request(graph, "90%", method="rotor")
    a = resolve_request(graph, "90%", method="rotor", options={"slots": 50, "refine": 1})
    b = resolve_request(graph, "90%", method="rotor", options={"refine": 1, "slots": 50})
    c = resolve_request(graph, "90%", method="rotor", options={"slots": 60})
    assert cache_name(plain) == "rotor"
    assert cache_name(a) == cache_name(b) != cache_name(c)
    assert cache_name(a).startswith("rotor_")
