"""The FSDP planner as a method (issue 52): plan kind fsdp, the `fsdp` method in the registry,
the engine's solve judging its plan with the simulator, `planner-cli solve --fsdp N`, the
trace flag that stores the block profile, POST /v1/plans, and the runtime's one-line refusal.

The graphs carry a small hand-made FSDP model (torch-free); one test profiles a tiny GPT.
No wall-clock assertion."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServerProcess, running_server, wait_finished
from conftest import run_cli

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.plan import Plan, PlanKind, PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.request import resolve_request, resolve_resources
from planner.engine.solve import solve
from planner.sim.fsdp import BlockCosts, FsdpModel, FsdpPlan, Phase, simulate_fsdp
from planner.sim.fsdp_plans import DEFAULT_FSDP_LINK, fsdp_link
from planner.sim.simulator import simulate
from planner.solvers.fsdp.search import solve_fsdp


def fsdp_model(blocks: int = 4, u: int = 1000) -> FsdpModel:
    """Per block: full recompute keeps least and reruns the forward; selective in between."""
    fwd = {"keep": Phase(600, 500, 1.0), "selective": Phase(620, 300, 1.1),
           "full": Phase(560, 60, 1.0)}
    bwd = {"keep": Phase(1200, -500, 2.0), "selective": Phase(1400, -300, 2.6),
           "full": Phase(1700, -60, 3.0)}
    blk = [BlockCosts(f"h.{i}", u, {1: u, 2: u, 4: u}, fwd, bwd) for i in range(blocks)]
    return FsdpModel(200, {1: 200, 2: 200, 4: 200}, Phase(300, 250, 0.5), Phase(900, 700, 0.5),
                     Phase(800, -300, 1.0), Phase(150, 80, 0.5), tuple(blk))


MODEL = fsdp_model()
PLAIN = training_graph(6)


def with_model(graph: Graph, model: FsdpModel = MODEL) -> Graph:
    meta = graph.metadata.model_copy(update={"extra": {"fsdp_model": model.to_dict()}})
    return graph.model_copy(update={"metadata": meta})


GRAPH = with_model(PLAIN)
LINK, _ = fsdp_link(None)


def least_and_most() -> tuple[int, int]:
    """The least peak any plan reaches on 2 ranks, and the all-keep plan's (more)."""
    least = solve_fsdp(MODEL, 0, 2, LINK).least_peak_bytes
    keep = simulate_fsdp(MODEL, FsdpPlan.uniform(4, "keep", reshard=False), 2, LINK)
    assert keep.peak_bytes > least
    return least, keep.peak_bytes


def test_plan_kind_fsdp_validates_and_round_trips() -> None:
    plan = Plan(graph_hash="sha256:x", method="fsdp", status=PlanStatus.feasible,
                fsdp={"ranks": 2, "text": "policies=FFK reshard=110 prefetch=0"})
    assert plan.kind is PlanKind.fsdp and plan.text == "policies=FFK reshard=110 prefetch=0"
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    for bad, needle in [({"ranks": 2, "text": "policies=FK reshard=110 prefetch=0"},
                         "same blocks"),
                        ({"ranks": 0, "text": "policies=K reshard=1 prefetch=0"}, "ranks"),
                        ({"ranks": 2, "text": "KK"}, "text")]:
        with pytest.raises(ValueError, match=needle):
            Plan(graph_hash="sha256:x", method="fsdp", status=PlanStatus.feasible, fsdp=bad)
    with pytest.raises(ValueError, match="needs its settings in fsdp"):
        Plan(graph_hash="sha256:x", method="fsdp", status=PlanStatus.feasible, kind="fsdp")


