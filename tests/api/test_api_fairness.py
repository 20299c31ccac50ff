"""Fair, bounded work between tenants (issue 28): a tenant with queued work gets a worker
before another tenant's second, a flood of partition jobs from one tenant leaves another's
reads fast, and every cap (devices, micro-batches, data-parallel degree, sweep length, byte
counts) is a 422 naming the field, stated in the OpenAPI schema."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import ServerProcess, database_url, running_server, wait_finished

from planner.core.synthetic import training_graph
from planner.solvers.pipeline.chains import chain_graph, transformer_layers

KEY_A, KEY_B = "fairness-key-of-tenant-a", "fairness-key-of-tenant-b"
DOC = training_graph(8, skip=2, seed=3).model_dump(mode="json")
PIPE = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 2)).model_dump(mode="json")
PARTITION = {"graph": PIPE, "devices": 2, "device_memory": "4GiB", "microbatches": 8,
             "schedule": "1f1b", "method": "layer-balanced", "time_limit": 10}
SLOW_S = 3.0  # each of B's long jobs: one job slot's turnover


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A pool of 2 workers, tenants a and b; on PostgreSQL the claim takes FOR UPDATE SKIP
    LOCKED (skipped where PLANNER_TEST_POSTGRES_URL is not set)."""
    workdir = tmp_path_factory.mktemp("fairness")
    with database_url(request.param, workdir) as url, running_server(
        workdir, url, workers=2, submissions_per_minute=100_000, max_time_limit_s=30,
        api_keys=json.dumps([f"a:{KEY_A}", f"b:{KEY_B}"]),
    ) as srv:
        yield srv


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _slow(sleep_s: float) -> dict[str, Any]:
    return {"graph": DOC, "budget": 1.0, "method": "slow-test", "time_limit": 30,
            "options": {"sleep_s": sleep_s}}


def _cancel_active(client: httpx.Client) -> None:
    for status in ("queued", "running"):
        for job in client.get("/v1/plans", params={"status": status}).json()["plans"]:
            client.delete(f"/v1/plans/{job['id']}")


def _running(client: httpx.Client) -> int:
    return len(client.get("/v1/plans", params={"status": "running"}).json()["plans"])


@pytest.mark.slow
def test_a_short_job_starts_before_the_third_job_of_a_tenant_holding_every_worker(
    server: ServerProcess,
) -> None:
    """Pool of 2; B holds both workers with long jobs and has two more queued (older than A's).
    A's short job takes the first slot that frees: it starts before B's third job, within one
    slot's turnover. First come first served would run B's queue first (A waits 2 turnovers)."""
    with server.client(KEY_B) as b, server.client(KEY_A) as a:
        b_ids = []
        for i in range(4):  # distinct options: four jobs, not one shared
            r = b.post("/v1/plans", json=_slow(SLOW_S + i / 100))
            assert r.status_code == 202, r.text
            b_ids.append(r.json()["id"])
        deadline = time.monotonic() + 30
        while _running(b) < 2:
            assert time.monotonic() < deadline, "B's jobs never took both workers"
            time.sleep(0.05)
        r = a.post("/v1/plans", json=_slow(0.1))
        assert r.status_code == 202, r.text
        a_job = wait_finished(a, r.json()["id"])
        b_jobs = [wait_finished(b, job_id) for job_id in b_ids]
    assert a_job["status"] == "done" and all(j["status"] == "done" for j in b_jobs)
    b_starts = sorted(_epoch(j["started_at"]) for j in b_jobs)
    a_start, a_created = _epoch(a_job["started_at"]), _epoch(a_job["created_at"])
    a_wait_s = a_start - a_created
    print(f"A waited {a_wait_s:.2f} s for a worker (B's jobs {SLOW_S:g} s each); "
          f"B's third job started {b_starts[2] - a_start:.2f} s after A's")
    # B's two jobs end together: A's claim and B's third come in the same turnover, moments
    # apart (their start stamps may cross by milliseconds); first-come-first-served would start
    # A a whole slot (SLOW_S) after B's third.
    # How long A waited is a timing figure (printed above; loaded machines stretch the
    # dispatcher's start-up): the property is the order.
    assert a_start < b_starts[2] + 0.5


