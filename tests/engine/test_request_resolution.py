"""planner.engine.request: one resolution of what a user gives into what the engine solves, with
errors naming request fields that each entry point says in its own words."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from planner.core.budget import parse_budget
from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.resources import Resources, resources_preset
from planner.core.synthetic import training_graph
from planner.engine.request import (
    RequestGraph,
    ResolvedRequest,
    resolve_budget,
    resolve_request,
    stored_request,
)
from planner.solvers.baselines import store_all_peak_bytes

GRAPH = training_graph(8, skip=2, seed=7, fixed_bytes=4096)
PEAK = store_all_peak_bytes(GRAPH)
HOST_MACHINE = {"preset": "h100-pcie-gen5", "host_memory_bytes": 2**34}


def _error(**kwargs: object) -> InputError:
    with pytest.raises(InputError) as info:
        resolve_request(GRAPH, **kwargs)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize("budget", ["80%", "0.8", 0.8, "11GiB", "12000000", 2000])
def test_the_budget_means_what_the_grammar_says(budget: str | int | float) -> None:
    request = resolve_request(GRAPH, budget, method="store-all")
    assert request.budget_bytes == parse_budget(budget, PEAK)
    assert request.graph is GRAPH and request.graph_hash == GRAPH.content_hash()


def test_without_a_budget_the_device_memory_is_the_budget() -> None:
    request = resolve_request(GRAPH, resources="h100-pcie-gen5")
    assert request.resources == resources_preset("h100-pcie-gen5")
    assert request.budget_bytes == request.resources.device_memory_bytes


def test_every_field_is_resolved_once_into_a_frozen_value() -> None:
    request = resolve_request(GRAPH, "90%", resources=HOST_MACHINE, method="rotor",
                              options={"slots": 50}, time_limit="12", threads=3, seed=4)
    assert request == ResolvedRequest(
        source=RequestGraph.given(GRAPH), budget_bytes=parse_budget("90%", PEAK),
        method="rotor", options={"slots": 50},
        resources=Resources.model_validate(request.resources_document()), time_limit_s=12.0,
        threads=3, seed=4,
    )
    with pytest.raises(AttributeError):
        request.budget_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize(("kwargs", "field", "fragment"), [
    ({"budget": "1.5"}, "budget", "at most 1; write 150%"),
    ({"budget": "80%", "time_limit": 0}, "time_limit", "more than 0"),
    ({}, "budget", "missing"),
    ({"budget": "1GiB", "resources": "tpu-v9"}, "resources", "preset 'tpu-v9': unknown"),
    ({"budget": "1GiB", "resources": {"h2d": {"bandwidth_bytes_per_s": 0}}}, "resources",
     "h2d.bandwidth_bytes_per_s"),
    ({"budget": "1GiB", "host_memory": "2GiB"}, "host_memory", "needs resources"),
    ({"budget": "1GiB", "resources": "h100-pcie-gen5", "host_memory": "50%"}, "host_memory",
     "give bytes with a unit"),
    ({"budget": "1GiB", "method": "rotor", "options": {"slots": 0}}, "options.slots", "below 1"),
    ({"budget": "1GiB", "method": "offload-greedy"}, "resources", "missing"),
    ({"budget": "1GiB", "method": "offload-greedy", "resources": "h100-pcie-gen5"},
     "resources", "host_memory_bytes is unset"),
])
def test_errors_name_the_request_field(kwargs: dict[str, object], field: str,
                                       fragment: str) -> None:
    err = _error(**kwargs)
    assert err.field == field and fragment in err.detail, (err.field, str(err))
    assert str(err).startswith(f"{field}: ")


def test_each_entry_point_says_the_field_in_its_own_words() -> None:
    from planner.cli.options import in_cli_words

    assert str(in_cli_words(_error(budget="1.5"))).startswith(
        "--budget: '1.5': a number with a point")
    assert str(in_cli_words(_error(budget="1GiB", time_limit="inf"))).startswith(
        "--time-limit: inf: must be a finite number")
    backend = _error(budget="1GiB", method="milp", options={"backend": "bogus"})
    assert str(in_cli_words(backend)).startswith("--option backend: 'bogus' is not one of")
    # JSON's words are the request's; a sweep names the budget of its list.
    assert str(_error(budget="1.5").renamed({"budget": "budgets[2]"})).startswith(
        "budgets[2]: '1.5'")


def test_unknown_methods_are_refused_before_anything_else() -> None:
    err = _error(budget="1.5", method="nope")  # the method first, then the budget
    assert "unknown method 'nope'" in str(err)


def test_a_stored_graph_is_read_only_when_the_request_needs_it() -> None:
    loads: list[int] = []

    def load() -> object:
        loads.append(1)
        return GRAPH

    stored = RequestGraph(GRAPH.content_hash(), load)  # type: ignore[arg-type]
    absolute = resolve_request(stored, "1GiB", method="store-all")
    assert absolute.budget_bytes == 2**30 and loads == []
    relative = resolve_budget("50%", stored)
    assert relative == parse_budget("50%", PEAK) and loads == [1]
    resolve_budget("60%", stored)
    assert loads == [1]  # loaded once


def test_a_worker_solves_the_stored_values_without_parsing_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = resolve_request(GRAPH, "95%", resources=HOST_MACHINE, method="chen-greedy",
                              time_limit=5)
    values = {"budget_bytes": request.budget_bytes, "method": request.method,
              "options": dict(request.options), "resources": request.resources_document(),
              "time_limit_s": request.time_limit_s, "threads": 1, "seed": 0}
    import planner.core.resources as resources_module
    import planner.engine.request as request_module

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("parsed again")

    for name in ("resources_from_dict", "resources_preset", "load_resources"):
        monkeypatch.setattr(resources_module, name, refuse)
    monkeypatch.setattr(request_module, "parse_budget_spec", refuse)
    monkeypatch.setattr(request_module, "check_method", refuse)
    again = stored_request(GRAPH, values)
    assert again.resources == request.resources and again.budget_bytes == request.budget_bytes
    plan = again.solve()
    assert plan.status.value in ("optimal", "feasible") and plan.resources == request.resources


def test_the_cli_resolves_once_and_says_flags(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.cli.main import main

    write_json(tmp_path / "g.json", GRAPH)

    def cli(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["planner-cli", *args])
        try:
            main()
        except SystemExit as e:
            return int(e.code or 0), capsys.readouterr().err
        return 0, capsys.readouterr().err

    graph = str(tmp_path / "g.json")
    code, err = cli("solve", graph, "-m", "milp", "--backend", "bogus", "--budget", "0.9")
    assert code == 2 and err.startswith("error: --backend: 'bogus' is not one of"), err
    code, err = cli("solve", graph, "--budget", "0.9", "--resources", "tpu-v9")
    assert code == 2 and err.startswith("error: --resources: preset 'tpu-v9'"), err
    code, err = cli("sweep", graph, "--budgets", "0.5,1.5", "-m", "store-all")
    assert code == 2 and err.startswith("error: --budgets: '1.5': a number with a point"), err


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    workdir = tmp_path_factory.mktemp("resolution")
    settings = Settings(database_url=f"sqlite:///{workdir / 's.db'}", workers=1,
                        max_time_limit_s=30)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize(("path", "body", "field", "start"), [
    ("/v1/plans", {"budget": "1.5"}, "budget", "budget: '1.5': a number with a point"),
    ("/v1/plans", {"budget": 0.9, "method": "offload-greedy"}, "resources",
     "resources: missing; method offload-greedy offloads"),
    ("/v1/plans", {"budget": 0.9, "method": "rotor", "options": {"slots": 0}}, "options.slots",
     "options.slots: 0 is below 1"),
    ("/v1/plans", {"budget": 0.9, "resources": "tpu-v9"}, "resources",
     "resources: preset 'tpu-v9': unknown"),
    ("/v1/sweeps", {"budgets": [0.5, 1.5]}, "budgets[1]",
     "budgets[1]: 1.5: a number with a point"),
    ("/v1/sweeps", {"budgets": ["12.5"]}, "budgets[0]",
     "budgets[0]: '12.5': a number with a point"),
])
def test_the_service_says_the_body_field(
    api: TestClient, path: str, body: dict[str, object], field: str, start: str
) -> None:
    r = api.post(path, json={"graph": GRAPH.model_dump(mode="json"), **body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["message"].startswith(start) and error["details"] == {"field": field}, error


def test_the_service_resolves_a_job_once_and_keeps_the_values(api: TestClient) -> None:
    r = api.post("/v1/plans?wait=20", json={"graph": GRAPH.model_dump(mode="json"),
                                            "budget": "95%", "method": "chen-greedy",
                                            "resources": HOST_MACHINE})
    assert r.status_code == 200, r.text
    job = r.json()
    expected = resolve_request(GRAPH, "95%", resources=HOST_MACHINE, method="chen-greedy")
    assert job["budget_bytes"] == expected.budget_bytes
    assert job["resources"] == expected.resources_document()
    assert job["status"] == "done" and job["plan"]["resources"] == job["resources"]


def test_a_graph_document_is_read_as_the_cli_reads_a_file() -> None:
    request = resolve_request(GRAPH.model_dump(mode="json"), "1GiB", method="store-all")
    assert request.graph_hash == GRAPH.content_hash()
    with pytest.raises(InputError, match="upload.json"):
        resolve_request({"nodes": "many"}, "1GiB", graph_where="upload.json")
