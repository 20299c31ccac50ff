"""The pipeline simulator's per-rank memory against what torch.distributed.pipelining allocates
(issue 29, items 2 and 5): a receive buffer per micro-batch for each stage's input and output
gradient, the sent outputs and input gradients torch keeps to the step's end, and, on
module-level traces, the tensor a cut really carries (not the producing block's saved bytes).

The fast tests check the rules among themselves (list-order peaks equal the event simulation,
the partitioners' range costs equal the simulator's stage costs); the slow one runs GPipe, 1F1B
and 1F1B with recomputation on 2 gloo processes and compares each rank's measured peak
(planner.runtime.pipeline.RankMemory) with the prediction from op- and block-level traces."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from planner import zoo
from planner.core.graph import Graph
from planner.core.pipeline_actions import (
    Partition,
    PipelineAction,
    rank_actions_from_text,
)
from planner.core.pipeline_actions import PipelineStage as StageSpec
from planner.core.plan import Plan, PlanStatus
from planner.core.resources import Resources
from planner.runtime.pipeline_launch import run_local
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.stage_costs import one_stage_peak_bytes, rank_peak_bytes, stage_costs
from planner.solvers.pipeline.action_lists import with_communication
from planner.solvers.pipeline.schedules import make_schedule
from planner.solvers.pipeline.units import UnitChain
from planner.tracing.api import trace

BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 64, "dim": 64, "layers": 4, "vocab": 256, "dropout": 0.0}
SPLIT = [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]]
# the tensor crossing the cut: one micro-batch's activations, (2, 64, 64) fp32
BOUNDARY_BYTES = (BATCH // MICROBATCHES) * GPT["context"] * GPT["dim"] * 4
EVERY = [0, 1, 2, 3]
CASES: dict[str, dict[str, Any]] = {
    "gpipe": {"schedule": "gpipe"},
    "1f1b": {"schedule": "1f1b"},
    "1f1b-recompute": {"schedule": "1f1b", "recompute": {0: EVERY, 1: EVERY}},
}


def schedule_rows(kind: str, stages: int, m: int) -> list[list[PipelineAction]]:
    """GPipe or 1F1B lists, one stage a rank, with their SEND/RECV."""
    return with_communication(make_schedule(kind, stages, m).compute_lists(), stages)


def partition(recompute: dict[int, list[int]] | None = None) -> Partition:
    return Partition(stages=[StageSpec(stage_index=i, rank=i, modules=mods,
                                       recompute_microbatches=(recompute or {}).get(i, []))
                             for i, mods in enumerate(SPLIT)])


def make_plan(case: dict[str, Any]) -> Plan:
    return Plan(graph_hash="hand-made", method="hand", status=PlanStatus.feasible,
                partition=partition(case.get("recompute")),
                rank_actions=schedule_rows(case["schedule"], len(SPLIT), MICROBATCHES),
                resources=Resources(microbatches=MICROBATCHES))


@pytest.fixture(scope="module")
def graphs() -> dict[str, Graph]:
    """One micro-batch's step of the GPT, traced at op level and at block level."""
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    return {"op": trace(model, inputs).graph,
            "block": trace(model, inputs, level="module", block_pattern="h.*").graph}


def predicted(graph: Graph, case: dict[str, Any]) -> list[int]:
    plan = make_plan(case)
    assert plan.partition is not None and plan.rank_actions is not None
    return simulate_pipeline(graph, plan.partition, plan.rank_actions).per_rank_peak_bytes or []


# -- the rules among themselves ------------------------------------------------------------------
ZERO_BUBBLE = "0F0 0F1 0I0 0F2 0I1 0F3 0W0 0I2 0W1 0I3 0W2 0W3\n" \
              "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3"