@pytest.mark.slow
def test_a_flood_of_partitions_leaves_another_tenants_list_fast(server: ServerProcess) -> None:
    """B floods POST /v1/partitions (at the micro-batch cap: seconds of work each, as jobs in
    the worker pool); A's GET /v1/plans is not starved (its p99 under 100 ms on a quiet machine
    is benchmarks/service_load.py's figure)."""
    submitted: list[int] = []

    def flood() -> None:
        with server.client(KEY_B) as b:
            for i in range(24):  # distinct micro-batch counts: distinct jobs
                r = b.post("/v1/partitions", json={**PARTITION, "microbatches": 4096 - i})
                submitted.append(r.status_code)

    with server.client(KEY_A) as a, server.client(KEY_B) as b:
        a.get("/v1/plans")  # warm the connection
        flooding = threading.Thread(target=flood)
        flooding.start()
        deadline = time.monotonic() + 30
        while _running(b) < 2:
            assert time.monotonic() < deadline, "B's partition jobs never ran"
            time.sleep(0.05)
        latencies_ms = []
        for _ in range(50):
            started = time.perf_counter()
            r = a.get("/v1/plans")
            latencies_ms.append((time.perf_counter() - started) * 1e3)
            assert r.status_code == 200
            time.sleep(0.02)
        flooding.join()
        _cancel_active(b)
    p99_ms = statistics.quantiles(latencies_ms, n=100, method="inclusive")[98]
    print(f"A's GET /v1/plans during B's flood: median {statistics.median(latencies_ms):.1f} "
          f"ms, p99 {p99_ms:.1f} ms, max {max(latencies_ms):.1f} ms")
    assert all(code in (200, 202) for code in submitted), submitted
    # The 100 ms target is benchmarks/service_load.py's figure; here, with a second suite
    # beside this one, only a starved read (seconds, behind the flood) fails.
    assert p99_ms < 2000


def _post_raw(server: ServerProcess, path: str, text: str) -> httpx.Response:
    """JSON text as written (1e30 stays a float, 2**63 an integer literal)."""
    with server.client(KEY_A) as c:
        return c.post(path, content=text.encode(), headers={"content-type": "application/json"})


def _with(body: dict[str, Any], **raw: str) -> str:
    """`body` as JSON with fields set to raw JSON literals."""
    marked = {**body, **{k: f"__{k}__" for k in raw}}
    text = json.dumps(marked)
    for key, literal in raw.items():
        text = text.replace(f'"__{key}__"', literal)
    return text


PLAN = {"graph": DOC, "budget": 1.0, "method": "chen-greedy"}
SWEEP = {"graph": DOC, "method": "chen-greedy"}
PIPE_PLAN = {"graph": PIPE, "budget": "4GiB", "method": "pipeline-dp"}
BIG = str(2**63)


@pytest.mark.parametrize(("path", "text", "field"), [
    ("/v1/plans", _with(PLAN, resources=f'{{"device_count": {BIG}}}'),
     "resources.device_count"),
    ("/v1/plans", _with(PLAN, resources=f'{{"preset": "h100-pcie-gen5", '
                        f'"host_memory_bytes": {2**70}}}'), "resources.host_memory_bytes"),
    ("/v1/plans", _with(PLAN, resources='{"device_memory_bytes": 1e30}'),
     "resources.device_memory_bytes"),
    ("/v1/plans", _with(PIPE_PLAN, resources='{"device_count": 2, "microbatches": 1000000, '
                        '"pipeline_schedule": "1f1b"}'), "resources.microbatches"),
    ("/v1/sweeps", _with(SWEEP, budgets=json.dumps([0.5] * 65)), "budgets"),
    ("/v1/partitions", _with(PARTITION, devices=BIG), "devices"),
    ("/v1/partitions", _with(PARTITION, devices="65537"), "devices"),
    ("/v1/partitions", _with(PARTITION, microbatches="60000"), "microbatches"),
    ("/v1/partitions", _with(PARTITION, dp=BIG), "dp"),
    ("/v1/partitions", _with(PARTITION, zero="7"), "zero"),
    ("/v1/partitions", _with(PARTITION, device_memory=str(10**30)), "device_memory"),
    ("/v1/partitions", _with(PARTITION, device_memory="1e30"), "device_memory"),
    ("/v1/partitions", _with(PARTITION, resources=f'{{"device_count": {BIG}}}', devices="null"),
     "devices"),
    ("/v1/partitions", _with(PARTITION, resources='{"microbatches": 5000}', microbatches="null"),
     "microbatches"),
])
def test_each_cap_is_a_422_naming_the_field(server: ServerProcess, path: str, text: str,
                                            field: str) -> None:
    r = _post_raw(server, path, text)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    # "resources.device_count: ..." (a cap) or "resources: device_count: ..." (its parser)
    assert message.startswith((field, field.replace(".", ": ", 1))), message
    assert "Traceback" not in message and "\n" not in message


