"""The schedule and micro-batch count chosen with the split (planner.engine.job_choice,
`partition --schedule auto --global-batch`): the fastest option that fits, its bounds valid,
its claims honest, bad requests one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run

from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.io import load_plan, write_json
from planner.engine.job_choice import OptionResult, choose_job, proven_fastest
from planner.engine.job_options import AUTO_SCHEDULES, JobOption, job_options
from planner.engine.partition import partition_plan
from planner.sim.simulator import simulate

SIZES = (1, 2, 4)
GLOBAL_BATCH = 8


def traced(batch_size: int, layers: int = 4) -> Graph:
    from planner import zoo
    from planner.tracing import trace

    model, inputs = zoo.gpt(batch_size=batch_size, context=16, dim=32, layers=layers, vocab=64,
                            dropout=0.0)
    return trace(model, inputs, device_profile="h100", optimizer="adam").graph


@pytest.fixture(scope="module")
def graphs() -> list[tuple[str, Graph]]:
    return [(f"b{b}", traced(b)) for b in SIZES]


def test_choice_is_the_fastest_option_and_its_bounds_hold(graphs: list[tuple[str, Graph]]
                                                          ) -> None:
    choice = choose_job(graphs, global_batch=GLOBAL_BATCH, method="whole", devices=2,
                        time_limit_s=6.0)
    assert {(r.option.micro_batch_size, r.option.microbatches) for r in choice.results} == \
        {(b, GLOBAL_BATCH // b) for b in SIZES}
    assert len(choice.results) == len(SIZES) * len(AUTO_SCHEDULES)
    best = choice.best.step_ms
    assert best is not None and choice.report.fits
    for r in choice.results:
        assert r.work_bound_ms is not None
        if r.fits:  # the bound is below every step found, and the choice is the fastest
            assert r.work_bound_ms <= (r.step_ms or 0.0) + 1e-9
            assert best <= (r.step_ms or 0.0) + 1e-9
        elif r.note.startswith("ruled out"):
            assert r.work_bound_ms >= best - 1e-9
    # the chosen plan is what it says: its count and schedule, replayed by the simulator
    plan = choice.report.plan
    o = choice.best.option
    assert plan.details["microbatches"] == o.microbatches
    assert plan.details["schedule"] == o.schedule
    assert simulate(graphs[o.graph_index][1], plan).makespan_ms == pytest.approx(best)
    assert len(plan.details["choice"]) == len(choice.results)


def test_each_option_alone_is_no_faster_than_the_choice(graphs: list[tuple[str, Graph]]) -> None:
    """Every option planned on its own with the whole limit (dp: deterministic) is never faster
    than the option the choice picks."""
    kwargs: dict = dict(method="dp", devices=2)
    choice = choose_job(graphs, global_batch=GLOBAL_BATCH, schedules=("1f1b", "zb-h1", "gpipe"),
                        time_limit_s=3.0, **kwargs)
    alone = []
    for label, graph in graphs:
        b = graph.metadata.batch_size
        assert b is not None
        for schedule in ("1f1b", "zb-h1", "gpipe"):
            r = partition_plan(graph, microbatches=GLOBAL_BATCH // b, schedule=schedule,
                               **kwargs)
            alone.append((r.makespan_ms, label, schedule))
    assert choice.best.step_ms == pytest.approx(min(alone)[0])


def test_memory_changes_the_choice(graphs: list[tuple[str, Graph]]) -> None:
    """Below the least memory the fastest option needs, another (smaller micro-batches) wins;
    below every option's least, NoPlanFits with the least of them."""
    from planner.engine.partition import make_problem
    from planner.solvers.pipeline.dp import least_memory_split

    def least(k: int) -> int:
        graph = graphs[k][1]
        m = GLOBAL_BATCH // (graph.metadata.batch_size or 1)
        problem = make_problem(graph, devices=2, memory_bytes=None, microbatches=m,
                               schedule="1f1b")
        return least_memory_split(problem)[0]

    roomy = choose_job(graphs, global_batch=GLOBAL_BATCH, schedules=("1f1b",), method="dp",
                       devices=2)
    k = roomy.best.option.graph_index
    tight = choose_job(graphs, global_batch=GLOBAL_BATCH, schedules=("1f1b",), method="dp",
                       devices=2, device_memory_bytes=least(k) - 1)
    assert tight.best.option.graph_index != k
    assert tight.report.plan.predicted is not None
    assert tight.report.plan.predicted.peak_bytes <= least(k) - 1
    assert (tight.best.step_ms or 0.0) >= (roomy.best.step_ms or 0.0) - 1e-9
    lowest = min(least(j) for j in range(len(graphs)))
    with pytest.raises(NoPlanFits) as e:
        choose_job(graphs, global_batch=GLOBAL_BATCH, schedules=("1f1b",), method="dp",
                   devices=2, device_memory_bytes=lowest - 1)
    assert e.value.smallest_feasible_bytes == lowest
    assert "no option fits" in str(e.value)


