"""One budget grammar everywhere (issue 49 item 2): an integer is bytes, always (Python int, JSON
integer, digits in a string or on the command line: 1 is one byte); a number with a point is a
fraction of the store-all peak in (0, 1] (1.0 is all of it); `80%` a percentage; `24GiB`
bytes with a unit. The CLI, the REST API (budget, budgets, device_memory), the runtime agent and
the trainer callbacks read budgets with the one parser, planner.core.budget. A tiny byte budget
is legal input: the answer is that no plan fits, with the smallest budget known to work."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from planner.core.budget import BUDGET_GRAMMAR, parse_budget, parse_budget_spec
from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.synthetic import training_graph
from planner.engine.request import resolve_request
from planner.solvers.baselines import store_all_peak_bytes

GRAPH = training_graph(8, skip=2, seed=7, fixed_bytes=4096)
PEAK = store_all_peak_bytes(GRAPH)
DOC = GRAPH.model_dump(mode="json")


# -- the parser ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    (1, 1), ("1", 1), (" 1 ", 1), (500, 500), ("500", 500), (999, 999),
    (12_000_000_000, 12_000_000_000), ("12000000000", 12_000_000_000),
    ("64B", 64), ("900MB", 900 * 10**6), ("24GiB", 24 * 2**30), ("1.5KiB", 1536),
])
def test_an_integer_is_bytes_however_small(value: object, expected: int) -> None:
    spec = parse_budget_spec(value)
    assert spec.bytes == expected and not spec.needs_reference
    assert parse_budget(value, PEAK) == expected  # the graph changes nothing


@pytest.mark.parametrize(("value", "fraction"), [
    (1.0, 1.0), ("1.0", 1.0), ("1.", 1.0), (0.8, 0.8), ("0.8", 0.8), (".25", 0.25),
    ("8e-1", 0.8), ("80%", 0.8), ("150%", 1.5), ("100 %", 1.0),
])
def test_a_number_with_a_point_or_a_percentage_is_of_the_store_all_peak(
    value: object, fraction: float
) -> None:
    spec = parse_budget_spec(value)
    assert spec.fraction == pytest.approx(fraction) and spec.needs_reference
    assert parse_budget(value, 1000) == round(fraction * 1000)


def test_python_int_1_and_float_1_0_differ() -> None:
    assert parse_budget(1, PEAK) == 1
    assert parse_budget(1.0, PEAK) == PEAK
    assert parse_budget("1", PEAK) == 1
    assert parse_budget("1.0", PEAK) == PEAK


@pytest.mark.parametrize(("value", "fix"), [
    (1.5, "150%"), ("1.5", "1.5GB"), ("2.0", "2 (an integer: bytes)"),
    ("1e9", "1000000000 (an integer: bytes) or 1GB"), (4e9, "4000000000 (an integer: bytes)"),
    (0.9 * 80e9, "72000000000 (an integer: bytes) or 72GB"),
])
def test_a_number_with_a_point_above_1_is_refused_with_the_fix(value: object, fix: str) -> None:
    with pytest.raises(InputError) as info:
        parse_budget_spec(value)
    message = str(info.value)
    assert message.startswith("budget: ") and fix in message and "\n" not in message, message
    assert "a fraction of the store-all peak, at most 1" in message


@pytest.mark.parametrize(("value", "fragment"), [
    (0, "more than 0"), (-1, "more than 0"), ("0", "more than 0"), ("-5", "more than 0"),
    (2**61, "too large"), (True, "expected an integer"), (None, "expected an integer"),
    ("lots", "cannot parse"), ("12 parsecs", "unknown unit"), (float("nan"), "finite"),
    ("x" * 1000, "cannot parse"),
])
def test_errors_are_one_line_naming_the_field(value: object, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_budget_spec(value, "host_memory")
    message = str(info.value)
    assert message.startswith("host_memory: ") and fragment in message, message
    assert "\n" not in message and len(message) < 400, message


def test_a_huge_integer_is_too_large_without_printing_it() -> None:
    with pytest.raises(InputError, match=r"^budget: an integer of 16610 bits: too large"):
        parse_budget_spec(10**5000)


# -- the CLI ------------------------------------------------------------------------------------
def test_the_cli_help_states_the_grammar() -> None:
    from planner.cli.options import BUDGET_HELP

    assert BUDGET_GRAMMAR in BUDGET_HELP and "1 is one byte" in BUDGET_HELP


def test_cli_budget_1_is_one_byte_and_no_plan_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from planner.cli.main import main

    graph = tmp_path / "g.json"
    write_json(graph, GRAPH)
    monkeypatch.setattr(sys, "argv", ["planner-cli", "solve", str(graph), "--budget", "1",
                                      "-m", "store-all", "--json"])
    with pytest.raises(SystemExit) as info:
        main()
    captured = capsys.readouterr()
    assert info.value.code == 3, captured.err  # no plan fits: an answer, not an input error
    summary = json.loads(captured.out)
    assert summary["budget_bytes"] == 1 and summary["status"] == "infeasible"
    smallest = summary["smallest_known_budget_bytes"]
    assert 1 < smallest <= PEAK
    message = captured.err.strip()
    assert "no plan fits" in message and str(smallest) in message
    assert len(message.splitlines()) == 1, message


def test_the_cli_resolves_digits_as_bytes_and_a_point_as_a_fraction() -> None:
    # What `--budget 1` / `--budget 1.0` become: the request every entry point resolves.
    assert resolve_request(GRAPH, "1", method="store-all").budget_bytes == 1
    assert resolve_request(GRAPH, "500", method="store-all").budget_bytes == 500
    assert resolve_request(GRAPH, "1.0", method="store-all").budget_bytes == PEAK
    with pytest.raises(InputError, match=r"^budget: '1\.5': a number with a point"):
        resolve_request(GRAPH, "1.5", method="store-all")


def test_device_and_host_memory_read_the_grammar() -> None:
    from planner.engine.partition import parse_device_memory
    from planner.engine.request import resolve_resources, with_host_memory

    assert parse_device_memory("1") == 1 and parse_device_memory(1) == 1
    assert parse_device_memory("80GiB") == 80 * 2**30
    with pytest.raises(InputError, match="^device_memory: .*not a fraction"):
        parse_device_memory("0.8")
    machine = with_host_memory(resolve_resources("h100-pcie-gen5"), "1")
    assert machine is not None and machine.host_memory_bytes == 1


def test_a_sweep_reads_1_as_one_byte_and_1_0_as_the_peak() -> None:
    from planner.engine.sweep import parse_budgets

    points = parse_budgets("1,1.0,80%,0.5", PEAK)
    assert points == sorted(points, key=lambda p: p[1])
    assert (None, 1) in points and (1.0, PEAK) in points and (0.8, parse_budget("80%", PEAK)) \
        in points


# -- the runtime agent and the trainer callbacks -------------------------------------------------
def test_callback_budgets_are_checked_by_the_one_parser() -> None:
    pytest.importorskip("torch")
    from planner.runtime.integrations.planned_forward import checked_budget

    assert checked_budget(1, "PlannerCallback") == 1  # one byte: kept as the int it is
    assert parse_budget_spec(checked_budget(1, "PlannerCallback")).bytes == 1
    assert parse_budget_spec(checked_budget(1.0, "PlannerCallback")).fraction == 1.0
    assert checked_budget("80%", "PlannerCallback") == "80%"
    with pytest.raises(InputError, match=r"^PlannerCallback\(budget=\.\.\.\): 1\.5: "):
        checked_budget(1.5, "PlannerCallback")


def test_plan_for_refuses_a_bad_budget_before_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from planner.runtime import agent

    def no_trace(*args: object, **kwargs: object) -> None:
        raise AssertionError("traced before the budget was checked")

    monkeypatch.setattr("planner.tracing.api.trace", no_trace)
    with pytest.raises(InputError, match=r"^budget: 2\.5: a number with a point"):
        agent.plan_for(torch.nn.Linear(2, 2), torch.zeros(1, 2), 2.5)


# -- the REST API -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    workdir = tmp_path_factory.mktemp("grammar")
    settings = Settings(database_url=f"sqlite:///{workdir / 's.db'}", workers=1,
                        max_time_limit_s=30)
    with TestClient(create_app(settings)) as client:
        yield client


def _raw_plan(api: TestClient, budget_json: str, method: str = "store-all") -> dict[str, object]:
    """POST /v1/plans with the budget written exactly as `budget_json` (1 and 1.0 differ)."""
    body = f'{{"graph": {json.dumps(DOC)}, "budget": {budget_json}, "method": "{method}"}}'
    r = api.post("/v1/plans?wait=20", content=body,
                 headers={"content-type": "application/json"})
    assert r.status_code in (200, 202), r.text
    answer: dict[str, object] = r.json()
    return answer


@pytest.mark.parametrize(("budget_json", "expected"), [
    ("1", 1), ('"1"', 1), ("500", 500), ("0.8", "80%"), ('"80%"', "80%"), ("1.0", "100%"),
    ('"24GiB"', 24 * 2**30),
])
def test_rest_budget_forms(api: TestClient, budget_json: str, expected: int | str) -> None:
    job = _raw_plan(api, budget_json)
    want = expected if isinstance(expected, int) else parse_budget(expected, PEAK)
    assert job["budget_bytes"] == want, job


def test_rest_budget_1_is_one_byte_and_no_plan_fits(api: TestClient) -> None:
    job = _raw_plan(api, "1")
    assert job["budget_bytes"] == 1
    if job["status"] == "infeasible":  # finished within the wait (it is quick): an answer
        report = job["report"]
        assert isinstance(report, dict) and 1 < report["smallest_feasible_bytes"] <= PEAK


@pytest.mark.parametrize(("path", "body", "field", "fragment"), [
    ("/v1/plans", {"budget": 1.5}, "budget", "1.5: a number with a point"),
    ("/v1/plans", {"budget": 4e9}, "budget", "4000000000 (an integer: bytes)"),
    ("/v1/plans", {"budget": -3}, "budget", "-3: must be more than 0"),
    ("/v1/plans", {"budget": 2**63}, "budget", "too large"),
    ("/v1/plans", {"budget": "1.5"}, "budget", "150%"),
    ("/v1/plans", {"budget": True}, "budget", "expected an integer (bytes)"),
    ("/v1/plans", {"budget": [1]}, "budget", "expected an integer (bytes)"),
    ("/v1/sweeps", {"budgets": [0.5, 2.5]}, "budgets[1]", "250%"),
    ("/v1/partitions", {"device_memory": 0}, "device_memory", "more than 0"),
    ("/v1/partitions", {"device_memory": 0.8}, "device_memory", "not a fraction"),
    ("/v1/partitions", {"device_memory": 4e9}, "device_memory", "write 4000000000"),
])
def test_rest_budget_errors_are_one_line_naming_the_field(
    api: TestClient, path: str, body: dict[str, object], field: str, fragment: str
) -> None:
    base: dict[str, object] = {"graph": DOC}
    if path == "/v1/partitions":
        base.update(devices=2, microbatches=4)
    r = api.post(path, json={**base, **body})
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"{field}: ") and fragment in message, message
    assert "\n" not in message and "problems" not in message, message
    for library_words in ("valid integer", "valid number", "constrained", "Input should"):
        assert library_words not in message, message


def test_rest_device_memory_1_is_one_byte(api: TestClient) -> None:
    from planner.api.routers.partitions import PartitionRequest, plan_request

    body = PartitionRequest(graph=DOC, devices=2, microbatches=4, device_memory=1)
    assert plan_request(body).budget == 1
    r = api.post("/v1/partitions", json={"graph": DOC, "devices": 2, "microbatches": 4,
                                         "device_memory": 1})
    assert r.status_code in (200, 202), r.text


def test_the_schema_says_an_integer_is_bytes_from_one_up(api: TestClient) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    budget = schemas["PlanRequest"]["properties"]["budget"]
    forms = {f.get("type"): f for f in budget["anyOf"]}
    assert forms["integer"]["minimum"] == 1 and forms["number"]["maximum"] == 1
    assert "1 is one byte" in budget["description"]
    assert "1.0 is all of it" in budget["description"]
    memory = schemas["PartitionRequest"]["properties"]["device_memory"]
    assert {"type": "integer", "minimum": 1} in [
        {k: f[k] for k in ("type", "minimum") if k in f} for f in memory["anyOf"]]
    assert "1 is one byte" in memory["description"]