@pytest.mark.parametrize("level", ["op", "block"])
@pytest.mark.parametrize("lists", ["gpipe", "1f1b", "zero-bubble"])
@pytest.mark.parametrize("recompute", [{}, {0: [1, 3], 1: EVERY}])
def test_list_order_peaks_equal_the_event_simulation(
    graphs: dict[str, Graph], level: str, lists: str, recompute: dict[int, list[int]]
) -> None:
    graph = graphs[level]
    part = partition(recompute)
    rows = rank_actions_from_text(ZERO_BUBBLE) if lists == "zero-bubble" \
        else schedule_rows(lists, 2, MICROBATCHES)
    sim = simulate_pipeline(graph, part, rows)
    costs = stage_costs(graph, part)
    again = [frozenset(s.recompute_microbatches) for s in part.stages]
    assert rank_peak_bytes(rows, [0, 1], costs, again) == sim.per_rank_peak_bytes
    assert rank_peak_bytes(rows, [0, 1], costs, again, MICROBATCHES) == sim.per_rank_peak_bytes


@pytest.mark.parametrize("level", ["op", "block"])
def test_range_costs_equal_the_stage_costs_with_buffers_and_held_bytes(
    graphs: dict[str, Graph], level: str
) -> None:
    graph = graphs[level]
    chain = UnitChain(graph)
    for cut in (2, 5, chain.length - 3):
        bounds = [(0, cut), (cut, chain.length)]
        part = Partition(stages=[StageSpec(stage_index=s, rank=s, modules=chain.modules(i, j))
                                 for s, (i, j) in enumerate(bounds)])
        for s, (t, (i, j)) in enumerate(zip(stage_costs(graph, part), bounds, strict=True)):
            c = chain.range_costs(i, j, s, 2)
            assert (c.saved_bytes, c.held_bytes, c.input_bytes, c.buffer_bytes,
                    c.transient_bytes, c.send_forward_bytes, c.send_backward_bytes) == (
                t.saved_bytes, t.held_bytes, t.input_bytes, t.buffer_bytes,
                t.transient_bytes, t.send_forward_bytes, t.send_backward_bytes), (level, cut, s)
            assert (c.weight_pending_bytes, c.weight_transient_bytes, c.weight_rerun_bytes,
                    c.first_stage) == (t.weight_pending_bytes, t.weight_transient_bytes,
                                       t.weight_rerun_bytes, t.first_stage), (level, cut, s)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_one_stage_peak_is_the_rank_peak_with_one_stage_a_rank(
    graphs: dict[str, Graph], kind: str
) -> None:
    graph = graphs["op"]
    costs = stage_costs(graph, partition())
    rows = schedule_rows(kind, 2, MICROBATCHES)
    peaks = rank_peak_bytes(rows, [0, 1], costs, [frozenset(), frozenset()])
    inflight = [MICROBATCHES] * 2 if kind == "gpipe" else [2, 1]
    assert [one_stage_peak_bytes(c, k, None, MICROBATCHES)
            for c, k in zip(costs, inflight, strict=True)] == peaks


def test_zero_bubble_one_stage_peak_is_the_rank_peak_with_what_i_keeps_for_w(
    graphs: dict[str, Graph],
) -> None:
    """ZB-H1's lists (each W right after its I): one stage a rank, the peak is an I or W
    after the k-th F, one I's gradients kept for its W; without them it falls short. The first
    stage's I does nothing in torch: it keeps none."""
    costs = stage_costs(graphs["op"], partition())
    rows = make_schedule("zb-h1", 2, MICROBATCHES).compute_lists()
    peaks = rank_peak_bytes(rows, [0, 1], costs, [frozenset(), frozenset()])
    assert [one_stage_peak_bytes(c, k, None, MICROBATCHES, split_backward=True)
            for c, k in zip(costs, [2, 1], strict=True)] == peaks
    assert costs[0].weight_pending_bytes == 0 < costs[1].weight_pending_bytes
    assert costs[0].first_stage and not costs[1].first_stage
    assert one_stage_peak_bytes(costs[1], 1, None, MICROBATCHES) < peaks[1]
    # a whole stage recomputed: its split W reruns the stage once (one autograd call), and
    # what that rerun leaves is counted on top of the W's own transient
    c = costs[1]
    assert c.weight_transient_bytes < c.weight_rerun_bytes < c.weight_transient_bytes + 2 * (
        c.saved_bytes)
    # the first stage's W is its whole backward: a recomputed one reruns it and holds its
    # saved bytes again to the end (no credit for what the backward frees as it runs)
    assert costs[0].weight_rerun_bytes == costs[0].recompute_transient_bytes
    assert costs[0].transient_bytes <= costs[0].recompute_transient_bytes