def _result(step: float | None, *, proven: bool = False, bound: float | None = None,
            error: bool = False) -> OptionResult:
    """An option result without a report: fits/proven read from a stand-in."""
    from types import SimpleNamespace

    option = JobOption(0, "g", 1, 4, f"s{step}{bound}{error}")
    report = None
    if step is not None:
        plan = SimpleNamespace(status="optimal" if proven else "feasible", method="dp",
                               lower_bound=None)
        report = SimpleNamespace(fits=True, makespan_ms=step, plan=plan)
    return OptionResult(option, report, 0.0, work_bound_ms=bound,  # type: ignore[arg-type]
                        error=InputError("no") if error else None)


def test_proven_fastest_needs_every_other_option_ruled_out() -> None:
    best = _result(10.0, proven=True)
    assert proven_fastest(best, [best, _result(12.0, proven=True), _result(None, bound=10.0),
                                 _result(None, error=True)])
    assert not proven_fastest(best, [best, _result(12.0)])  # more time might beat 10
    assert not proven_fastest(best, [best, _result(None, bound=9.0)])
    assert not proven_fastest(_result(10.0), [_result(10.0)])


def test_bad_requests_say_what_to_give(graphs: list[tuple[str, Graph]]) -> None:
    with pytest.raises(InputError, match="give the global batch"):
        job_options(graphs, global_batch=None, microbatches=4, schedules=("1f1b",))
    with pytest.raises(InputError, match="not both"):
        job_options(graphs[:1], global_batch=8, microbatches=4, schedules=("1f1b",))
    with pytest.raises(InputError, match="no schedule 'zb'"):
        job_options(graphs, global_batch=8, microbatches=None, schedules=("zb",))
    with pytest.raises(InputError, match="both traced at micro-batch size 1"):
        job_options([graphs[0], ("copy", graphs[0][1])], global_batch=8, microbatches=None,
                    schedules=("1f1b",))
    unsized = graphs[0][1].model_copy(update={"metadata": graphs[0][1].metadata.model_copy(
        update={"batch_size": None})})
    with pytest.raises(InputError, match="no batch size recorded"):
        job_options([("u", unsized)], global_batch=8, microbatches=None, schedules=("1f1b",))
    options, notes = job_options(graphs, global_batch=6, microbatches=None, schedules=("1f1b",))
    assert [o.microbatches for o in options] == [6, 3] and "b4" in notes[0]
    with pytest.raises(InputError, match="divides the global batch 3"):
        job_options(graphs[1:], global_batch=3, microbatches=None, schedules=("1f1b",))
    bigger = ("big", traced(2, layers=5))
    with pytest.raises(InputError, match="one model at several micro-batch sizes"):
        job_options([graphs[0], bigger], global_batch=8, microbatches=None, schedules=("1f1b",))


def test_solve_chooses_the_schedule_with_the_schedules_option(
        graphs: list[tuple[str, Graph]]) -> None:
    """`solve()` / the service: the `schedules` option of a pipeline method plans each schedule
    at the resources' count and keeps the fastest."""
    from planner.core.resources import Resources
    from planner.engine.pipeline_solve import solve_pipeline

    graph = graphs[1][1]
    machine = Resources(device_count=2, microbatches=4)
    plan = solve_pipeline(graph, 2**40, "dp", options={"schedules": "1f1b,zb-h1"},
                          resources=machine)
    rows = plan.details["choice"]
    assert [r["schedule"] for r in rows] == ["1f1b", "zb-h1"]
    assert plan.details["schedule"] in ("1f1b", "zb-h1") and plan.details["microbatches"] == 4
    assert plan.predicted is not None
    assert plan.predicted.makespan_ms == pytest.approx(min(r["step_ms"] for r in rows))
    with pytest.raises(InputError, match="schedules: no schedule 'zb'"):
        solve_pipeline(graph, 2**40, "dp", options={"schedules": "zb"}, resources=machine)
    with pytest.raises(InputError, match="a given split runs one schedule"):
        solve_pipeline(graph, 2**40, "dp", options={"schedules": "auto", "split": "h.2"},
                       resources=machine)


