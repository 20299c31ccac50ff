"""plan.json v2: text forms that parse back, kinds, the typed block plan, pipelines, and version-1
files written by the old code (tests/data) loading unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import make_graph
from pydantic import ValidationError

from planner.core.block_plan import BlockPlan
from planner.core.io import load_graph, load_plan, plan_from_dict
from planner.core.pipeline_actions import (
    Partition,
    PipelineAction,
    PipelineOp,
    PipelineStage,
    pipeline_action,
    rank_actions_from_csv,
    rank_actions_from_text,
    rank_actions_to_csv,
    rank_actions_to_text,
)
from planner.core.plan import (
    Action,
    ActionOp,
    Plan,
    PlanKind,
    PlanStatus,
    Predicted,
    actions_from_text,
    actions_to_text,
    compute,
    drop,
    free,
    offload,
    plan_nodes,
    prefetch,
)
from planner.core.resources import Link, Resources
from planner.sim.simulator import simulate

DATA = Path(__file__).resolve().parents[1] / "data"
GPIPE = "0F0 0F1 0B0 0B1\n1F0 1F1 1B0 1B1"


def plan(**fields: object) -> Plan:
    base: dict[str, object] = {"graph_hash": "sha256:x", "method": "hand", "status": "feasible"}
    return Plan.model_validate({**base, **fields})


def two_stages() -> Partition:
    return Partition(
        stages=[
            PipelineStage(stage_index=0, rank=0, modules=["s0"]),
            PipelineStage(stage_index=1, rank=1, modules=["s1"]),
        ]
    )


# -- actions ------------------------------------------------------------------------------------


def test_every_action_has_a_token_that_parses_back() -> None:
    actions = [compute(3), offload(3), free(3), prefetch(3), drop(3), compute(12)]
    text = actions_to_text(actions)
    assert text == "C3 O3 F3 P3 D3 C12"
    assert actions_from_text(text) == actions
    assert [a.op for a in actions] == [
        ActionOp.compute, ActionOp.offload, ActionOp.free, ActionOp.prefetch, ActionOp.drop,
        ActionOp.compute,
    ]


@pytest.mark.parametrize(("text", "index"), [("C3 X4", 1), ("C1 C2 O", 2), ("c1", 0), ("C-1", 0)])
def test_bad_tokens_name_their_index(text: str, index: int) -> None:
    with pytest.raises(ValueError, match=f"action {index}: cannot parse"):
        actions_from_text(text)


def test_actions_accept_tokens_in_json_and_keep_the_v1_json_form() -> None:
    p = plan(actions="C0 C1 F0")
    assert p.actions == [compute(0), compute(1), free(0)]
    assert plan(actions=["C0", {"op": "compute", "node": 1}, "F0"]).actions == p.actions
    dumped = json.loads(p.model_dump_json())
    assert dumped["actions"][0] == {"op": "compute", "node": 0}
    assert Action.model_validate("O7") == offload(7)
    assert plan_nodes(actions_from_text("C0 C1 F0 C0 O1")) == [0, 1]


# -- kinds --------------------------------------------------------------------------------------


def test_kind_is_derived_from_the_actions() -> None:
    assert plan(actions="C0 F0").kind is PlanKind.remat
    assert plan(actions="C0 O0 F0 P0 F0 D0").kind is PlanKind.offload
    assert plan(actions="C0 O0 F0 C0 F0 D0").kind is PlanKind.remat_offload
    assert plan(partition=two_stages(), rank_actions=rank_actions_from_text(GPIPE)).kind is (
        PlanKind.pipeline
    )
    # an offload plan may find nothing worth moving
    assert plan(kind="offload", actions="C0 F0").kind is PlanKind.offload


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "remat", "actions": "C0 O0 F0"}, "action 1 (O0) moves memory to the host"),
        ({"kind": "offload", "actions": "C0 F0 C0 F0"}, "use 'remat+offload'"),
        ({"kind": "pipeline", "actions": "C0"}, "needs both partition and rank_actions"),
        ({"kind": "remat", "partition": two_stages(), "rank_actions": [["0F0"], ["1F0"]]},
         "use 'pipeline'"),
        ({"schema_version": "1", "actions": "C0 O0"}, "schema_version '1'"),
        ({"partition": two_stages(), "rank_actions": [["0F0"], ["0B0"]]},
         "rank_actions[1][0] (0B0): stage 0 runs on rank 0"),
        ({"partition": two_stages(), "rank_actions": [["0F0"]]}, "1 action lists for 2 ranks"),
        ({"partition": two_stages(), "rank_actions": [["0RECV_F0"], []]}, "no previous stage"),
        ({"partition": two_stages(), "rank_actions": [["0F0"], ["1SEND_F0"]]}, "no next stage"),
    ],
)
def test_inconsistent_kinds_are_rejected(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        plan(**fields)


# -- version 1 files ----------------------------------------------------------------------------


def test_version_1_plan_file_loads_and_simulates_to_the_same_figures() -> None:
    graph = load_graph(DATA / "graph_v1_synthetic9.json")
    p = load_plan(DATA / "plan_v1_chen_sqrt.json")
    expected = json.loads((DATA / "plan_v1_chen_sqrt.expected.json").read_text())
    assert p.schema_version == "1" and p.kind is PlanKind.remat and p.resources is None
    assert p.graph_hash == graph.content_hash()
    sim = simulate(graph, p)  # the hash check passes: version-1 graphs keep their hash
    assert sim.peak_bytes == expected["peak_bytes"] == p.predicted.peak_bytes  # type: ignore[union-attr]
    assert sim.peak_action_index == expected["peak_action_index"]
    assert sim.compute_cost == expected["compute_cost"]
    assert sim.fixed_bytes == expected["fixed_bytes"]
    assert [[t.action_index, t.action, t.live_bytes] for t in sim.timeline] == expected["timeline"]
    assert sim.predicted() == p.predicted
    # details stay as written; the block plan is also read into the typed field
    assert p.details["block_plan"]["modes"] == "KCRCRR"
    assert p.block_plan == BlockPlan(modes="KCRCRR", forward_runs=[1, 2, 2, 2, 2, 2])
    assert p.summary() == (
        "chen-sqrt/none, feasible, peak 30532160, budget 30532170, overhead +26.772%, gap 21.118%"
    )


def test_version_1_plan_round_trips_through_json() -> None:
    p = load_plan(DATA / "plan_v1_chen_sqrt.json")
    again = plan_from_dict(json.loads(p.model_dump_json()))
    assert again == p and again.schema_version == "1"


def test_new_plans_are_version_2_and_round_trip_every_field() -> None:
    res = Resources(
        device_memory_bytes=10**9, host_memory_bytes=10**10,
        h2d=Link(bandwidth_bytes_per_s=1e9), d2h=Link(bandwidth_bytes_per_s=1e9),
    )
    p = plan(
        actions="C0 O0 F0 P0 C1 F0 F1 D0",
        resources=res.model_dump(),
        block_plan={"schema": "block-plan-1", "modes": "KCR", "forward_runs": [1, 2, 2]},
        predicted=Predicted(
            peak_bytes=10, compute_cost=2.0, overhead=0.0, host_peak_bytes=5, compute_ms=2.0,
            transfer_ms=1.0, exposed_transfer_ms=0.5, makespan_ms=2.5,
        ),
    )
    assert p.schema_version == "2" and p.kind is PlanKind.offload
    data = json.loads(p.model_dump_json())
    assert data["block_plan"] == {
        "schema": "block-plan-1", "modes": "KCR", "forward_runs": [1, 2, 2]
    }
    assert data["kind"] == "offload"
    assert Plan.model_validate(data) == p
    summary = p.summary()
    assert "offload" in summary and "host peak 5" in summary and "makespan 2.500 ms" in summary
    assert "exposed 0.500 ms" in summary
    ranks = p.model_copy(update={"predicted": p.predicted.model_copy(  # type: ignore[union-attr]
        update={"per_rank_host_peak_bytes": [3, 4]})})
    assert "host peak 5, per-rank host peaks 3/4" in ranks.summary()


def test_plan_json_schema_describes_v2() -> None:
    schema = Plan.model_json_schema()
    assert schema["properties"]["schema_version"]["enum"] == ["1", "2"]
    for key in ("kind", "resources", "block_plan", "partition", "rank_actions"):
        assert key in schema["properties"]


# -- block plans --------------------------------------------------------------------------------


def test_block_plan_reads_the_chain_solvers_json() -> None:
    chain = BlockPlan.from_json(
        {"schema": "block-plan-1", "modes": "KKCRRCR", "forward_runs": [1, 1, 2, 2, 2, 2, 2]}
    )
    typed = BlockPlan.model_validate(chain.to_json())
    assert typed.model_dump() == chain.to_json()
    assert typed.segments() == chain.segments() == [(2, 4), (5, 6)]
    assert str(typed) == "KKCRRCR"
    assert BlockPlan.model_validate("KC").forward_runs == [1, 1]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"modes": "KR"}, "block 1: 'R' must follow"),
        ({"modes": "KC", "forward_runs": [1]}, "1 entries for 2 blocks"),
        ({"modes": "KX"}, "pattern"),
        ({"schema": "block-plan-9", "modes": "K"}, "expected 'block-plan-1'"),
        ({"modes": "C", "forward_runs": [0]}, "block 0: forward_runs"),
    ],
)
def test_bad_block_plans_name_the_block(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BlockPlan.model_validate(data)


# -- pipelines ----------------------------------------------------------------------------------


def test_pipeline_actions_use_torchs_text_form() -> None:
    a = pipeline_action(2, "F", 0)
    assert str(a) == "2F0"
    assert str(PipelineAction.from_text("1SEND_F3")) == "1SEND_F3"
    assert PipelineAction.from_text("11RECV_B10") == PipelineAction(
        stage_index=11, op=PipelineOp.recv_b, microbatch_index=10
    )
    rows = rank_actions_from_text(GPIPE)
    assert rank_actions_to_text(rows) == GPIPE
    with pytest.raises(ValueError, match=re.escape("rank 1, action 2: cannot parse '1X0'")):
        rank_actions_from_text("0F0\n1F0 1B0 1X0")


def test_pipeline_plan_json_holds_action_strings() -> None:
    p = plan(partition=two_stages(), rank_actions=rank_actions_from_text(GPIPE))
    data = json.loads(p.model_dump_json())
    assert data["rank_actions"] == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
    assert Plan.model_validate(data) == p
    assert p.text == GPIPE


def test_csv_round_trip() -> None:
    rows = rank_actions_from_text("0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0")
    text = rank_actions_to_csv(rows)
    assert text == "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"
    assert rank_actions_from_csv(text) == rows
    assert rank_actions_to_csv(rows, compute_only=True) == "0F0,0B0\n1F0,1B0\n"
    assert rank_actions_from_csv("0F0,,0B0\n,1F0,1B0\n") == rank_actions_from_text(
        "0F0 0B0\n1F0 1B0"
    )


def test_csv_loads_in_torchs_own_loader(tmp_path: Path) -> None:
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    multi: Any = getattr(schedules, "PipelineScheduleMulti", None)
    validate: Any = getattr(schedules, "_validate_schedule", None)
    if not hasattr(multi, "_load_csv") or not hasattr(multi, "_dump_csv") or validate is None:
        pytest.skip("this torch has no pipeline CSV loader")
    loader, dumper = multi._load_csv, multi._dump_csv
    one_f_one_b = rank_actions_from_text(
        "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3\n1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"
    )
    path = tmp_path / "schedule.csv"
    path.write_text(rank_actions_to_csv(one_f_one_b))

    class Holder:  # the parts of a schedule object its CSV methods touch
        pipeline_order: dict[int, list[object]] = {}

        def _validate_and_set_stage_mapping(self, actions: dict[int, list[object]]) -> None:
            self.mapping = validate(actions, 2, 2, 4)

    holder = Holder()
    holder.pipeline_order = {}
    loader(holder, str(path))
    assert holder.mapping == {0: 0, 1: 1}
    assert [[str(a) for a in holder.pipeline_order[r]] for r in (0, 1)] == [
        [str(a) for a in row] for row in one_f_one_b
    ]
    back = tmp_path / "dumped.csv"
    dumper(holder, str(back))
    assert rank_actions_from_csv(back.read_text()) == one_f_one_b


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([(0, 0, ["a"]), (2, 1, ["b"])], "stage_index must be 0..1"),
        ([(0, 0, ["a"]), (1, 2, ["b"])], "rank 1 runs none"),
        ([(0, 0, [])], "names no nodes and no modules"),
    ],
)
def test_bad_partitions(stages: list[tuple[int, int, list[str]]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Partition(
            stages=[PipelineStage(stage_index=s, rank=r, modules=m) for s, r, m in stages]
        )


def test_pipeline_plan_simulates_through_simulate() -> None:
    g = make_graph({0: 10, 1: 20}, [(0, 1)], module_path={0: "s0", 1: "s1"})
    p = Plan(
        graph_hash=g.content_hash(), method="hand", status=PlanStatus.feasible,
        partition=two_stages(), rank_actions=rank_actions_from_text("0F0 0B0\n1F0 1B0"),
    )
    sim = simulate(g, p)
    predicted = sim.predicted()
    assert predicted.per_rank_peak_bytes is not None and len(predicted.per_rank_peak_bytes) == 2
    assert predicted.makespan_ms == 2.0 and predicted.throughput_per_s == 500.0
    assert predicted.bubble_fraction == 0.5