@pytest.mark.parametrize("level", ["op", "block"])
def test_a_cut_carries_the_tensor_torch_receives(graphs: dict[str, Graph], level: str) -> None:
    first, second = stage_costs(graphs[level], partition())
    assert first.send_forward_bytes == second.input_bytes == BOUNDARY_BYTES
    assert second.send_backward_bytes == BOUNDARY_BYTES
    # torch's receive buffers: stage 1's input, stage 0's output gradient
    assert first.buffer_bytes == second.buffer_bytes == BOUNDARY_BYTES
    assert first.held_bytes >= BOUNDARY_BYTES  # the sent output, kept to the step's end
    if level == "block":  # the block's node stands for its saved activations, far more
        h1 = next(n for n in graphs[level].nodes if n.name == "F:h.1")
        assert h1.output_bytes > 10 * BOUNDARY_BYTES


# -- against torch -------------------------------------------------------------------------------
def _worker(rank: int, world: int) -> list[Any]:
    from planner.runtime.pipeline import build_pipeline, gather_memory

    out = []
    for case in CASES.values():
        model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
        run = build_pipeline(model, make_plan(case), inputs)
        out.append(gather_memory(run, run.measure_step(*inputs)))
    return out


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return dict(zip(CASES, run_local(_worker, 2)[0], strict=True))


@pytest.mark.slow  # 2 gloo processes, 3 pipelines
@pytest.mark.parametrize("name", list(CASES))
def test_measured_per_rank_peak_is_at_most_the_predicted_and_close(
    measured: dict[str, Any], graphs: dict[str, Graph], name: str
) -> None:
    memory = measured[name]
    costs = stage_costs(graphs["op"], partition())
    for m, c in zip(memory, costs, strict=True):  # the receive buffers, to the byte
        assert m.pipeline_buffers_bytes == MICROBATCHES * c.buffer_bytes
    # op level: at most 3 % above the measured peak. Block level: at most 10 % (the module
    # tracer's saved bytes of the last block, 'head', keep its logits, which torch frees;
    # the old rules, charging a stage's input as the previous block's saved bytes: 1.33-1.47)
    for level, slack in (("op", 1.03), ("block", 1.10)):
        for m, p in zip(memory, predicted(graphs[level], CASES[name]), strict=True):
            assert m.peak_bytes <= p <= slack * m.peak_bytes, (level, m, p)


@pytest.mark.slow  # shares the 2-process fixture
def test_the_rules_without_torchs_buffers_and_held_bytes_fall_short(
    measured: dict[str, Any], graphs: dict[str, Graph]
) -> None:
    """The old rules (no receive buffers, nothing kept to the step's end) predict below what
    torch allocates: the measurement above catches them."""
    graph = graphs["op"]
    part = partition()
    costs = [replace(c, buffer_bytes=0, held_bytes=0, send_backward_bytes=0)
             for c in stage_costs(graph, part)]
    for name in ("gpipe", "1f1b"):
        rows = schedule_rows(CASES[name]["schedule"], 2, MICROBATCHES)
        old = rank_peak_bytes(rows, [0, 1], costs, [frozenset(), frozenset()])
        assert all(m.peak_bytes > p for m, p in zip(measured[name], old, strict=True)), name
