"""Issue 50, item 7: bad input to the service is one line naming the field, with a 4xx, never a
500, and every 500 still carries the security headers. `"schedule": "bogus"` on /v1/partitions
was a 500 without them; `"device_memory": 1` was read as 100 % of the store-all peak (now one
byte: issue 49 item 2, one budget grammar); `"budget": "1e-300"` was read as 1 byte; rotor's
`slots` and `segments` had no maximum (its DP tables grow with segments^2 x slots)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from planner.api.web import SECURITY_HEADERS
from planner.core.budget import MIN_FRACTION, parse_budget_spec
from planner.core.errors import InputError
from planner.core.synthetic import training_graph

DOC = training_graph(4, seed=3).model_dump(mode="json")
PARTITION = {"graph": DOC, "devices": 2, "microbatches": 4, "device_memory": "80GiB"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", workers=1))

    @app.get("/test-only/bug")
    def bug() -> None:  # what any unforeseen fault looks like to a client
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def refused(answer: Any, field: str) -> str:
    """The one-line message of a 422 naming `field`."""
    assert answer.status_code == 422, answer.text
    message: str = answer.json()["error"]["message"]
    assert message.startswith(field + ":") and "\n" not in message, message
    return message


def test_an_unknown_schedule_is_a_422_naming_it(client: TestClient) -> None:
    answer = client.post("/v1/partitions", json={**PARTITION, "schedule": "bogus"})
    assert "zb-h1" in refused(answer, "schedule")


def test_every_500_carries_the_security_headers(client: TestClient) -> None:
    answer = client.get("/test-only/bug")
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "internal"
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers.get(name) == value, name
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_device_memory_is_bytes_from_one_byte_up(client: TestClient) -> None:
    # One budget grammar: a JSON integer is bytes, however small (1 is one byte, never 100 %).
    for tiny in (0, -1):
        answer = client.post("/v1/partitions", json={**PARTITION, "device_memory": tiny})
        assert "more than 0" in refused(answer, "device_memory")
    for fraction in (0.8, "0.8", 1.0):  # device memory is bytes, never a fraction
        answer = client.post("/v1/partitions", json={**PARTITION, "device_memory": fraction})
        refused(answer, "device_memory")
    answer = client.post("/v1/partitions", json={**PARTITION, "device_memory": 1})
    assert answer.status_code in (200, 202), answer.text
    schema = client.get("/openapi.json").json()["components"]["schemas"]["PartitionRequest"]
    forms = schema["properties"]["device_memory"]["anyOf"]
    assert {"type": "integer", "minimum": 1} in [
        {k: f[k] for k in ("type", "minimum") if k in f} for f in forms]


@pytest.mark.parametrize("budget", ["1e-300", 1e-300, "1e-300%", "1e-300GB", "0.0000001"])
def test_a_budget_under_a_byte_or_a_senseless_fraction_is_refused(
    client: TestClient, budget: object
) -> None:
    answer = client.post("/v1/plans", json={"graph": DOC, "budget": budget,
                                            "method": "store-all"})
    assert "such as" in refused(answer, "budget")  # and says what to write instead
    answer = client.post("/v1/partitions", json={**PARTITION, "device_memory": budget})
    refused(answer, "device_memory")
    answer = client.post("/v1/sweeps", json={"graph": DOC, "budgets": [0.8, budget],
                                             "method": "store-all"})
    refused(answer, "budgets[1]")


def test_the_budget_grammar_keeps_every_sensible_form() -> None:
    for text, fraction, size in (("0.8", 0.8, None), ("80%", 0.8, None), ("1.0", 1.0, None),
                                 ("1", None, 1),
                                 ("0.000001", MIN_FRACTION, None), ("1B", None, 1),
                                 ("0.5KB", None, 500), ("12GiB", None, 12 * 2**30)):
        spec = parse_budget_spec(text)
        assert (spec.fraction, spec.bytes) == (fraction, size), text
    with pytest.raises(InputError, match="under 1 byte"):
        parse_budget_spec("0.000001KB")


@pytest.mark.parametrize(("option", "value"), [("slots", 10**12), ("segments", 10**9),
                                               ("refine", 10**6)])
def test_rotor_table_sizes_have_a_maximum(client: TestClient, option: str, value: int) -> None:
    from planner.api.caps import OPTION_CAPS

    body = {"graph": DOC, "budget": 0.8, "method": "rotor", "options": {option: value}}
    message = refused(client.post("/v1/plans", json=body), f"options.{option}")
    assert str(OPTION_CAPS[option]) in message
    at_cap = {**body, "options": {option: OPTION_CAPS[option]}}
    assert client.post("/v1/plans", json=at_cap).status_code in (200, 202)
    spec = client.get("/openapi.json").json()["components"]["schemas"]["PlanRequest"]
    rotor = next(rule["then"] for rule in spec["allOf"]
                 if rule.get("if", {}).get("properties", {}).get("method") == {"const": "rotor"}
                 and "options" in rule["then"]["properties"])
    assert rotor["properties"]["options"]["properties"][option]["maximum"] == OPTION_CAPS[option]
    listed = next(m for m in client.get("/v1/methods").json() if m["name"] == "rotor")
    assert {o["name"]: o["maximum"] for o in listed["options"]}[option] == OPTION_CAPS[option]
