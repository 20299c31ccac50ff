"""Plans are bounded for every method, and large ones are rendered once (issue 50 item 5): a
107 MB plan was rendered again on every GET (four at once: 5.4 GB in the API process)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from planner.core.synthetic import training_graph

DOC = training_graph(30, skip=3, seed=5).model_dump(mode="json")


def _client(tmp_path: Path, **settings: Any) -> TestClient:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    return TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}",
                                          workers=1, submissions_per_minute=1000,
                                          **settings)))


def _finished(client: TestClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = client.get(f"/v1/plans/{job_id}").json()
        if body["status"] in ("done", "infeasible", "failed"):
            return body  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError("the job did not finish")


@pytest.fixture()
def files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """Every plan counts as large (its text is spliced, never parsed) and no view fits in
    memory: each finished view is kept in a file."""
    import planner.api.service

    monkeypatch.setattr(planner.api.service, "LARGE_PLAN_CHARS", 16)
    with _client(tmp_path, response_cache_bytes=0) as client:
        yield client


def test_a_large_plan_is_rendered_once_and_streamed_from_its_file(
    files_only: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import planner.api.plan_files
    import planner.api.service
    from planner.api.job_views import job_view

    posted = files_only.post("/v1/plans", json={"graph": DOC, "budget": 0.6,
                                                "method": "chen-greedy"})
    job_id = posted.json()["id"]
    first = _finished(files_only, job_id)
    assert first["status"] == "done" and first["plan"]["actions"]
    parts = files_only.app.state.parts  # type: ignore[attr-defined]
    # What the view says when the plan is parsed and rendered as before.
    want = json.loads(job_view(parts.store.get_job(job_id)).model_dump_json())
    assert first == want

    def rendered_again(*_: object, **__: object) -> None:
        raise AssertionError("a finished plan was rendered again")

    for name in ("job_view", "render_spliced"):
        monkeypatch.setattr(planner.api.service, name, rendered_again)
    monkeypatch.setattr(planner.api.plan_files, "job_view", rendered_again, raising=False)
    for _ in range(3):
        again = files_only.get(f"/v1/plans/{job_id}")
        assert again.status_code == 200
        assert again.json() == want
        assert int(again.headers["content-length"]) == len(again.content)
    # The identical request is answered from the store with the same plan, cached.
    answered = files_only.post("/v1/plans?wait=5", json={"graph_id": first["graph_id"],
                                                         "budget": first["budget_bytes"],
                                                         "method": "chen-greedy"})
    assert answered.status_code == 200 and answered.json()["cached"] is True
    assert answered.json()["plan"] == want["plan"]


def test_a_large_plan_is_another_tenants_404(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.api.service

    monkeypatch.setattr(planner.api.service, "LARGE_PLAN_CHARS", 16)
    keys = {"a": "key-of-tenant-a", "b": "key-of-tenant-b"}
    with _client(tmp_path, response_cache_bytes=0,
                 api_keys=[f"{t}:{k}" for t, k in keys.items()]) as client:
        a = {"Authorization": f"Bearer {keys['a']}"}
        job_id = client.post("/v1/plans", headers=a, json={
            "graph": DOC, "budget": 0.6, "method": "chen-greedy"}).json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/v1/plans/{job_id}", headers=a).json()["status"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        other = client.get(f"/v1/plans/{job_id}",
                           headers={"Authorization": f"Bearer {keys['b']}"})
        assert other.status_code == 404


def test_every_methods_plan_is_bounded(tmp_path: Path) -> None:
    """A plan over max_plan_bytes fails its job, naming the limit; the schema states it."""
    with _client(tmp_path, max_plan_bytes=1024) as client:
        for method in ("chen-greedy", "store-all"):
            posted = client.post("/v1/plans", json={"graph": DOC, "budget": 0.9,
                                                    "method": method})
            body = _finished(client, posted.json()["id"])
            assert body["status"] == "failed", body
            assert "max_plan_bytes=1024" in body["error"]
            assert body["plan"] is None
        plan = client.get("/openapi.json").json()["components"]["schemas"]["JobView"][
            "properties"]["plan"]
        assert plan["x-max-bytes"] == 1024