def test_a_graph_with_a_huge_data_parallel_degree_is_refused(server: ServerProcess) -> None:
    graph = json.loads(json.dumps(PIPE))
    graph["model_state"]["data_parallel_degree"] = 2**40
    r = _post_raw(server, "/v1/plans", json.dumps({**PLAN, "graph": graph}))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith("graph.model_state.data_parallel_degree")


def test_the_caps_are_in_the_openapi_schema(server: ServerProcess) -> None:
    with server.client(KEY_A) as c:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
    partition = schemas["PartitionRequest"]["properties"]
    maxima = {name: [b.get("maximum") for b in partition[name].get("anyOf", [partition[name]])]
              for name in ("devices", "microbatches", "dp", "zero", "device_memory")}
    assert 65536 in maxima["devices"] and 4096 in maxima["microbatches"]
    assert 65536 in maxima["dp"] and 3 in maxima["zero"] and 2**60 in maxima["device_memory"]
    # the server states its own caps (api/request_documents.install_server_schema)
    assert schemas["SweepRequest"]["properties"]["budgets"]["maxItems"] == 32
    resources = schemas["Resources"]["properties"]

    def maximum(field: dict) -> int | None:
        ints = [b for b in field.get("anyOf", [field]) if b.get("type") == "integer"]
        return ints[0].get("maximum") if ints else None

    assert maximum(resources["device_count"]) == 65536
    assert maximum(resources["microbatches"]) == 4096
    assert maximum(resources["host_memory_bytes"]) == 2**60
    assert maximum(resources["device_memory_bytes"]) == 2**60


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_claim_takes_the_tenant_with_the_fewest_running_and_never_twice(
    backend: str, tmp_path: Path
) -> None:
    """Store.claim_next: the oldest queued job of the tenant running the fewest; two claimers
    on one database (two instances) claim 120 jobs between them, none twice."""
    from planner.api.store import Store

    with database_url(backend, tmp_path) as url:
        store = Store(url)
        store.create_schema()
        for instance in "ab":
            store.register_instance(instance * 32, 60, hostname="h", pid=1, address="x")

        def queue(tenant: str, n: int) -> None:
            store.create_job(request_key=f"{tenant}{n}", graph_hash="g", budget_bytes=1,
                             method="m", options={}, time_limit_s=1, tenant=tenant)

        for n in range(3):
            queue("b", n)
        queue("a", 0)  # newest, but its tenant runs nothing
        order = []
        while (job := store.claim_next("a" * 32)) is not None:
            order.append(job.request_key)
        assert order == ["b0", "a0", "b1", "b2"]
        for n in range(120):
            queue(f"t{n % 3}", n + 10)
        claimed: dict[str, list[str]] = {"a": [], "b": []}

        def claimer(instance: str) -> None:
            own = Store(url)
            while (job := own.claim_next(instance * 32)) is not None:
                claimed[instance].append(job.id)
            own.dispose()

        threads = [threading.Thread(target=claimer, args=(i,)) for i in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        both = claimed["a"] + claimed["b"]
        assert len(both) == len(set(both)) == 120
        store.drop_schema()
        store.dispose()
