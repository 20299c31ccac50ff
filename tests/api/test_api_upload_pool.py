"""Large bodies are parsed in the upload pool, never in the API process (issue 50 item 4): a
13 MB graph cost 4-7.5 s of the API's interpreter and six at once held another tenant's reads
for 10 s (benchmarks/service_upload_load.py measures the latencies). The pool answers what the
route answers, bounded per tenant (429) and in all (503), after authentication."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from planner.core.synthetic import training_graph

DOC = training_graph(6, seed=3).model_dump(mode="json")


def _client(tmp_path: Path, **settings: Any) -> TestClient:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    settings.setdefault("submissions_per_minute", 1000)
    return TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}",
                                          workers=1, **settings)))


@pytest.fixture()
def pooled(tmp_path: Path) -> Iterator[TestClient]:
    """Every body of the four upload routes goes through the pool."""
    with _client(tmp_path, upload_pool_min_bytes=0) as client:
        yield client


def test_the_api_process_never_parses_a_large_graph(
    pooled: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """graph_from_dict (validation, the cycle check) fails if the API process calls it: each
    upload route still answers, parsed in a pool process."""
    import planner.engine.inputs

    def in_the_api_process(*_: object, **__: object) -> None:
        raise AssertionError("a large graph was parsed in the API process")

    monkeypatch.setattr(planner.engine.inputs, "graph_from_dict", in_the_api_process)
    graph = pooled.post("/v1/graphs", json=DOC)
    assert graph.status_code == 201, graph.text
    plan = pooled.post("/v1/plans?wait=30", json={"graph": DOC, "budget": 0.7,
                                                  "method": "chen-greedy"})
    assert plan.status_code == 200, plan.text
    assert plan.json()["status"] in ("done", "infeasible")
    assert plan.json()["graph_id"] == graph.json()["id"]
    sweep = pooled.post("/v1/sweeps", json={"graph": DOC, "budgets": [0.5, 0.9],
                                            "method": "chen-greedy"})
    assert sweep.status_code == 202, sweep.text
    assert len(sweep.json()["plans"]) == 2
    partition = pooled.post("/v1/partitions", json={**_partition_body(), "time_limit": 5})
    assert partition.status_code in (200, 202), partition.text


def _partition_body() -> dict[str, Any]:
    from planner.core.graph import Graph

    module_graph = Graph.model_validate(json.loads(
        (Path(__file__).resolve().parents[2] / "planner/examples/resnet24.json").read_text()))
    return {"graph": module_graph.model_dump(mode="json"), "devices": 2, "microbatches": 4,
            "device_memory": "80GiB"}


BAD_BODIES = [
    ("/v1/plans", b'{"graph": {'),
    ("/v1/plans", b"\xff\xfe{}"),
    ("/v1/plans", json.dumps({"graph": {**DOC, "edges": [*DOC["edges"], {"source": 99,
                                                                       "target": 1}]},
                              "budget": 0.5}).encode()),
    ("/v1/plans", json.dumps({"graph": DOC, "budget": "1e-300"}).encode()),
    ("/v1/plans", json.dumps({"graph": DOC, "budget": 0.5, "bogus": 1}).encode()),
    ("/v1/plans", json.dumps({"graph": DOC}).encode()),
    ("/v1/plans", json.dumps({"graph": DOC, "budget": 0.5, "time_limit": 1e9}).encode()),
    ("/v1/plans", json.dumps({"graph": {"nodes": "x"}, "budget": 0.5}).encode()),
    ("/v1/graphs", json.dumps({"nodes": []}).encode()),
    ("/v1/sweeps", json.dumps({"graph": DOC, "budgets": [0.5, "1e-300"]}).encode()),
    ("/v1/sweeps", json.dumps({"graph": DOC, "budgets": [0.1 + i / 100 for i in range(33)]
                               }).encode()),
    ("/v1/partitions", json.dumps({"graph": DOC, "devices": 2, "device_memory": "80GiB",
                                   "schedule": "bogus"}).encode()),
    ("/v1/partitions", json.dumps({"graph": DOC, "devices": 0,
                                   "device_memory": "80GiB"}).encode()),
]


def test_the_pool_answers_what_the_route_answers(tmp_path: Path) -> None:
    """Each bad body gets the same status and message through the pool as in the route."""
    answers = []
    for threshold in (0, 2**30):
        (tmp_path / str(threshold)).mkdir()
        with _client(tmp_path / str(threshold), upload_pool_min_bytes=threshold) as client:
            answers.append([
                (path, (r := client.post(path, content=body, headers={
                    "content-type": "application/json"})).status_code, r.json())
                for path, body in BAD_BODIES])
    pooled, inline = answers
    for got, want in zip(pooled, inline, strict=True):
        assert got == want
        assert got[1] == 422


def test_the_pool_is_bounded_per_tenant_and_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One parse at a time and no queue: while one of tenant a's uploads is parsed, a's next
    is a 429 and b's a 503, both with Retry-After; without a key, a 401 before the body is
    read; the other routes answer meanwhile."""
    from planner.api.uploads import UploadPool

    entered, release = threading.Event(), threading.Event()
    real = UploadPool.prepare

    async def held(self: UploadPool, kind: str, body: bytes, tenant: str) -> Any:
        import anyio.to_thread

        entered.set()
        await anyio.to_thread.run_sync(release.wait)
        return await real(self, kind, body, tenant)

    monkeypatch.setattr(UploadPool, "prepare", held)
    keys = {"a": "key-of-tenant-a", "b": "key-of-tenant-b"}
    with _client(tmp_path, upload_pool_min_bytes=0, upload_workers=1, upload_queue=0,
                 upload_queue_per_tenant=1,
                 api_keys=[f"{t}:{k}" for t, k in keys.items()]) as client, \
            ThreadPoolExecutor(1) as pool:
        def post(tenant: str | None) -> Any:
            headers = {"Authorization": f"Bearer {keys[tenant]}"} if tenant else {}
            return client.post("/v1/graphs", json=DOC, headers=headers)

        first = pool.submit(post, "a")
        assert entered.wait(30)
        try:
            again, other, anonymous = post("a"), post("b"), post(None)
            health = client.get("/healthz")
        finally:
            release.set()
        assert first.result(30).status_code == 201
    assert again.status_code == 429, again.text
    assert again.json()["error"]["details"]["limit"] == "upload_queue_per_tenant"
    assert other.status_code == 503, other.text
    assert "Retry-After" in again.headers and "Retry-After" in other.headers
    assert anonymous.status_code == 401, anonymous.text
    assert health.status_code == 200


def test_a_storage_fault_behind_the_pool_is_a_503(pooled: TestClient) -> None:
    """The graph is stored by the middleware: a full disk answers as the routes do."""
    import sqlite3
    from contextlib import contextmanager

    from sqlalchemy.exc import OperationalError

    @contextmanager
    def full() -> Iterator[None]:
        raise OperationalError("INSERT ...", {}, sqlite3.OperationalError(
            "database or disk is full"))
        yield  # pragma: no cover

    store = pooled.app.state.parts.store  # type: ignore[attr-defined]
    store.write_session = full
    try:
        for path, body in (("/v1/graphs", DOC), ("/v1/plans", {"graph": DOC, "budget": 0.5})):
            answer = pooled.post(path, json=body)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "storage_disk_full"
            assert answer.headers["Retry-After"]
    finally:
        del store.write_session
