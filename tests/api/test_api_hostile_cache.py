"""Issue 50, item 1: the page's timeline cache never answers a tenant with another tenant's plan.
It was keyed by f"{scope}/{plan_id}": an admin's scope (None) formatted as "None", and a tenant
may be named None, so after an admin opened A's chart tenant None read it from the cache."""

from __future__ import annotations

from pathlib import Path

from test_api_tenants import PLAN, add_key, bearer, make_client, wait_done


def test_a_tenant_named_none_never_reads_an_admins_cached_timeline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    a = add_key(url, "team-a")["key"]
    none = add_key(url, "None")["key"]
    admin = add_key(url, "ops", "--admin")["key"]
    with make_client(url) as client:
        posted = client.post("/v1/plans", json=PLAN, headers=bearer(a))
        assert posted.status_code in (200, 202), posted.text
        plan_id = posted.json()["id"]
        assert wait_done(client, plan_id, a)["status"] == "done"
        timeline = f"/web/plans/{plan_id}/timeline.json"
        assert client.get(timeline, headers=bearer(admin)).status_code == 200  # now cached
        assert client.get(f"/v1/plans/{plan_id}", headers=bearer(none)).status_code == 404
        stolen = client.get(timeline, headers=bearer(none))
        assert stolen.status_code == 404, stolen.text[:200]
        assert "budget_bytes" not in stolen.text
        # The owner still reads it (from the cache or anew).
        assert client.get(timeline, headers=bearer(a)).json()["id"] == plan_id
