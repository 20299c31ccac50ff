"""One request from every entry point (issue 49 item 1): a method's options from the CLI
(`--option KEY=VALUE` on solve, sweep, partition and submit, typed from the method's spec), the
REST partitions route (`options`, through the plan request's resolution), one default time
limit per plan kind, `-m` as `--method` everywhere, and a pipeline plan refused for what it is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import run
from fastapi.testclient import TestClient

from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.limits import (
    DEFAULT_PIPELINE_TIME_LIMIT_S,
    DEFAULT_SWEEP_TIME_LIMIT_S,
    DEFAULT_TIME_LIMIT_S,
)
from planner.core.synthetic import training_graph
from planner.engine.registry import method_specs
from planner.engine.request import default_time_limit_s, resolve_request
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.spec import OptionSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "planner" / "examples" / "resnet24.json"
GRAPH = training_graph(8, skip=2, seed=7, fixed_bytes=4096)
PIPE = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 2))  # tok, h.0..h.5, head


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("options")
    write_json(folder / "g.json", GRAPH)
    write_json(folder / "pipe.json", PIPE)
    return {"graph": folder / "g.json", "pipe": folder / "pipe.json"}


# -- solve ---------------------------------------------------------------------------------------
def test_the_readme_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`solve graph.json --method auto --option space=compiled` (was: No such option)."""
    code, out, err = run(capsys, "solve", EXAMPLE, "--method", "auto", "--option",
                         "space=compiled", "--budget", "75%", "--time-limit", "20", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"] in ("optimal", "feasible")
    assert summary["backend"].startswith("sac"), summary  # the compiled space: method sac


def test_a_typed_integer_option_reaches_the_method(capsys: pytest.CaptureFixture[str],
                                                   paths: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.engine.request import ResolvedRequest

    seen: list[dict[str, Any]] = []
    real = ResolvedRequest.solve

    def recording(self: ResolvedRequest, **kwargs: Any) -> Any:
        seen.append(dict(self.options))
        return real(self, **kwargs)

    monkeypatch.setattr(ResolvedRequest, "solve", recording)
    code, _, err = run(capsys, "solve", paths["graph"], "-m", "rotor", "-O", "slots=50",
                       "--option", "saving=true", "--budget", "90%", "--json")
    assert code == 0, err
    assert seen == [{"slots": 50, "saving": True}]
    assert isinstance(seen[0]["slots"], int)


@pytest.mark.parametrize(("args", "line"), [
    (["--option", "nope=1"],
     "error: --option nope: method 'auto' has no option 'nope' (its options: space)"),
    (["--option", "space=fast"], "error: --option space: 'fast' is not one of any, compiled"),
    (["-m", "rotor", "-O", "slots=many"],
     "error: --option slots: 'many' is not an integer; expected an integer ≥ 1"),
    (["-m", "rotor", "-O", "slots=0"],
     "error: --option slots: 0 is below 1; expected an integer ≥ 1"),
    (["-m", "rotor", "-O", "saving=maybe"],
     "error: --option saving: 'maybe' is not a boolean; expected true or false"),
    (["-m", "rotor", "-O", "slots=5", "-O", "slots=6"], "error: --option slots: given twice"),
    (["-O", "space"], "error: --option: 'space': expected KEY=VALUE"),
    (["-m", "milp", "--backend", "bogus"],
     "error: --backend: 'bogus' is not one of cpsat, scip, highs, cbc, pulp-cbc"),
    (["-m", "milp", "--option", "backend=bogus"],
     "error: --option backend: 'bogus' is not one of cpsat, scip, highs, cbc, pulp-cbc"),
    (["-m", "milp", "--backend", "highs", "-O", "backend=cpsat"], "given twice"),
])
def test_a_bad_option_is_one_line_naming_it(capsys: pytest.CaptureFixture[str],
                                            paths: dict[str, Path], args: list[str],
                                            line: str) -> None:
    code, _, err = run(capsys, "solve", paths["graph"], "--budget", "90%", *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(line) or line in err, err


def _valid_text(spec: OptionSpec) -> tuple[str, object]:
    """A value `spec` takes, as text and as the value it is."""
    if spec.kind == "bool":
        return ("false", False) if spec.default else ("true", True)
    if spec.kind == "int":
        value = spec.minimum if spec.minimum is not None else 1
        value = value + 1 if spec.maximum is None or value < spec.maximum else value
        return str(value), value
    if spec.kind == "choice":
        return spec.choices[-1], spec.choices[-1]
    return "h.2", "h.2"


ALL_OPTIONS = [(spec.name, option) for spec in method_specs() for option in spec.option_specs()]


def test_every_option_planner_cli_methods_lists_is_covered(capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    code, out, _ = run(capsys, "methods")
    assert code == 0
    listed = {line.split(":")[0].strip() for line in out.splitlines() if line.startswith("    ")}
    assert listed == {option.name for _, option in ALL_OPTIONS}


@pytest.mark.parametrize(("method", "option"), ALL_OPTIONS,
                         ids=[f"{m}.{o.name}" for m, o in ALL_OPTIONS])
def test_every_listed_option_can_be_set_from_the_cli(method: str, option: OptionSpec) -> None:
    from planner.cli.options import method_options
    from planner.engine.request import check_method

    text, value = _valid_text(option)
    options = method_options([f"{option.name}={text}"], method)
    assert options == {option.name: value}
    check_method(method, options)  # what solve's resolution checks next
    if option.nullable:
        assert method_options([f"{option.name}=null"], method) == {option.name: None}


# -- sweep ---------------------------------------------------------------------------------------
def test_sweep_takes_resources_and_options(capsys: pytest.CaptureFixture[str],
                                           paths: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "sweep.json"
    code, out, err = run(capsys, "sweep", paths["graph"], "--budgets", "0.7,1.0", "-m", "rotor",
                         "--option", "slots=60", "--resources", "h100-pcie-gen5", "--jobs", "1",
                         "--time-limit", "10", "--json-out", table, "--json")
    assert code == 0, err
    saved = json.loads(table.read_text())
    assert saved["options"] == {"slots": 60}
    assert saved["resources"]["device_memory_bytes"] > 0
    assert [row["status"] for row in json.loads(out)][-1] in ("optimal", "feasible")
    # An offload method needs the machine's host tier: the request's check, as solve's.
    code, _, err = run(capsys, "sweep", paths["graph"], "--budgets", "0.7", "-m",
                       "offload-greedy", "--jobs", "1")
    assert code == 2 and err.startswith("error: --resources: missing"), err
    code, _, err = run(capsys, "sweep", paths["graph"], "-m", "rotor", "-O", "slot=1")
    assert code == 2 and err.startswith("error: --option slot: method 'rotor' has no option"), err


def test_a_sweep_solves_its_one_request_at_each_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.engine.request import ResolvedRequest
    from planner.engine.sweep import run_sweep, sweep_request

    seen: list[tuple[int, dict[str, Any], float]] = []
    real = ResolvedRequest.solve

    def recording(self: ResolvedRequest, **kwargs: Any) -> Any:
        seen.append((self.budget_bytes, dict(self.options), self.time_limit_s))
        return real(self, **kwargs)

    monkeypatch.setattr(ResolvedRequest, "solve", recording)
    budgets = [(None, 60_000), (None, 90_000)]
    request = sweep_request(GRAPH, budgets, method="rotor", options={"slots": 40}, time_limit=7)
    run_sweep(request, budgets, jobs=1)
    assert seen == [(60_000, {"slots": 40}, 7.0), (90_000, {"slots": 40}, 7.0)]


# -- partition -----------------------------------------------------------------------------------
def test_partition_m_is_method_and_options_are_typed(capsys: pytest.CaptureFixture[str],
                                                     paths: dict[str, Path]) -> None:
    base = ["partition", paths["pipe"], "--devices", "2", "--device-memory", "2GiB",
            "--microbatches", "8"]
    code, out, err = run(capsys, *base, "-m", "ilp", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["method"] == "ilp"
    code, out, err = run(capsys, *base, "--schedule", "interleaved-1f1b", "-O", "chunks=3",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["details"]["chunks"] == 3
    code, out, err = run(capsys, *base, "-O", "split=h.3", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["partition"]["stages"][1]["modules"][0] == "h.3"
    code, _, err = run(capsys, *base, "--chunks", "2", "-O", "chunks=3")
    assert code == 2 and "given twice" in err, err
    code, _, err = run(capsys, *base, "-O", "chunks=x")
    assert code == 2 and err.startswith("error: --option chunks: 'x' is not an integer"), err
    code, _, err = run(capsys, *base, "-O", "schedules=bogus")
    assert code == 2 and err.startswith("error: --option schedules: 'bogus' is not one of"), err


# -- submit --------------------------------------------------------------------------------------
def test_submit_sends_typed_options(capsys: pytest.CaptureFixture[str], paths: dict[str, Path],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.cli.service_cmds as service_cmds

    sent: list[dict[str, Any]] = []

    def call(_client: object, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        sent.append(kwargs["json"])
        return 202, {"id": "p1", "status": "queued"}

    monkeypatch.setattr(service_cmds, "_call", call)
    code, _, err = run(capsys, "submit", paths["graph"], "--budget", "90%", "-m", "milp",
                       "--option", "hint=false", "-O", "backend=highs")
    assert code == 0, err
    assert sent[0]["options"] == {"hint": False, "backend": "highs"}
    code, _, err = run(capsys, "submit", paths["graph"], "--budget", "90%", "-m", "milp",
                       "--option", "hint=perhaps")
    assert code == 2 and err.startswith("error: --option hint: 'perhaps' is not a boolean"), err
    assert len(sent) == 1  # nothing sent
    # The machine too: a preset by name, a resources.json file as its document.
    machine = paths["graph"].parent / "machine.json"
    machine.write_text(json.dumps({"preset": "h100-pcie-gen5", "host_memory_bytes": 2**34}))
    for given, document in (("h100-pcie-gen5", "h100-pcie-gen5"),
                            (str(machine), json.loads(machine.read_text()))):
        code, _, err = run(capsys, "submit", paths["graph"], "--budget", "90%", "-m",
                           "offload-greedy", "--resources", given)
        assert code == 0, err
        assert sent[-1]["resources"] == document


# -- REST ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from planner.api.app import create_app
    from planner.api.settings import Settings

    workdir = tmp_path_factory.mktemp("options-api")
    settings = Settings(database_url=f"sqlite:///{workdir / 's.db'}", workers=1,
                        max_time_limit_s=30, submissions_per_minute=100_000)
    with TestClient(create_app(settings)) as client:
        yield client


PARTITION = {"graph": PIPE.model_dump(mode="json"), "devices": 2, "device_memory": "2GiB",
             "microbatches": 4, "method": "dp", "time_limit": 5}


def test_rest_partitions_take_options(api: TestClient) -> None:
    r = api.post("/v1/partitions?wait=30", json={**PARTITION, "options": {"split": "h.3"}})
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["options"] == {"split": "h.3", "chunks": 2}, job
    assert job["plan"]["partition"]["stages"][1]["modules"][0] == "h.3"
    r = api.post("/v1/partitions", json={**PARTITION, "options": {"nope": 1}})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith(
        "options.nope: method 'pipeline-dp' has no option 'nope'"), r.text
    r = api.post("/v1/partitions", json={**PARTITION, "split": ["h.3"],
                                        "options": {"split": "h.4"}})
    assert r.status_code == 422 and "given twice" in r.json()["error"]["message"], r.text
    r = api.post("/v1/partitions", json={**PARTITION, "options": {"chunks": 99}})
    assert r.status_code == 422, r.text


def test_rest_plans_and_sweeps_type_options_from_the_spec(api: TestClient) -> None:
    body = {"graph": GRAPH.model_dump(mode="json"), "method": "rotor"}
    r = api.post("/v1/plans", json={**body, "budget": 0.9, "options": {"slots": "50"}})
    assert r.status_code == 422 and "options.slots" in r.json()["error"]["message"], r.text
    r = api.post("/v1/sweeps", json={**body, "budgets": [0.9], "options": {"nope": 1}})
    assert r.status_code == 422 and "options.nope" in r.json()["error"]["message"], r.text


# -- time limits and -m ---------------------------------------------------------------------------
def test_one_default_time_limit_per_plan_kind() -> None:
    import planner.cli.pipeline_cmds as pipeline_cmds
    import planner.solvers.pipeline.dp as dp
    from planner.api.routers.partitions import PartitionRequest

    assert default_time_limit_s("auto") == DEFAULT_TIME_LIMIT_S
    assert default_time_limit_s("pipeline-dp") == DEFAULT_PIPELINE_TIME_LIMIT_S
    assert resolve_request(GRAPH, "90%", method="rotor").time_limit_s == DEFAULT_TIME_LIMIT_S
    assert PartitionRequest.model_fields["time_limit"].default == DEFAULT_PIPELINE_TIME_LIMIT_S
    # No module keeps a default of its own any more.
    assert not hasattr(pipeline_cmds, "DEFAULT_TIME_LIMIT_S")
    assert not hasattr(dp, "DEFAULT_TIME_LIMIT_S")
    assert DEFAULT_SWEEP_TIME_LIMIT_S > 0


def test_m_is_method_on_every_command() -> None:
    import typer.main

    from planner.cli import main as cli_main
    from planner.cli import pipeline_cmds

    if not any(c.name == "partition" for c in cli_main.app.registered_commands):
        pipeline_cmds.register(cli_main.app)
    group = typer.main.get_command(cli_main.app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if "-m" in getattr(param, "opts", []):
                assert "--method" in param.opts, (name, param.opts)


def test_a_pipeline_plan_is_refused_for_being_one() -> None:
    pytest.importorskip("torch")
    from planner.engine.partition import partition_plan
    from planner.runtime.apply import runnable_plan

    plan = partition_plan(PIPE, devices=2, microbatches=2).plan
    with pytest.raises(InputError) as info:
        runnable_plan(plan, (), "applied", "; one-device plans only")
    message = str(info.value)
    assert "a pipeline plan" in message and "only a feasible or optimal" not in message, message
