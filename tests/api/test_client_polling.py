"""PlannerClient.wait (the CLI's `submit --wait` and the runtime agent): it backs off between
polls and reports only changes, so a long solve costs a few lines, not one per poll."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import planner.api.client as client_module
from planner.api.client import POLL_FIRST_S, POLL_MAX_S, PlannerClient, ServiceTimeout


def _client(answers: list[dict[str, Any]], seen: list[str]) -> PlannerClient:
    """A client whose GETs answer `answers` in turn (the last one repeats)."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        job = answers[min(len(seen) - 1, len(answers) - 1)]
        return httpx.Response(200, json={"id": "p1", **job})

    c = PlannerClient("http://planner.test")
    c._http.close()
    c._http = httpx.Client(base_url=c.server, transport=httpx.MockTransport(handler))
    return c


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    return slept


def test_wait_reports_only_changes_and_backs_off(sleeps: list[float]) -> None:
    running = {"status": "running", "progress": {"best_objective": None, "best_bound": None}}
    better = {"status": "running", "progress": {"best_objective": 12.0, "best_bound": 10.0}}
    answers = [{"status": "queued", "progress": None}] * 3 + [running] * 10 + [better] * 12
    answers.append({"status": "done", "progress": better["progress"]})
    polls: list[str] = []
    changes: list[dict[str, Any]] = []
    with _client(answers, polls) as c:
        job = c.wait("p1", on_change=changes.append)
    assert job["status"] == "done"
    assert len(polls) == len(answers) == 26
    assert polls[0] == "GET /v1/plans/p1"
    # 25 unfinished polls, three states: three reports, one per change.
    assert [(j["status"], j["progress"]) for j in changes] == [
        ("queued", None), ("running", running["progress"]), ("running", better["progress"])
    ]
    assert sleeps[0] == POLL_FIRST_S
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:], strict=False))  # never faster
    assert max(sleeps) == POLL_MAX_S and sleeps[-1] == POLL_MAX_S  # backs off to the cap
    assert sum(sleeps) > 25 * POLL_FIRST_S * 5  # far fewer polls than a fixed 0.1 s period


def test_wait_gives_up_at_its_timeout(sleeps: list[float], monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    clock = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(client_module.time, "sleep", sleep)
    polls: list[str] = []
    with _client([{"status": "running", "progress": None}], polls) as c:
        with pytest.raises(ServiceTimeout, match="no plan after 5 s"):
            c.wait("p1", timeout_s=5)
    assert sum(sleeps) <= 5 and len(polls) < 15
