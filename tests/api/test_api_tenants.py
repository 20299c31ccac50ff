"""Tenants: two tenants' keys see none of each other's jobs, graphs, sweeps, downloads or cached
answers (404, never 403); an admin key sees both; keys are added, listed and revoked with
`planner-cli keys` against the database, and a revoked key is refused without a restart; an old
store's rows belong to the default tenant; per-tenant caps answer 429."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_server import SLOW_METHOD
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from planner.cli.main import app as cli
from planner.core.errors import InputError
from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")
OTHER_DOC = training_graph(5, seed=4).model_dump(mode="json")
PLAN = {"graph": DOC, "budget": 1.0, "method": "store-all"}
SLOW = {"graph": OTHER_DOC, "budget": 1.0, "method": "slow-test", "time_limit": 60}


def keys_cli(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["keys", *args, "--database-url", url])
    assert result.exit_code == 0, result.output
    return result


def add_key(url: str, tenant: str, *extra: str) -> dict[str, Any]:
    added: dict[str, Any] = json.loads(keys_cli(url, "add", "--tenant", tenant, "--json",
                                                *extra).stdout)
    return added


def make_client(url: str, **settings: Any) -> TestClient:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    settings.setdefault("api_key_cache_s", 0)
    return TestClient(create_app(Settings(database_url=url, workers=1,
                                          extra_methods=SLOW_METHOD, **settings)))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def wait_done(client: TestClient, plan_id: str, key: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/plans/{plan_id}", headers=bearer(key)).json()
        if job["status"] in ("done", "infeasible", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"plan {plan_id} did not finish")


@pytest.fixture
def two_tenants(tmp_path: Path) -> Iterator[tuple[TestClient, str, dict[str, str]]]:
    url = f"sqlite:///{tmp_path / 's.db'}"
    keys = {name: add_key(url, name)["key"] for name in ("team-a", "team-b")}
    keys["admin"] = add_key(url, "ops", "--admin")["key"]
    with make_client(url) as client:
        yield client, url, keys


def test_no_read_list_cancel_download_or_cache_hit_crosses_tenants(
    two_tenants: tuple[TestClient, str, dict[str, str]],
) -> None:
    client, _, keys = two_tenants
    a, b, admin = keys["team-a"], keys["team-b"], keys["admin"]
    # A: an uploaded graph, a finished plan (timeline drawable), a sweep, a queued partition.
    graph_id = client.post("/v1/graphs", json=DOC, headers=bearer(a)).json()["id"]
    done = client.post("/v1/plans?wait=30", json=PLAN, headers=bearer(a)).json()
    assert done["status"] == "done"
    sweep = client.post("/v1/sweeps", json={"graph_id": graph_id, "budgets": [0.8, 1.0],
                                            "method": "store-all"}, headers=bearer(a)).json()
    slow = client.post("/v1/plans", json={**SLOW, "options": {"sleep_s": 60}},
                       headers=bearer(a)).json()
    a_jobs = {done["id"], slow["id"], *(p["id"] for p in sweep["plans"])}

    reads = [f"/v1/plans/{done['id']}", f"/v1/plans/{slow['id']}",
             f"/v1/plans/{done['id']}/timeline.png", f"/web/plans/{done['id']}/timeline.json",
             f"/v1/graphs/{graph_id}", f"/v1/sweeps/{sweep['id']}"]
    for path in reads:
        assert client.get(path, headers=bearer(a)).status_code == 200, path
        refused = client.get(path, headers=bearer(b))
        assert refused.status_code == 404, (path, refused.status_code)
        assert client.get(path, headers=bearer(admin)).status_code == 200, path
    assert client.delete(f"/v1/plans/{slow['id']}", headers=bearer(b)).status_code == 404
    assert client.get(f"/v1/plans/{slow['id']}", headers=bearer(a)).json()["status"] in (
        "queued", "running")

    # Lists: A's ids absent from B's, present in A's and the admin's.
    def listed(key: str) -> set[str]:
        plans = client.get("/v1/plans?limit=200", headers=bearer(key)).json()["plans"]
        sweeps = client.get("/v1/sweeps", headers=bearer(key)).json()["sweeps"]
        return {p["id"] for p in plans} | {s["id"] for s in sweeps}

    assert listed(b) == set()
    assert a_jobs | {sweep["id"]} <= listed(a) and a_jobs | {sweep["id"]} <= listed(admin)
    # The admin cancels A's job (which frees the one worker for B's jobs below).
    assert client.delete(f"/v1/plans/{slow['id']}", headers=bearer(admin)).status_code == 200

    # Cache: B asking A's question gets its own new job, not A's answer; by graph_id it is a 404
    # until B sends the graph itself (then B's upload is "created": A's copy does not leak).
    assert client.post("/v1/plans", json={"graph_id": graph_id, "budget": 1.0,
                                          "method": "store-all"},
                       headers=bearer(b)).status_code == 404
    uploaded = client.post("/v1/graphs", json=DOC, headers=bearer(b))
    assert uploaded.status_code == 201 and uploaded.json()["created"] is True
    for body in (PLAN, {"graph_id": graph_id, "budget": 1.0, "method": "store-all"}):
        own = client.post("/v1/plans?wait=30", json=body, headers=bearer(b)).json()
        assert own["id"] not in a_jobs
        assert wait_done(client, own["id"], b)["status"] == "done"
    again = client.post("/v1/plans", json=PLAN, headers=bearer(a)).json()
    assert again["id"] == done["id"] and again["cached"] is True  # A's cache still A's


def test_keys_add_list_revoke_without_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    added = add_key(url, "team-a")
    assert added["key"].startswith("plk_") and not added["admin"]
    with make_client(url) as client:
        assert client.get("/v1/plans", headers=bearer(added["key"])).status_code == 200
        assert client.get("/v1/plans").status_code == 401
        assert client.get("/v1/plans", headers=bearer("plk_wrong")).status_code == 403
        listing = json.loads(keys_cli(url, "list", "--json").stdout)["keys"]
        assert [(k["id"], k["tenant"], k["revoked"]) for k in listing] == [
            (added["id"], "team-a", None)]
        assert added["key"] not in json.dumps(listing)  # the secret is shown only once
        keys_cli(url, "revoke", added["id"])
        refused = client.get("/v1/plans", headers=bearer(added["key"]))
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    # Only the digest is stored.
    with sqlite3.connect(tmp_path / "s.db") as db:
        stored = db.execute("SELECT key_sha256, revoked_at FROM planner_api_keys").fetchall()
    assert len(stored) == 1 and stored[0][0] != added["key"] and stored[0][1] is not None
    bad = CliRunner().invoke(cli, ["keys", "revoke", "nope", "--database-url", url])
    # (main() turns an InputError into one line and exit 2; the runner shows the exception)
    assert isinstance(bad.exception, InputError) and "no such key" in str(bad.exception)


def test_old_store_rows_belong_to_the_default_tenant(tmp_path: Path) -> None:
    """A store made before tenants (no tenant columns, no owners table) opens; its jobs,
    sweeps and graphs are the default tenant's: a server without keys still sees them."""
    from planner.api.store import Store

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    store = Store(url)
    store.create_schema()
    graph_id = "sha256:" + "0" * 64
    store.put_graph(graph_id, json.dumps(DOC), 1, 0)
    job = store.create_job(request_key="k", graph_hash=graph_id, budget_bytes=1, method="m",
                           options={}, time_limit_s=1.0)
    sweep_id = store.create_sweep(graph_id, "m", [job.id])
    store.dispose()
    with sqlite3.connect(path) as db:  # back to the schema before tenants
        for table in ("planner_jobs", "planner_sweeps"):
            db.execute(f"DROP INDEX IF EXISTS ix_{table}_tenant")
            db.execute(f"ALTER TABLE {table} DROP COLUMN tenant")
        db.execute("DROP TABLE planner_graph_owners")
        db.execute("DROP TABLE planner_api_keys")

    with make_client(url) as client:
        assert client.get(f"/v1/plans/{job.id}").json()["id"] == job.id
        assert [p["id"] for p in client.get("/v1/plans").json()["plans"]] == [job.id]
        assert client.get(f"/v1/sweeps/{sweep_id}").status_code == 200
        assert client.get(f"/v1/graphs/{graph_id}").status_code == 200
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT tenant FROM planner_jobs").fetchall() == [("default",)]


