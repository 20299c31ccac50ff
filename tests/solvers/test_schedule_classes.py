"""Pipeline schedules as classes in one registry; the stage sums shared with the simulator."""

from __future__ import annotations

from typing import get_args

import pytest

from planner.core.errors import InputError
from planner.core.resources import PipelineSchedule as ScheduleName
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.stage_costs import one_stage_peak_bytes, stage_costs
from planner.solvers.pipeline.action_lists import inflight_counts, with_communication
from planner.solvers.pipeline.chains import LayerSpec, chain_graph
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.schedules import (
    SCHEDULE_CLASSES,
    SCHEDULES,
    SPLIT_BACKWARD,
    GPipe,
    Interleaved1F1B,
    OneFOneB,
    ZeroBubbleH1,
    ZeroBubbleH2,
    check_schedule,
    compute_lists,
    make_schedule,
    schedule_class,
    stages_per_rank,
)
from planner.solvers.pipeline.units import UnitChain

MiB = 2**20


def test_one_registry_spells_every_name() -> None:
    assert SCHEDULES == ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")
    assert set(SCHEDULES) == set(get_args(ScheduleName))  # the plan contract's names
    assert [schedule_class(n) for n in SCHEDULES] == [
        GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1, ZeroBubbleH2]
    assert SPLIT_BACKWARD == {"zb-h1", "zb-h2"}
    assert all(SCHEDULE_CLASSES[n].name == n for n in SCHEDULES)


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (("pipedream", 4, 8), "schedule", "use one of gpipe, 1f1b"),
        (("1f1b", 0, 8), "devices", "at least 1 device"),
        (("gpipe", 2, 0), "microbatches", "at least 1"),
        (("interleaved-1f1b", 4, 8, 1), "chunks", "at least 2 stages a rank"),
        (("interleaved-1f1b", 4, 6, 2), "microbatches", r"multiple of 4 \(e\.g\. 8\)"),
    ],
)
def test_checks_name_the_field_not_a_flag(args: tuple, field: str, words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        check_schedule(*args)
    assert info.value.field == field and "--" not in str(info.value)
    assert str(info.value.renamed({field: f"--{field}"})).startswith(f"--{field}: ")
    with pytest.raises(InputError):
        make_schedule(*args)


def test_stages_per_rank_and_inflight_limits() -> None:
    assert stages_per_rank("interleaved-1f1b", 3) == 3 and stages_per_rank("zb-h1", 3) == 1
    assert make_schedule("interleaved-1f1b", 2, 4, 3).stage_count == 6
    assert [GPipe(4, 8).inflight_limit(r) for r in range(4)] == [8] * 4
    assert [OneFOneB(4, 8).inflight_limit(r) for r in range(4)] == [4, 3, 2, 1]
    assert [ZeroBubbleH2(4, 8).inflight_limit(r) for r in range(4)] == [7, 5, 3, 1]
    assert ZeroBubbleH1(4, 2).inflight_per_stage() == [2, 2, 2, 1]


@pytest.mark.parametrize("name", SCHEDULES)
def test_each_class_is_its_lists(name: str) -> None:
    sched = make_schedule(name, 4, 8, 2)
    lists = sched.compute_lists()
    assert lists == compute_lists(name, 4, 8, 2)
    assert sched.rank_actions() == with_communication(lists, 4)
    counts = inflight_counts(lists, sched.stage_count)
    if sched.split_backward:  # list scheduling may hold fewer than its limit
        assert all(c <= k for c, k in zip(counts, sched.inflight_per_stage(), strict=True))
    else:
        assert sched.inflight_per_stage() == counts


def test_one_f_one_b_order() -> None:
    text = [" ".join(str(a) for a in row) for row in OneFOneB(2, 3).compute_lists()]
    assert text == ["0F0 0F1 0B0 0F2 0B1 0B2", "1F0 1B0 1F1 1B1 1F2 1B2"]


def test_torch_names_resolve() -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for cls in SCHEDULE_CLASSES.values():
        if cls.torch_class is not None:
            assert schedules.get_schedule_class(cls.torch_class).__name__.endswith(
                cls.torch_class)


# -- stage sums: the partitioner's and the simulator's are the same -------------------------------
def _problem(schedule: str) -> PipelineProblem:
    specs = [LayerSpec(f"h.{i}", 1.0 + 0.1 * i, 2.0, (10 + i) * MiB, MiB, 4 * MiB)
             for i in range(8)]
    g = chain_graph(specs)
    return PipelineProblem(g, UnitChain(g), 2, 4, schedule, None)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_range_costs_are_the_simulators_stage_costs(schedule: str) -> None:
    p = _problem(schedule)
    split = Split(((0, 3), (3, 8)))
    sim_costs = stage_costs(p.graph, p.partition(split))
    for s, (i, j) in enumerate(split.bounds):
        mine = p.costs(i, j, s)
        theirs = sim_costs[s]
        for f in ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms",
                  "saved_bytes", "input_bytes", "transient_bytes", "model_state_bytes",
                  "send_forward_bytes", "send_backward_bytes"):
            assert getattr(mine, f) == pytest.approx(getattr(theirs, f)), f
        assert p.stage_memory(mine, s) == one_stage_peak_bytes(
            theirs, p.inflight[s], None, p.microbatches, p.plan_schedule.split_backward)
    cand = p.candidate(split)
    assert cand.simulation is not None
    assert cand.peaks == cand.simulation.per_rank_peak_bytes
    assert max(cand.peaks) == simulate_pipeline(p.graph, cand.partition,
                                                cand.rank_actions).peak_bytes