def test_cli_chooses_writes_the_plan_and_refuses_bad_input(
        capsys: pytest.CaptureFixture[str], graphs: list[tuple[str, Graph]],
        tmp_path: Path) -> None:
    paths = []
    for label, graph in graphs:
        paths.append(tmp_path / f"{label}.json")
        write_json(paths[-1], graph)
    plan_path, csv_path = tmp_path / "plan.json", tmp_path / "actions.csv"
    code, out, err = run(capsys, "partition", *paths, "--global-batch", GLOBAL_BATCH,
                         "--devices", "2", "--schedule", "1f1b,zb-h1", "--method", "whole",
                         "--time-limit", "3", "-o", plan_path, "--csv", csv_path)
    assert code == 0, err
    assert "options: 6" in out and "step time (simulated)" in out
    plan = load_plan(plan_path)
    from planner.core.pipeline_actions import rank_actions_from_csv

    assert rank_actions_from_csv(csv_path.read_text()) == plan.rank_actions
    chosen = [r for r in plan.details["choice"] if r["step_ms"] == plan.predicted.makespan_ms]  # type: ignore[union-attr]
    assert chosen and chosen[0]["microbatches"] == plan.details["microbatches"]
    code, out, err = run(capsys, "partition", *paths, "--global-batch", GLOBAL_BATCH,
                         "--devices", "2", "--schedule", "auto", "--method", "dp", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["choice"]) == len(SIZES) * len(AUTO_SCHEDULES)
    for args, message in [
        ([*paths, "--devices", "2"], "--global-batch: 3 graphs"),
        ([paths[0], "--global-batch", "8", "--microbatches", "4", "--devices", "2"],
         "--microbatches: give the micro-batch count or the global batch"),
        ([paths[0], "--global-batch", "8", "--devices", "2", "--schedule", "1f1b,zb"],
         "'zb' is not one of"),
        ([paths[0], "--global-batch", "8", "--devices", "2", "--sweep"], "--sweep"),
    ]:
        code, out, err = run(capsys, "partition", *args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_second_run_of_a_request_goes_on_from_the_first(
        graphs: list[tuple[str, Graph]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Job choice's second round plans an option again: with the memo of the first run's
    problem it reuses that search's knapsacks (none is solved again) and answers no slower."""
    from planner.engine.partition import make_problem
    from planner.solvers.pipeline import policy_splits
    from planner.solvers.pipeline.dp import least_memory_split

    graph = graphs[0][1]
    kwargs: dict = dict(microbatches=GLOBAL_BATCH, schedule="1f1b", method="whole", devices=2,
                        time_limit_s=20.0)
    problem = make_problem(graph, devices=2, memory_bytes=None, microbatches=GLOBAL_BATCH,
                           schedule="1f1b")
    kwargs["device_memory_bytes"] = int(0.95 * least_memory_split(problem)[0])  # remat needed
    solved: list[int] = []
    real_choose = policy_splits.choose
    monkeypatch.setattr(policy_splits, "choose", lambda *a, **k: solved.append(1) or
                        real_choose(*a, **k))
    memo: dict = {}
    first = partition_plan(graph, problems=memo, **kwargs)
    assert first.fits
    # the first search finished: the second has nothing new to do
    assert first.plan.status.value == "optimal" or "all judged" in " ".join(first.notes)
    (kept,) = memo.values()
    job, knapsacks = kept.whole_job, len(solved)
    assert job is not None and knapsacks > 0
    second = partition_plan(graph, problems=memo, **kwargs)
    assert len(memo) == 1 and kept.whole_job is job
    assert len(solved) == knapsacks  # every stage's choice came from the first run
    assert second.makespan_ms <= first.makespan_ms + 1e-9
    fresh = partition_plan(graph, **kwargs)  # no memo: the same answer, solved again
    assert fresh.makespan_ms == pytest.approx(second.makespan_ms)
    assert len(solved) > knapsacks