def test_methods_lists_fsdp_with_its_options_and_imports_no_search() -> None:
    listed = run_cli("methods", "--json")
    assert listed.returncode == 0, listed.stderr
    spec = next(m for m in json.loads(listed.stdout) if m["name"] == "fsdp")
    assert spec["plan_kinds"] == ["fsdp"] and spec["claims_bounds"]
    options = {o["name"]: o for o in spec["options"]}
    assert options["ranks"]["default"] == 2 and options["ranks"]["minimum"] == 1
    assert options["depths"]["default"] == "0,1,2"
    assert options["backend"]["choices"] == ["nccl", "gloo"]
    assert options["exact_limit"]["default"] == 20000
    text = run_cli("methods")
    assert "fsdp  FSDP2: per-block AC policy" in text.stdout and "ranks:" in text.stdout
    listing = ("import contextlib, io, sys\n"
               "sys.argv = ['planner-cli', 'methods']\n"
               "from planner.cli import main\n"
               "with contextlib.redirect_stdout(io.StringIO()), "
               "contextlib.suppress(SystemExit):\n"
               "    main._main()\n"
               "print(' '.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    modules = done.stdout.split()
    assert "planner.solvers.fsdp.methods" in modules  # listed from its spec
    assert "planner.solvers.fsdp.search" not in modules and "planner.sim.fsdp" not in modules


def test_engine_solve_gives_an_fsdp_plan_judged_by_the_simulator() -> None:
    least, most = least_and_most()
    for budget in (least, (least + most) // 2, most):
        plan = solve(GRAPH, budget, "fsdp", options={"ranks": 2})
        assert plan.status is PlanStatus.optimal, plan.notes
        assert plan.kind is PlanKind.fsdp and plan.fsdp is not None and not plan.actions
        judged = simulate(GRAPH, plan)  # the simulator, as for every plan
        assert plan.predicted is not None
        assert judged.peak_bytes == plan.predicted.peak_bytes <= budget
        assert plan.objective == pytest.approx(judged.makespan_ms)
        # the fastest plan within the budget: the search's own answer, simulated again
        direct = solve_fsdp(MODEL, budget, 2, LINK)
        assert plan.objective == pytest.approx(direct.result.step_ms)
        assert plan.lower_bound is not None and plan.lower_bound <= plan.objective
        assert any(DEFAULT_FSDP_LINK in note for note in plan.notes)
    # a faster link (the resources' device link) never makes the step slower
    fast = solve(GRAPH, most, "fsdp", resources=resolve_resources("h100-sxm"))
    slow = solve(GRAPH, most, "fsdp")
    assert fast.objective is not None and slow.objective is not None
    assert fast.objective <= slow.objective


def test_budget_below_the_least_is_infeasible_with_the_least() -> None:
    least, _ = least_and_most()
    plan = solve(GRAPH, least - 1, "fsdp", options={"ranks": 2})
    assert plan.status is PlanStatus.infeasible
    assert plan.details["smallest_feasible_bytes"] == least
    assert plan.predicted is not None and plan.predicted.peak_bytes == least


def test_a_relative_budget_is_of_one_ranks_keep_all_peak() -> None:
    """`80%` of an FSDP method is of one rank's peak with every block kept (FSDP2's defaults:
    reshard after forward, prefetch 1), not of the one-device store-all peak, which a rank
    never holds; other methods keep the store-all reference."""
    from planner.solvers.baselines import store_all_peak_bytes

    keep = simulate_fsdp(MODEL, FsdpPlan.uniform(4, "keep"), 2, LINK).peak_bytes
    request = resolve_request(GRAPH, "80%", method="fsdp", options={"ranks": 2})
    assert request.budget_bytes == -(-8 * keep // 10)
    assert resolve_request(GRAPH, 1.0, method="fsdp").budget_bytes == keep
    assert resolve_request(GRAPH, "80%", method="auto").budget_bytes == \
        -(-8 * store_all_peak_bytes(GRAPH) // 10)
    with pytest.raises(InputError) as err:  # the profile is said before the budget is taken
        resolve_request(PLAIN, "80%", method="fsdp")
    assert err.value.field == "graph"


def test_local_search_and_gloo_and_depths() -> None:
    least, most = least_and_most()
    plan = solve(GRAPH, most, "fsdp",
                 options={"ranks": 4, "exact_limit": 10, "depths": "1", "backend": "gloo"})
    assert plan.status is PlanStatus.feasible and plan.backend == "fsdp-local"
    assert plan.fsdp is not None and plan.fsdp.ranks == 4 and plan.fsdp.collectives == "gloo"
    assert plan.fsdp.text.endswith("prefetch=1")
    assert plan.predicted is not None and plan.predicted.peak_bytes <= most
    with pytest.raises(InputError, match="depths"):
        resolve_request(GRAPH, most, method="fsdp", options={"depths": "x"})


def test_graph_without_a_profile_or_ranks_not_profiled_is_one_line() -> None:
    with pytest.raises(InputError, match="--fsdp-ranks") as e:
        resolve_request(PLAIN, 10_000, method="fsdp")
    assert e.value.field == "graph" and "\n" not in str(e.value)
    with pytest.raises(InputError, match="not 3"):
        resolve_request(GRAPH, 10_000, method="fsdp", options={"ranks": 3})


def test_cli_solve_fsdp(tmp_path: Path) -> None:
    least, most = least_and_most()
    path = tmp_path / "g.json"
    path.write_text(GRAPH.model_dump_json())
    out = tmp_path / "plan.json"
    done = run_cli("solve", path, "--fsdp", "2", "--budget", str(most), "-o", out)
    assert done.returncode == 0, done.stderr
    assert "fsdp plan" in done.stdout and "policies=" in done.stdout
    plan = Plan.model_validate_json(out.read_text())
    assert plan.kind is PlanKind.fsdp and plan.fsdp is not None and plan.fsdp.ranks == 2
    assert simulate(GRAPH, plan).peak_bytes <= most
    # the same as --method fsdp --option ranks=2
    same = run_cli("solve", path, "-m", "fsdp", "--option", "ranks=2", "--budget", str(most),
                   "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["objective"] == plan.objective
    # below the least: exit 3 with the least
    below = run_cli("solve", path, "--fsdp", "2", "--budget", str(least - 1), "--json")
    assert below.returncode == 3, below.stderr
    summary = json.loads(below.stdout)
    assert summary["smallest_known_budget_bytes"] == least
    assert summary["smallest_known_budget_by"] == "method fsdp"
    assert f"{least} bytes" in below.stderr
    # no profile: one line, exit 2
    plain = tmp_path / "plain.json"
    plain.write_text(PLAIN.model_dump_json())
    missing = run_cli("solve", plain, "--fsdp", "2", "--budget", "1GiB")
    assert missing.returncode == 2
    assert "--fsdp-ranks" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    other = run_cli("solve", path, "--fsdp", "2", "-m", "rotor", "--budget", "1GiB")
    assert other.returncode == 2 and "--fsdp" in other.stderr


def test_runtime_apply_refuses_an_fsdp_plan_in_one_line() -> None:
    pytest.importorskip("torch")
    from planner.runtime.apply import runnable_plan
    from planner.runtime.fsdp_apply import fsdp_plan_of

    plan = solve(GRAPH, least_and_most()[1], "fsdp")
    with pytest.raises(InputError, match="apply_fsdp_plan") as e:
        runnable_plan(plan, (), "applied", "")
    assert "\n" not in str(e.value)
    assert fsdp_plan_of(plan) == FsdpPlan.parse(plan.text)
    infeasible = solve(GRAPH, 0, "fsdp")
    with pytest.raises(InputError, match="infeasible"):
        fsdp_plan_of(infeasible)


def test_profile_stored_by_the_tracer_plans() -> None:
    """graph_with_fsdp_model (what `trace --fsdp-ranks` runs) on a tiny GPT: the profile is
    part of the graph's hash (planned with), the method plans with it."""
    pytest.importorskip("torch")
    from planner import zoo
    from planner.tracing.fsdp_blocks import graph_with_fsdp_model

    model, inputs = zoo.gpt(batch_size=2, context=16, dim=32, layers=2, vocab=64, dropout=0.0)
    graph = graph_with_fsdp_model(PLAIN, model, inputs, (2, 4), repeats=1)
    assert graph.content_hash() != PLAIN.content_hash()
    assert graph.model_copy(update={"metadata": PLAIN.metadata}).content_hash() == \
        PLAIN.content_hash()
    profile = FsdpModel.from_dict(graph.metadata.extra["fsdp_model"])
    assert len(profile.blocks) == 2 and set(profile.root_padded_bytes) == {2, 4}
    plan = solve(graph, 1 << 30, "fsdp", options={"ranks": 4})
    assert plan.status is PlanStatus.optimal and plan.fsdp is not None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("fsdp-api")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000, max_time_limit_s=30) as srv:
        yield srv


def test_post_plans_with_method_fsdp(server: ServerProcess) -> None:
    least, most = least_and_most()
    doc = GRAPH.model_dump(mode="json")
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": doc, "budget": most, "method": "fsdp",
                                      "options": {"ranks": 2}})
        assert r.status_code in (200, 202), r.text
        job = wait_finished(c, r.json()["id"])
        assert job["status"] == "done", job
        plan = Plan.model_validate(job["plan"])
        assert plan.kind is PlanKind.fsdp and plan.fsdp is not None
        assert job["report"]["kind"] == "fsdp" and job["report"]["peak_bytes"] <= most
        assert simulate(GRAPH, plan).peak_bytes <= most
        r = c.post("/v1/plans", json={"graph": doc, "budget": least - 1, "method": "fsdp"})
        job = wait_finished(c, r.json()["id"])
        assert job["status"] == "infeasible", job
        assert job["report"]["smallest_feasible_bytes"] == least
        r = c.post("/v1/plans", json={"graph": training_graph(5).model_dump(mode="json"),
                                      "budget": most, "method": "fsdp"})
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "--fsdp-ranks" in message and "\n" not in message


def test_post_plans_reads_the_profile_of_the_graph_sent(server: ServerProcess) -> None:
    """The graph's hash leaves metadata out but for the FSDP profile: a graph sent first
    without its profile and then with it is planned with the profile sent."""
    bare = training_graph(7)
    most = least_and_most()[1]
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": bare.model_dump(mode="json"), "budget": most,
                                      "method": "fsdp"})
        assert r.status_code == 422, r.text
        r = c.post("/v1/plans", json={"graph": with_model(bare).model_dump(mode="json"),
                                      "budget": most, "method": "fsdp"})
        assert r.status_code in (200, 202), r.text
        job = wait_finished(c, r.json()["id"])
        assert job["status"] == "done", job
