"""What the page lists without opening anything: each finished plan's peak and overhead in
GET /v1/plans, each sweep's finished count in GET /v1/sweeps, and the machines a request may
name by preset (GET /v1/resources/presets). The new fields are optional: old clients see the
same lists with more in them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServerProcess, database_url, running_server, wait_finished

from planner.api.schemas import JobSummary, SweepSummary
from planner.api.store import Store
from planner.core.resources import Resources, preset_names, resources_preset
from planner.core.synthetic import training_graph

DOC = training_graph(10, skip=3, seed=5).model_dump(mode="json")
REPORT = {"peak_bytes": 123_456, "overhead_percent": 4.5, "notes": ["a long summary"]}


# -- the store's listing queries (no server) -------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with database_url(request.param, tmp_path) as url:
        s = Store(url)
        s.create_schema()
        try:
            yield s
        finally:
            s.dispose()


def _job(store: Store, key: str, budget_bytes: int) -> str:
    job = store.create_job(request_key=key, graph_hash="sha256:g", budget_bytes=budget_bytes,
                           method="chen-greedy", options={}, time_limit_s=5.0)
    return job.id


def test_listed_jobs_keep_their_report_not_their_plan(store: Store) -> None:
    done, queued = _job(store, "a", 1000), _job(store, "b", 2000)
    assert store.claim(done) is not None
    assert store.finish(done, "done", plan='{"actions": ["C0"]}', report=REPORT)
    listed = {job.id: job for job in store.list_jobs(10)}
    assert listed[done].report == REPORT and listed[done].plan is None
    assert listed[queued].report is None and listed[queued].status == "queued"


def test_listed_sweeps_count_their_finished_plans(store: Store) -> None:
    ids = [_job(store, key, 1000 * n) for n, key in enumerate("abc", start=1)]
    sweep_id = store.create_sweep("sha256:g", "chen-greedy", ids)
    empty_id = store.create_sweep("sha256:g", "chen-greedy", [])
    assert store.claim(ids[0]) is not None and store.finish(ids[0], "done", report=REPORT)
    assert store.cancel(ids[1]) == "queued"
    rows = {row["id"]: row for row in store.list_sweeps(10)}
    assert (rows[sweep_id]["plans"], rows[sweep_id]["finished"]) == (3, 2)
    assert (rows[empty_id]["plans"], rows[empty_id]["finished"]) == (0, 0)


def test_job_summary_takes_its_figures_from_the_report_and_never_sends_it() -> None:
    fields = {"id": "x", "status": "done", "url": "/v1/plans/x", "graph_id": "g",
              "budget_bytes": 1, "method": "m", "time_limit_s": 1.0, "attempts": 1,
              "created_at": "2026-01-01T00:00:00+00:00"}
    summary = JobSummary(**fields, report=REPORT)
    sent = summary.model_dump(mode="json")
    assert sent["peak_bytes"] == 123_456 and sent["overhead_percent"] == 4.5
    assert "report" not in sent and "report" not in JobSummary.model_json_schema()["properties"]
    bare = JobSummary(**fields).model_dump()  # a queued job: no figures, same shape as before
    assert bare["peak_bytes"] is None and bare["overhead_percent"] is None
    assert SweepSummary.model_fields["finished"].default is None


# -- over HTTP ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("listing")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000) as srv:
        yield srv


def test_plan_list_shows_each_finished_plans_peak_and_overhead(server: ServerProcess) -> None:
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.7, "method": "chen-greedy",
                                      "time_limit": 10})
        assert r.status_code in (200, 202), r.text
        job = wait_finished(c, r.json()["id"])
        assert job["status"] == "done", job
        listed = {p["id"]: p for p in c.get("/v1/plans").json()["plans"]}
        schema = c.get("/openapi.json").json()["components"]["schemas"]
    item = listed[job["id"]]
    assert item["peak_bytes"] == job["report"]["peak_bytes"] > 0
    assert item["overhead_percent"] == pytest.approx(job["report"]["overhead_percent"])
    assert "report" not in item and "plan" not in item
    summary = schema["JobSummary"]["properties"]
    assert {"peak_bytes", "overhead_percent"} <= set(summary) and "report" not in summary
    assert "peak_bytes" not in schema["JobSummary"].get("required", [])


def test_sweep_list_says_how_many_plans_are_finished(server: ServerProcess) -> None:
    with server.client() as c:
        r = c.post("/v1/sweeps", json={"graph": DOC, "budgets": [0.6, 0.9],
                                       "method": "chen-greedy", "time_limit": 10})
        assert r.status_code == 202, r.text
        sweep = r.json()
        for entry in sweep["plans"]:
            wait_finished(c, entry["id"])
        listed = {s["id"]: s for s in c.get("/v1/sweeps", params={"limit": 5}).json()["sweeps"]}
        assert c.get("/v1/sweeps", params={"limit": 0}).status_code == 422
    assert listed[sweep["id"]]["plans"] == listed[sweep["id"]]["finished"] == 2


def test_resource_presets_are_listed_with_what_they_expand_to(server: ServerProcess) -> None:
    with server.client() as c:
        presets = c.get("/v1/resources/presets").json()
        assert "/v1/resources/presets" in c.get("/openapi.json").json()["paths"]
    assert [p["name"] for p in presets] == preset_names()
    by_name = {p["name"]: p for p in presets}
    h100 = by_name["h100-pcie-gen5"]
    assert Resources.model_validate(h100["resources"]) == resources_preset("h100-pcie-gen5")
    assert h100["device_memory_bytes"] == 80 * 2**30 and "GB/s" in h100["summary"]
    assert all(p["resources"]["host_memory_bytes"] is None for p in presets)

