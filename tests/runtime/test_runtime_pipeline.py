"""planner.runtime.pipeline on CPU with gloo in 2 and 4 processes: parity with the single-process
step
(loss and every parameter's gradient, gathered), measured per-rank peak against the
simulator's, recomputation, torch's built-in schedules, and the split's clear errors.

Plans are built by hand here (GPipe and 1F1B action lists, with and without SEND/RECV)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from planner import zoo
from planner.core.errors import InputError
from planner.core.pipeline_actions import (
    Partition,
    PipelineAction,
    pipeline_action,
    rank_actions_from_text,
)
from planner.core.pipeline_actions import PipelineStage as StageSpec
from planner.core.plan import Plan, PlanStatus
from planner.core.resources import Resources
from planner.runtime.pipeline_launch import run_local
from planner.runtime.pipeline_split import split_model
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.tracing.api import trace

BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 32, "dim": 32, "layers": 8, "vocab": 64, "dropout": 0.0}
SPLITS = {
    2: [["tok", "pos", "h.0", "h.1", "h.2", "h.3"], ["h.4", "h.5", "h.6", "h.7", "ln_f", "head"]],
    4: [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3"], ["h.4", "h.5"],
        ["h.6", "h.7", "ln_f", "head"]],
}


def gpipe(stages: int, m: int, comms: bool) -> list[list[PipelineAction]]:
    rows = []
    for s in range(stages):
        forward = [mb for mb in range(m)]
        rows.append(_with_comms(s, stages, [("F", mb) for mb in forward]
                                + [("B", mb) for mb in range(m)], comms))
    return rows


def one_f_one_b(stages: int, m: int, comms: bool) -> list[list[PipelineAction]]:
    rows = []
    for s in range(stages):
        warmup = min(stages - 1 - s, m)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(m - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", mb) for mb in range(m - warmup, m)]
        rows.append(_with_comms(s, stages, order, comms))
    return rows


def _with_comms(s: int, stages: int, order: list[tuple[str, int]], comms: bool) -> list[Any]:
    row = []
    for op, mb in order:
        if comms and op == "F" and s > 0:
            row.append(pipeline_action(s, "RECV_F", mb))
        if comms and op == "B" and s < stages - 1:
            row.append(pipeline_action(s, "RECV_B", mb))
        row.append(pipeline_action(s, op, mb))
        if comms and op == "F" and s < stages - 1:
            row.append(pipeline_action(s, "SEND_F", mb))
        if comms and op == "B" and s > 0:
            row.append(pipeline_action(s, "SEND_B", mb))
    return row


def make_plan(cfg: dict[str, Any], *, with_overrides: bool = False) -> Plan:
    """The plan of a test case; `with_overrides` writes the runtime's `recompute_stages`
    override into the partition (what the simulator must see)."""
    ranks = cfg["ranks"]
    split = cfg.get("split", SPLITS[ranks])
    recompute = dict(cfg.get("recompute", {}))
    if with_overrides:
        recompute.update({s: list(range(MICROBATCHES)) for s in cfg.get("recompute_stages", [])})
    part = Partition(stages=[StageSpec(stage_index=i, rank=i % ranks, modules=mods,
                                       recompute_microbatches=recompute.get(i, []))
                             for i, mods in enumerate(split)])
    rows = cfg.get("rows") or {"gpipe": gpipe, "1f1b": one_f_one_b}[cfg["schedule"]](
        len(split), MICROBATCHES, cfg.get("comms", False))
    resources = Resources(microbatches=MICROBATCHES, pipeline_schedule=cfg.get("named"))
    return Plan(graph_hash="hand-made", method="hand", status=PlanStatus.feasible, partition=part,
                rank_actions=rows, resources=resources)


def _worker(rank: int, world: int, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from planner.runtime.pipeline import build_pipeline, gather_gradients, gather_memory

    out = []
    reference, inputs = zoo.gpt(batch_size=BATCH, **GPT)
    reference_loss = reference(*inputs)
    reference_loss.backward()
    for cfg in configs:
        model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
        run = build_pipeline(model, make_plan(cfg), inputs,
                             recompute_stages=cfg.get("recompute_stages"),
                             schedule="builtin" if cfg.get("builtin") else "plan")
        loss = run.step(*inputs)
        grads = gather_gradients(run)
        expected = dict(reference.named_parameters())
        errors = {k: float((grads[k] - p.grad).abs().max()) for k, p in expected.items()
                  if k in grads and p.grad is not None}
        scale = max(float(p.grad.abs().max()) for p in expected.values() if p.grad is not None)
        memory = gather_memory(run, run.measure_step(*inputs))
        try:  # every rank refuses before any communication
            run.step(*(x[:6] for x in inputs))
            refused = ""
        except InputError as e:
            refused = str(e)
        out.append({
            "loss": loss, "reference_loss": float(reference_loss.detach()),
            "missing": sorted(set(expected) - set(grads)),
            "extra": sorted(set(grads) - set(expected)),
            "max_grad_error": max(errors.values()), "grad_scale": scale,
            "memory": memory, "refused": refused,
        })
    return out


def predicted_peaks(cfg: dict[str, Any], graph: Any) -> list[int]:
    plan = make_plan(cfg, with_overrides=True)
    assert plan.partition is not None and plan.rank_actions is not None
    result = simulate_pipeline(graph, plan.partition, plan.rank_actions)
    return [r.peak_bytes for r in result.ranks]


@pytest.fixture(scope="module")
def microbatch_graph() -> Any:
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    return trace(model, inputs).graph


ZERO_BUBBLE = rank_actions_from_text("0F0 0F1 0I0 0F2 0I1 0F3 0W0 0I2 0W1 0I3 0W2 0W3\n"
                                     "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3")
LOOPED = [[pipeline_action(s, "F", mb) for s in (r, r + 2) for mb in range(MICROBATCHES)]
          + [pipeline_action(s, "B", mb) for s in (r + 2, r) for mb in range(MICROBATCHES)]
          for r in range(2)]
CONFIGS = {
    2: [
        {"ranks": 2, "schedule": "gpipe"},  # compute_only CSV: torch adds send/recv
        {"ranks": 2, "schedule": "1f1b", "comms": True},  # compute_comms CSV, run as planned
        # recomputation: the plan's recompute_microbatches (every micro-batch of both stages),
        # then the runtime's override (stage 0) with a plan recomputing stage 1's micro-batch 1
        {"ranks": 2, "schedule": "1f1b", "comms": True, "recompute": {0: [0, 1, 2, 3],
                                                                      1: [0, 1, 2, 3]}},
        {"ranks": 2, "rows": ZERO_BUBBLE},  # backward split into I and W (ZB-H1 order)
        # 4 stages on 2 ranks (stage s on rank s mod 2): the plan's looped lists through the
        # CSV, and torch's ScheduleInterleaved1F1B for a plan that names interleaved-1f1b.
        {"ranks": 2, "split": SPLITS[4], "rows": LOOPED},
        {"ranks": 2, "split": SPLITS[4], "rows": LOOPED, "named": "interleaved-1f1b",
         "builtin": True},
        {"ranks": 2, "schedule": "gpipe", "recompute_stages": [0], "recompute": {1: [1]}},
    ],
    4: [
        {"ranks": 4, "schedule": "1f1b", "comms": True},
        {"ranks": 4, "schedule": "gpipe"},
    ],
}


@pytest.fixture(scope="module")
def results(microbatch_graph: Any) -> dict[int, list[dict[str, Any]]]:
    return {world: run_local(_worker, world, CONFIGS[world])[0] for world in (2, 4)}


def _cases() -> list[tuple[int, int]]:
    return [(w, i) for w in (2, 4) for i in range(len(CONFIGS[w]))]


@pytest.mark.parametrize(("world", "index"), _cases())
@pytest.mark.slow
def test_loss_and_every_gradient_match_the_single_process_step(
    results: dict[int, list[dict[str, Any]]], world: int, index: int
) -> None:
    r = results[world][index]
    assert r["missing"] == [] and r["extra"] == []
    assert r["loss"] == pytest.approx(r["reference_loss"], rel=1e-6)
    assert r["max_grad_error"] <= 1e-5 * max(1.0, r["grad_scale"])


@pytest.mark.parametrize(
    ("world", "index"), [(2, 0), (2, 1), (2, 2), (2, 4), (2, 6), (4, 0), (4, 1)]
)
@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_measured_per_rank_peak_is_near_the_predicted(
    results: dict[int, list[dict[str, Any]]], microbatch_graph: Any, world: int, index: int
) -> None:
    memory = results[world][index]["memory"]
    cfg = CONFIGS[world][index]
    predicted = predicted_peaks(cfg, microbatch_graph)
    for m, p in zip(memory, predicted, strict=True):
        # receive buffers, sent tensors and losses are predicted as torch holds them: never
        # above the prediction, within 10 % of it (0.942-0.995 on this GPT). Measured: the
        # allocator's count where it is the larger (issue 47), checkpoint's RNG states
        # included (the simulator counts them on a CPU run: GPipe, stage 0 recomputed, 4 x
        # 5,056 B; the allocator was 3,450 B over the prediction, the tracker 16,902 B under)
        assert m.peak_bytes >= m.tracker_peak_bytes
        assert 0.90 <= m.peak_bytes / p <= 1.0, (m, p)



@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_1f1b_saves_what_the_simulator_says_over_gpipe(
    results: dict[int, list[dict[str, Any]]], microbatch_graph: Any
) -> None:
    one, gp = results[4][0]["memory"], results[4][1]["memory"]
    predicted_1f1b = predicted_peaks(CONFIGS[4][0], microbatch_graph)
    predicted_gpipe = predicted_peaks(CONFIGS[4][1], microbatch_graph)
    for rank in (1, 2):  # in flight: GPipe 4 and 4; 1F1B 3 and 2
        saved = gp[rank].peak_bytes - one[rank].peak_bytes
        expected = predicted_gpipe[rank] - predicted_1f1b[rank]
        assert expected > 0 and abs(saved - expected) <= 0.10 * expected, (rank, saved, expected)


@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_bad_batch_and_failing_ranks_give_one_clear_error(
    results: dict[int, list[dict[str, Any]]],
) -> None:
    assert results[2][0]["refused"] == "step: batch of 6 does not split into 4 micro-batches"
    with pytest.raises(RuntimeError, match="rank 1: ValueError: no data on rank 1"):
        run_local(_fail_on_rank_one, 2)


def _fail_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("no data on rank 1")
    return rank


@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_recomputed_stages_keep_less(results: dict[int, list[dict[str, Any]]]) -> None:
    plain, recomputed = results[2][1]["memory"], results[2][2]["memory"]
    # rank 0 holds two micro-batches under 1F1B: checkpointing keeps only the stage input;
    # the last stage (one in flight) peaks in its backward either way.
    assert recomputed[0].step_peak_bytes < 0.7 * plain[0].step_peak_bytes
    assert recomputed[1].step_peak_bytes <= 1.02 * plain[1].step_peak_bytes


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.unused = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self.mid(self.emb(x)), self.emb.weight).sum()


def test_tied_weights_and_uncalled_modules_are_refused() -> None:
    x = torch.randint(0, 16, (2, 3))
    for split, message in (([["emb"], ["mid"]], "tied weights"),
                           ([["emb", "mid"], ["unused"]], "never calls")):
        part = Partition(stages=[StageSpec(stage_index=i, rank=i, modules=mods)
                                 for i, mods in enumerate(split)])
        with pytest.raises(InputError, match=message):
            split_model(_Tied(), part, (x,))


def test_split_shares_the_model_parameters_and_places_glue_by_data_flow() -> None:
    model, inputs = zoo.gpt(batch_size=2, **GPT)
    part = Partition(stages=[StageSpec(stage_index=i, rank=i, modules=mods)
                             for i, mods in enumerate(SPLITS[2])])
    split = split_model(model, part, inputs)
    assert split.positional_inputs == ["idx"] and split.keyword_inputs == ["targets"]
    assert split.returns_loss
    params = dict(model.named_parameters())
    for stage in split.stages:
        for name, p in stage.module.named_parameters():
            assert p is params[name]
    x = inputs[0]
    with torch.no_grad():
        (hidden,) = split.stages[0].module(x)
        loss = split.stages[1].module(hidden, targets=inputs[1])
        assert torch.allclose(loss, model(*inputs))
