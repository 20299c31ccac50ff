"""Per-stage plans in the pipeline runtime (`PipelineStage.unit_policies`): units recomputed or
offloaded inside their stage, with loss and gradients equal to one process (gloo, 2 and 4
processes, 1F1B, GPipe and ZB-H1), less measured device memory, offloaded bytes counted as host
memory, and unknown units refused in one line."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from planner import zoo
from planner.core.errors import InputError
from planner.core.pipeline_actions import Partition
from planner.core.pipeline_actions import PipelineStage as StageSpec
from planner.core.plan import Plan, PlanStatus
from planner.core.resources import Resources, resources_preset
from planner.runtime.pipeline_launch import run_local
from planner.runtime.pipeline_split import split_model
from planner.runtime.pipeline_stage import StageModule
from planner.runtime.pipeline_units import (
    HostMemory,
    UnitSwitch,
    apply_unit_policies,
    check_unit_policies,
)
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.sim.stage_costs import rank_peak_bytes, stage_costs
from planner.sim.stage_policies import apply_unit_policies as apply_policy_costs
from planner.solvers.pipeline.schedules import make_schedule
from planner.tracing.api import trace
from planner.tracing.memory import StorageTracker

BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 32, "dim": 32, "layers": 8, "vocab": 64, "dropout": 0.0}
BLOCKS = [f"h.{i}" for i in range(8)]
SPLITS = {
    2: [["tok", "pos", *BLOCKS[:4]], [*BLOCKS[4:], "ln_f", "head"]],
    4: [["tok", "pos", *BLOCKS[:2]], BLOCKS[2:4], BLOCKS[4:6], [*BLOCKS[6:], "ln_f", "head"]],
}
# keep / recompute / offload mixed on every stage (a block of each where the stage has three)
MIXED = {"h.0": "recompute", "h.1": "offload", "h.3": "recompute", "h.4": "offload",
         "h.5": "recompute", "h.7": "offload", "h.2": "offload", "h.6": "recompute"}
ALL_RECOMPUTE = dict.fromkeys(BLOCKS, "recompute")
ALL_OFFLOAD = dict.fromkeys(BLOCKS, "offload")
HOST_TIER = resources_preset("h100-pcie-gen5")  # offload needs host links in the simulator


def make_plan(ranks: int, schedule: str, policies: dict[str, str],
              recompute: dict[int, list[int]] | None = None) -> Plan:
    split = SPLITS[ranks]
    part = Partition(stages=[
        StageSpec(stage_index=i, rank=i, modules=mods,
                  unit_policies={m: p for m, p in policies.items() if m in mods},
                  recompute_microbatches=(recompute or {}).get(i, []))
        for i, mods in enumerate(split)])
    made = make_schedule(schedule, ranks, MICROBATCHES)
    rows = made.compute_lists() if schedule == "gpipe" else made.rank_actions()
    return Plan(graph_hash="hand-made", method="hand", status=PlanStatus.feasible,
                partition=part, rank_actions=rows, resources=Resources(microbatches=MICROBATCHES))


# -- one process: a single stage ------------------------------------------------------------
def _one_stage(policies: dict[str, str], recompute_microbatch: bool = False) -> dict[str, Any]:
    """Forward + backward of the whole GPT as one stage under `policies`, measured."""
    model, inputs = zoo.gpt(batch_size=2, **GPT)
    mods = SPLITS[2][0] + SPLITS[2][1]
    spec = StageSpec(stage_index=0, rank=0, modules=mods, unit_policies=policies)
    split = split_model(model, Partition(stages=[spec]), inputs)
    host, switch = HostMemory(), UnitSwitch()
    calls = apply_unit_policies(split.stages[0].module, check_unit_policies(spec), switch, host)
    stage = StageModule(split.stages[0], frozenset({0}), switch)
    stage.microbatch = 0 if recompute_microbatch else None
    tracker = StorageTracker(keep_timeline=False)
    with tracker:
        loss = stage(*inputs)  # one stage: every model input is positional
        loss.backward()
    return {"loss": float(loss.detach()), "calls": len(calls), "peak": tracker.peak_bytes,
            "host_peak": host.peak_bytes, "host_left": host.in_use_bytes,
            "grads": {k: p.grad for k, p in model.named_parameters()},
            "names": [k for k, _ in split.stages[0].module.named_parameters()]}


@pytest.fixture(scope="module")
def one_stage() -> dict[str, dict[str, Any]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only contend on a busy machine
    try:
        return {"plain": _one_stage({}), "recompute": _one_stage(ALL_RECOMPUTE),
                "offload": _one_stage(ALL_OFFLOAD), "mixed": _one_stage(MIXED),
                "plain, stage checkpointed": _one_stage({}, recompute_microbatch=True),
                "mixed, stage checkpointed": _one_stage(MIXED, recompute_microbatch=True)}
    finally:
        torch.set_num_threads(threads)


def test_unit_policies_keep_the_step_and_move_saved_bytes_to_host(
    one_stage: dict[str, dict[str, Any]],
) -> None:
    plain = one_stage["plain"]
    for name, policies, host in (("recompute", ALL_RECOMPUTE, False),
                                 ("offload", ALL_OFFLOAD, True), ("mixed", MIXED, True)):
        r = one_stage[name]
        assert r["calls"] == len(policies)  # one call per block, each under its policy
        assert r["names"] == plain["names"]  # the model's parameter names, unchanged
        assert r["loss"] == pytest.approx(plain["loss"], rel=1e-6)
        for k, g in plain["grads"].items():
            assert torch.allclose(r["grads"][k], g, rtol=1e-5, atol=1e-6), k
        assert r["peak"] < 0.7 * plain["peak"], (name, r["peak"], plain["peak"])
        assert (r["host_peak"] > 0) == host and r["host_left"] == 0
    # offloaded bytes are host memory: the tracker does not count them as device bytes
    offload = one_stage["offload"]
    assert offload["peak"] + offload["host_peak"] > plain["peak"]


def test_a_recomputed_micro_batch_reruns_its_stage_under_the_policies(
    one_stage: dict[str, dict[str, Any]],
) -> None:
    """The whole stage checkpointed (recompute_microbatches) with its units' policies inside:
    the backward's rerun holds what the stage's plan holds, and offloads nothing twice."""
    plain, r = one_stage["plain, stage checkpointed"], one_stage["mixed, stage checkpointed"]
    assert r["peak"] < 0.7 * plain["peak"], (r["peak"], plain["peak"])
    assert r["host_peak"] == one_stage["mixed"]["host_peak"] > 0 and r["host_left"] == 0
    assert r["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    for k, g in plain["grads"].items():
        assert torch.allclose(r["grads"][k], g, rtol=1e-5, atol=1e-6), k


def test_unknown_units_and_policies_are_refused_in_one_line() -> None:
    stray = StageSpec.model_construct(stage_index=1, rank=1, modules=["h.4"], nodes=[],
                                      recompute_microbatches=[],
                                      unit_policies={"h.9": "recompute"})
    with pytest.raises(InputError, match=r"^partition: stage 1's unit_policies name 'h.9', "
                                         r"which is not one of its modules \(h.4\)"):
        check_unit_policies(stray)
    odd = StageSpec.model_construct(stage_index=0, rank=0, modules=["h.4"], nodes=[],
                                    recompute_microbatches=[], unit_policies={"h.4": "swap"})
    with pytest.raises(InputError, match="policy 'swap'; use one of keep, recompute, offload"):
        check_unit_policies(odd)
    with pytest.raises(ValueError, match="'h.9' is not one of the stage's modules"):
        Partition(stages=[StageSpec(stage_index=0, rank=0, modules=["h.4"],
                                    unit_policies={"h.9": "offload"})])


# -- several processes (gloo) ---------------------------------------------------------------
def _worker(rank: int, world: int, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from planner.runtime.pipeline import build_pipeline, gather_gradients, gather_memory

    reference, inputs = zoo.gpt(batch_size=BATCH, **GPT)
    loss = reference(*inputs)
    loss.backward()
    reference_loss = float(loss.detach())
    expected = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    scale = max(float(g.abs().max()) for g in expected.values())
    out = []
    for cfg in configs:
        model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
        plan = make_plan(world, cfg["schedule"], cfg["policies"], cfg.get("recompute"))
        run = build_pipeline(model, plan, inputs)
        loss = run.step(*inputs)
        grads = gather_gradients(run)
        errors = [float((grads[k] - g).abs().max()) for k, g in expected.items() if k in grads]
        out.append({"loss": loss, "reference_loss": reference_loss,
                    "same_parameters": sorted(grads) == sorted(expected),
                    "max_grad_error": max(errors), "grad_scale": scale,
                    "memory": gather_memory(run, run.measure_step(*inputs))})
    return out


CONFIGS: dict[int, list[dict[str, Any]]] = {
    2: [
        {"schedule": "1f1b", "policies": {}},
        {"schedule": "1f1b", "policies": MIXED, "recompute": {0: [1]}},
        {"schedule": "gpipe", "policies": MIXED},
        {"schedule": "zb-h1", "policies": MIXED},
        {"schedule": "1f1b", "policies": ALL_RECOMPUTE},
        {"schedule": "1f1b", "policies": ALL_OFFLOAD},
        {"schedule": "zb-h1", "policies": {}},
        {"schedule": "zb-h1", "policies": ALL_RECOMPUTE},
        {"schedule": "zb-h1", "policies": {}, "recompute": {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}},
    ],
    4: [
        {"schedule": "1f1b", "policies": MIXED},
        {"schedule": "gpipe", "policies": MIXED},
        {"schedule": "1f1b", "policies": ALL_RECOMPUTE},
        {"schedule": "1f1b", "policies": ALL_OFFLOAD},
    ],
}


@pytest.fixture(scope="module")
def results() -> dict[int, list[dict[str, Any]]]:
    return {world: run_local(_worker, world, CONFIGS[world])[0] for world in (2, 4)}


@pytest.mark.parametrize(("world", "index"),
                         [(w, i) for w in (2, 4) for i in range(len(CONFIGS[w]))])
@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_mixed_policies_match_the_single_process_step(
    results: dict[int, list[dict[str, Any]]], world: int, index: int
) -> None:
    r = results[world][index]
    assert r["same_parameters"]
    assert r["loss"] == pytest.approx(r["reference_loss"], rel=1e-6)
    assert r["max_grad_error"] <= 1e-5 * max(1.0, r["grad_scale"])


@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
def test_recompute_and_offload_lower_the_measured_device_peak(
    results: dict[int, list[dict[str, Any]]],
) -> None:
    plain, recompute, offload = (results[2][i]["memory"] for i in (0, 4, 5))
    for rank in (0, 1):
        print(f"rank {rank}: device peak {plain[rank].peak_bytes:,} B plain, "
              f"{recompute[rank].peak_bytes:,} B recompute, {offload[rank].peak_bytes:,} B "
              f"offload (host peak {offload[rank].host_peak_bytes:,} B)")
        assert recompute[rank].step_peak_bytes < 0.8 * plain[rank].step_peak_bytes
        assert offload[rank].step_peak_bytes < 0.8 * plain[rank].step_peak_bytes
        assert plain[rank].host_peak_bytes == recompute[rank].host_peak_bytes == 0
        assert offload[rank].host_peak_bytes > 0


@pytest.fixture(scope="module")
def policy_graph() -> Any:
    """One micro-batch's step of the GPT at op level (the plans' graph)."""
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    return trace(model, inputs).graph


# measured <= predicted <= DEVICE_SLACK x measured on every rank. Measured (CPU, 2026-11-26):
# 1.009-1.046 but for 4-rank offload (1.041-1.096: offloaded units' reloads, counted per
# backward node). The input gradient a B sends is charged from that B (1.061 -> 1.031 on the
# middle ranks of 4-rank 1F1B mixed, when it was charged from F)
DEVICE_SLACK = 1.10
MEASURED = [(w, i) for w in (2, 4) for i in range(len(CONFIGS[w]))
            if CONFIGS[w][i]["schedule"] != "zb-h1"]


@pytest.mark.slow  # the shared fixture runs 2- and 4-process pipelines
@pytest.mark.parametrize(("world", "index"), MEASURED)
def test_measured_per_rank_peak_is_at_most_the_simulated_and_close(
    results: dict[int, list[dict[str, Any]]], policy_graph: Any, world: int, index: int
) -> None:
    """Device peaks within DEVICE_SLACK above the measured, host peaks (the offloaded copies,
    kept apart) at least the measured, per rank."""
    cfg = CONFIGS[world][index]
    plan = make_plan(world, cfg["schedule"], cfg["policies"], cfg.get("recompute"))
    assert plan.partition is not None and plan.rank_actions is not None
    predicted = simulate_pipeline(policy_graph, plan.partition, plan.rank_actions, HOST_TIER)
    memory = results[world][index]["memory"]
    device = [m.peak_bytes for m in memory]
    print(f"{world} ranks, {cfg['schedule']}: measured {device}, predicted "
          f"{predicted.per_rank_peak_bytes}; host measured {[m.host_peak_bytes for m in memory]}"
          f", predicted {[r.host_peak_bytes for r in predicted.ranks]}")
    for m, p, r in zip(memory, predicted.per_rank_peak_bytes, predicted.ranks, strict=True):
        assert m.peak_bytes <= p <= DEVICE_SLACK * m.peak_bytes, (world, cfg, device, p)
        assert m.host_peak_bytes <= r.host_peak_bytes, (world, cfg, m, r)
    host = [r.host_peak_bytes for r in predicted.ranks]
    if any(host):  # the plan states each rank's host peak beside the one host's
        figures = predicted.predicted()
        assert figures.per_rank_host_peak_bytes == host
        assert figures.host_peak_bytes is not None
        assert max(host) <= figures.host_peak_bytes <= sum(host)


# zero-bubble I/W (ZB-H1): what torch keeps from I to W and the checkpoint reruns of a split W
# (one autograd call for all weight groups: planner.runtime.pipeline) are counted as upper
# bounds. measured <= predicted <= ZB_SLACK x measured per rank. Measured (CPU, 2026-11-26),
# rank 1: keep 1.016, mixed 1.074, all recompute 1.159, whole stage recomputed 1.447 (1,595,312
# B; with torch's one call per weight group its W reran the stage 26 times: 10.8 MB)
ZB_SLACK = 1.45
ZERO_BUBBLE = [i for i, c in enumerate(CONFIGS[2]) if c["schedule"] == "zb-h1"]


def _zero_bubble_prediction(index: int, policy_graph: Any) -> Any:
    cfg = CONFIGS[2][index]
    plan = make_plan(2, "zb-h1", cfg["policies"], cfg.get("recompute"))
    assert plan.partition is not None and plan.rank_actions is not None
    return plan, simulate_pipeline(policy_graph, plan.partition, plan.rank_actions, HOST_TIER)


@pytest.mark.slow  # shares the 2-process fixture
@pytest.mark.parametrize("index", ZERO_BUBBLE)
def test_zero_bubble_measured_peak_is_at_most_the_simulated_and_close(
    results: dict[int, list[dict[str, Any]]], policy_graph: Any, index: int
) -> None:
    _, predicted = _zero_bubble_prediction(index, policy_graph)
    memory = results[2][index]["memory"]
    device = [m.peak_bytes for m in memory]
    print(f"zb-h1 {CONFIGS[2][index]}: measured {device}, predicted "
          f"{predicted.per_rank_peak_bytes}")
    for m, p, r in zip(memory, predicted.per_rank_peak_bytes, predicted.ranks, strict=True):
        assert m.peak_bytes <= p <= ZB_SLACK * m.peak_bytes, (index, device, p)
        assert m.host_peak_bytes <= r.host_peak_bytes


@pytest.mark.slow  # shares the 2-process fixture
@pytest.mark.parametrize("index", ZERO_BUBBLE)
def test_zero_bubble_rules_without_what_i_keeps_for_w_fall_short(
    results: dict[int, list[dict[str, Any]]], policy_graph: Any, index: int
) -> None:
    """The rules before they counted I -> W (nothing kept from I, W's transient the stage's):
    rank 1 (the last stage, whose I splits the backward) is predicted below torch."""
    plan, _ = _zero_bubble_prediction(index, policy_graph)
    assert plan.partition is not None and plan.rank_actions is not None
    policy = apply_policy_costs(policy_graph, plan.partition,
                                stage_costs(policy_graph, plan.partition), HOST_TIER)
    old = [replace(p.costs, weight_pending_bytes=0, weight_transient_bytes=p.costs.transient_bytes,
                   weight_rerun_bytes=p.costs.transient_bytes) for p in policy]
    again = [frozenset(st.recompute_microbatches) for st in plan.partition.stages]
    peaks = rank_peak_bytes(plan.rank_actions, [0, 1], old, again)
    assert results[2][index]["memory"][1].peak_bytes > peaks[1], (index, peaks)
