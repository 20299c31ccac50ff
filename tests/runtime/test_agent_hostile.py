"""Issue 50, item 11: the training-loop agent as a client. It sends $PLANNER_API_KEY as the CLI
does; a key the service refuses (401, 403) is ServiceRefused with one line saying what to set,
not "service unavailable" and a fallback plan; and a fallback baseline plan is never cached
under the name of the method asked for (`auto`), where a later run without the service took it
"from cache"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import TINY  # noqa: E402

from planner.runtime.agent import ServiceRefused, plan_for  # noqa: E402

DEAD_URL = "http://127.0.0.1:9"  # nothing listens on the discard port


def test_a_fallback_plan_is_never_cached_as_the_method_asked_for(tmp_path: Path) -> None:
    model, inputs = TINY["mlp"]()
    fallback = plan_for(model, inputs, 1.0, server=DEAD_URL, cache_dir=tmp_path, method="auto",
                        timeout_s=3, log_steps=0, calibrate=False)
    assert fallback.agent_report.source == "fallback-baseline"
    assert not list(tmp_path.rglob("auto-*.json")), "a best-baseline plan cached as auto's"
    # Later, no service: auto's own plan, solved here, not the fallback "from cache".
    later = plan_for(model, inputs, 1.0, cache_dir=tmp_path, method="auto", time_limit_s=2,
                     log_steps=0, calibrate=False)
    assert later.agent_report.source == "local", later.agent_report.messages


@pytest.mark.slow
def test_the_agent_sends_the_env_key_and_tells_a_refusal_from_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    api_server = pytest.importorskip("api_server")
    model, inputs = TINY["mlp"]()
    key = "team-a:agent-key-0123456789"
    with api_server.running_server(tmp_path, f"sqlite:///{tmp_path / 's.db'}",
                                   api_keys=json.dumps([key])) as server:
        options = {"server": server.url, "method": "auto", "time_limit_s": 2, "timeout_s": 60,
                   "log_steps": 0, "calibrate": False}
        monkeypatch.delenv("PLANNER_API_KEY", raising=False)
        with pytest.raises(ServiceRefused) as missing:
            plan_for(model, inputs, 1.0, cache_dir=tmp_path / "none", **options)
        message = str(missing.value)
        assert "HTTP 401" in message and "PLANNER_API_KEY" in message and "\n" not in message
        assert "unavailable" not in message
        assert not list((tmp_path / "none").rglob("*.json"))  # nothing cached, nothing planned
        monkeypatch.setenv("PLANNER_API_KEY", "a-wrong-key")
        with pytest.raises(ServiceRefused, match="HTTP 403"):
            plan_for(model, inputs, 1.0, cache_dir=tmp_path / "wrong", **options)
        monkeypatch.setenv("PLANNER_API_KEY", key.split(":", 1)[1])
        served = plan_for(model, inputs, 1.0, cache_dir=tmp_path / "served", **options)
        assert served.agent_report.source == "service", served.agent_report.messages
