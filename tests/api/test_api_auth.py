"""Bearer-token auth on and off, and the per-key submission rate limit, over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from api_server import running_server

from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")


@pytest.mark.slow
def test_auth_on_and_rate_limit(tmp_path: Path) -> None:
    keys = ["team-1:key-one-0123456789", "team-2:key-two-9876543210"]
    tokens = [k.split(":", 1)[1] for k in keys]  # "TENANT:KEY": each key its own tenant
    with running_server(tmp_path, f"sqlite:///{tmp_path / 's.db'}",
                        api_keys=json.dumps(keys), submissions_per_minute=3) as srv:
        body = {"graph": DOC, "budget": 1.0, "method": "store-all"}
        r = httpx.post(srv.url + "/v1/plans", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "unauthorized"
        r = httpx.get(srv.url + "/v1/plans/x", headers={"Authorization": "Basic abc"})
        assert r.status_code == 401
        r = httpx.get(srv.url + "/v1/plans/x", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        # Health and readiness stay open for probes; metrics count every tenant's jobs: the
        # admin key only (issue 50, item 9).
        for path in ("/healthz", "/readyz"):
            assert httpx.get(srv.url + path).status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 401

        with srv.client(token=tokens[1]) as c:
            for _ in range(3):
                assert c.post("/v1/plans", json=body).status_code in (200, 202)
            limited = c.post("/v1/plans", json=body)
            assert limited.status_code == 429
            assert "submissions_per_minute=3" in limited.json()["error"]["message"]
            assert int(limited.headers["retry-after"]) >= 1
            assert c.get("/v1/methods").status_code == 200  # reads are not rate limited
        with srv.client(token=tokens[0]) as c:  # the limit is per tenant
            assert c.post("/v1/plans", json=body).status_code in (200, 202)

        # The OpenAPI document declares the bearer scheme, so the docs page can send a key.
        spec = httpx.get(srv.url + "/openapi.json").json()
        schemes = spec["components"]["securitySchemes"]
        assert [s["scheme"] for s in schemes.values() if s["type"] == "http"] == ["bearer"]
        name = next(iter(schemes))
        assert spec["paths"]["/v1/plans"]["post"]["security"] == [{name: []}]
        assert "security" not in spec["paths"]["/healthz"]["get"]
