"""Bad numbers and bad options are refused at submission (422 naming the field), never a 500
and never a job that fails later; the OpenAPI document says what the checks are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_server import ServerProcess, running_server, wait_finished

from planner.core.synthetic import training_graph

GRAPH = training_graph(8, skip=2, seed=3)
DOC = GRAPH.model_dump(mode="json")
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("validation")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000, max_time_limit_s=30) as srv:
        yield srv


def _raw_post(server: ServerProcess, path: str, text: str) -> tuple[int, dict[str, Any]]:
    """Post JSON text as written (1e30 stays a float, 10**30 an integer literal)."""
    with server.client() as c:
        r = c.post(path, content=text.encode(), headers={"content-type": "application/json"})
    return r.status_code, r.json()


def _with_node_bytes(value: str) -> str:
    doc = json.loads(json.dumps(DOC))
    doc["nodes"][0]["output_bytes"] = "__BIG__"
    return json.dumps(doc).replace('"__BIG__"', value)


GRAPH_TEXT = json.dumps(DOC)


@pytest.mark.parametrize(("body", "field"), [
    (f'{{"graph": {GRAPH_TEXT}, "budget": 1e30}}', "budget"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": {10**30}}}', "budget"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": {2**63}}}', "budget"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": {INT64_MAX}}}', "budget"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": "{10**30}"}}', "budget"),
    (f'{{"graph": {_with_node_bytes("1e30")}, "budget": 2000}}', "output_bytes"),
    (f'{{"graph": {_with_node_bytes(str(2**63))}, "budget": 2000}}', "output_bytes"),
    (f'{{"graph": {_with_node_bytes(str(10**30))}, "budget": 0.5}}', "output_bytes"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": 2000, "time_limit": NaN}}', "time_limit"),
    (f'{{"graph": {GRAPH_TEXT}, "budget": 2000, "time_limit": Infinity}}', "time_limit"),
])
def test_huge_numbers_in_a_plan_request_are_422_naming_the_field(
    server: ServerProcess, body: str, field: str
) -> None:
    status, answer = _raw_post(server, "/v1/plans", body)
    assert status == 422, answer
    assert field in answer["error"]["message"], answer


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/sweeps", f'{{"graph": {GRAPH_TEXT}, "budgets": [2000, {2**63}]}}', "budgets"),
    ("/v1/sweeps", f'{{"graph": {GRAPH_TEXT}, "budgets": [0.5, 1e300]}}', "budgets"),
    ("/v1/sweeps", f'{{"graph": {GRAPH_TEXT}, "budgets": [0.5, "{2**70}B"]}}', "budgets[1]"),
    ("/v1/graphs", _with_node_bytes(str(2**63)), "output_bytes"),
    ("/v1/graphs", _with_node_bytes("1e30"), "output_bytes"),
])
def test_huge_numbers_in_sweeps_and_graphs_are_422(
    server: ServerProcess, path: str, body: str, field: str
) -> None:
    status, answer = _raw_post(server, path, body)
    assert status == 422, answer
    assert field in answer["error"]["message"], answer


def test_byte_totals_over_int64_are_422(server: ServerProcess) -> None:
    doc = json.loads(json.dumps(DOC))
    assert len(doc["nodes"]) >= 9
    for node in doc["nodes"][:9]:  # each within its field's bound, together over int64
        node["output_bytes"] = 2**60
    status, answer = _raw_post(server, "/v1/graphs", json.dumps(doc))
    assert status == 422 and "add up to" in answer["error"]["message"], answer


@pytest.mark.parametrize(("method", "options", "expected"), [
    ("milp", {"backend": "bogus"}, "options.backend: 'bogus' is not one of cpsat"),
    ("milp", {"hint": "yes"}, "options.hint"),
    ("auto", {"backend": "cpsat"}, "method 'auto' has no option 'backend'"),
    ("best-baseline", {"n": 20}, "options.n"),
    ("lp-rounding", {"backend": "cpsat"}, "options.backend"),
    ("cpsat-intervals", {"max_computations": 0}, "options.max_computations: 0 is below 1"),
    ("rotor", {"slots": "many"}, "options.slots"),
    ("rotor", {"refine": True}, "options.refine"),
])
def test_invalid_options_are_refused_at_submission(
    server: ServerProcess, method: str, options: dict[str, Any], expected: str
) -> None:
    with server.client() as c:
        for path, body in (("/v1/plans", {"graph": DOC, "budget": 0.9}),
                           ("/v1/sweeps", {"graph": DOC, "budgets": [0.9]})):
            r = c.post(path, json={**body, "method": method, "options": options})
            assert r.status_code == 422, r.text
            assert expected in r.json()["error"]["message"], r.json()


def test_valid_options_and_plugin_options_are_accepted(server: ServerProcess) -> None:
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "rotor",
                                      "options": {"slots": 100, "refine": 0}})
        assert r.status_code in (200, 202), r.text
        assert wait_finished(c, r.json()["id"])["status"] in ("done", "infeasible")
        # A plugin method defines its own options: the server does not second-guess them.
        r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.9, "method": "slow-test",
                                      "options": {"sleep_s": 0.1}})
        assert r.status_code in (200, 202), r.text


def test_openapi_documents_graph_xor_graph_id_and_bounds(server: ServerProcess) -> None:
    with server.client() as c:
        spec = c.get("/openapi.json").json()
    for name in ("PlanRequest", "SweepRequest"):
        schema = spec["components"]["schemas"][name]
        required = sorted(tuple(alt["required"]) for alt in schema["oneOf"])
        assert required == [("graph",), ("graph_id",)], schema.get("oneOf")
        assert "exactly one of graph and graph_id" in schema["properties"]["graph"]["description"]
    budget = spec["components"]["schemas"]["PlanRequest"]["properties"]["budget"]
    bounds = [alt.get("maximum") for alt in budget["anyOf"] if alt.get("type") == "integer"]
    assert bounds == [2**60]
    options = spec["components"]["schemas"]["PlanRequest"]["properties"]["options"]
    assert "cpsat, scip" in options["description"]
    # With auth off, no security scheme is claimed (see test_api_auth for auth on).
    assert "securitySchemes" not in spec.get("components", {})
    with server.client() as c:
        both = c.post("/v1/plans", json={"graph": DOC, "graph_id": "sha256:x", "budget": 0.9})
        assert both.status_code == 422 and "exactly one" in both.json()["error"]["message"]


def test_405_lists_every_method_of_the_path(server: ServerProcess, tmp_path: Path) -> None:
    with server.client() as c:
        r = c.request("PUT", "/v1/plans/0")
    assert r.status_code == 405
    assert {m.strip() for m in r.headers["allow"].split(",")} >= {"GET", "DELETE"}