def test_env_keys_name_their_tenant(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    env_keys = ["plain-key-0123456789", "team-x:x-key-0123456789"]
    with make_client(url, api_keys=env_keys, admin_api_key="admin-key-0123456789") as client:
        graph = client.post("/v1/graphs", json=DOC, headers=bearer("plain-key-0123456789"))
        path = f"/v1/graphs/{graph.json()['id']}"
        assert client.get(path, headers=bearer("team-x:x-key-0123456789")).status_code == 403
        assert client.get(path, headers=bearer("x-key-0123456789")).status_code == 404
        assert client.get(path, headers=bearer("admin-key-0123456789")).status_code == 200


def test_per_tenant_caps_answer_429(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    a, b = add_key(url, "team-a")["key"], add_key(url, "team-b")["key"]
    with make_client(url, max_active_jobs_per_tenant=2, submissions_per_minute=5) as client:
        for seed in range(2):
            queued = client.post("/v1/plans", json={**SLOW, "options": {"sleep_s": 60 + seed}},
                                 headers=bearer(a))
            assert queued.status_code == 202, queued.text
        capped = client.post("/v1/plans", json={**SLOW, "options": {"sleep_s": 99}},
                             headers=bearer(a))
        assert capped.status_code == 429 and int(capped.headers["retry-after"]) >= 1
        assert "max_active_jobs_per_tenant=2" in capped.json()["error"]["message"]
        sweep = {"graph": DOC, "budgets": [0.9], "method": "store-all"}
        capped_sweep = client.post("/v1/sweeps", json=sweep, headers=bearer(a))
        assert capped_sweep.status_code == 429
        # B is not held by A's cap, and its own rate limit is its own.
        assert client.post("/v1/plans", json=PLAN, headers=bearer(b)).status_code in (200, 202)
        rate = client.post("/v1/plans", json=PLAN, headers=bearer(a))  # A's 5th submission
        assert rate.status_code in (200, 429)
        limited = client.post("/v1/plans", json=PLAN, headers=bearer(a))
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert "submissions_per_minute=5 for tenant team-a" in limited.json()["error"]["message"]
        for job in client.get("/v1/plans", headers=bearer(a)).json()["plans"]:
            if job["status"] in ("queued", "running"):
                client.delete(f"/v1/plans/{job['id']}", headers=bearer(a))
