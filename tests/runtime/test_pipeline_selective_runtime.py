"""Selective activation checkpointing per unit in the pipeline runtime
(`PipelineStage.unit_saved_ops`, planner.runtime.pipeline_units): a "recompute" unit keeps the
outputs of the calls it names and reruns the rest. Its op calls are counted as the traced graph
names its nodes; loss and gradients equal one process (gloo, 2 processes); the measured device
peak lies between the all-recompute and the all-keep plans'; a call the forward does not make is
refused in one line."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

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
    UnitCall,
    UnitSwitch,
    apply_unit_policies,
    check_unit_policies,
    op_name,
)
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.solvers.pipeline.schedules import make_schedule
from planner.tracing.api import trace
from planner.tracing.memory import StorageTracker

# the GPT of tests/runtime/test_pipeline_policies.py
BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 32, "dim": 32, "layers": 8, "vocab": 64, "dropout": 0.0}
BLOCKS = [f"h.{i}" for i in range(8)]
SPLIT = [["tok", "pos", *BLOCKS[:4]], [*BLOCKS[4:], "ln_f", "head"]]
ALL_RECOMPUTE = dict.fromkeys(BLOCKS, "recompute")
# per block: the qkv projection's and the MLP's first linear's outputs kept, the rest rerun
SAVED = {b: ["aten.addmm#0", "aten.addmm#2"] for b in BLOCKS}
# per block: calls whose outputs no backward node reads kept, with the layer norms'
UNREAD = ["aten.add#1", "aten.ones#0", "aten.tril#0", "aten.bitwise_not#0", "aten.addmm#3",
          "aten.bmm#1", "aten.native_layer_norm#0", "aten.native_layer_norm#1"]
ALL_OFFLOAD = dict.fromkeys(BLOCKS, "offload")
# submodule checkpoints (a policy on 'h.1.mlp' leaves the rest of 'h.1' kept)
MLPS = {f"{b}.mlp": "recompute" for b in BLOCKS}
ATTNS = {f"{b}.attn": "recompute" for b in BLOCKS}
MLP_FIRST = {f"{b}.mlp": ["aten.addmm#0"] for b in BLOCKS}
# per block: only the attention scores (bmm, softmax) and the MLP's first linear go to the host
MOVED = {b: ["aten.bmm#0", "aten._softmax#0", "aten.addmm#2"] for b in BLOCKS}


def _in(module: str, modules: list[str]) -> bool:
    """`module` is one of `modules` or inside one ('h.1.mlp')."""
    return any(module == m or module.startswith(m + ".") for m in modules)


def make_plan(schedule: str, policies: dict[str, str], saved: dict[str, list[str]],
              recompute: dict[int, list[int]] | None = None,
              offload: dict[str, list[str]] | None = None) -> Plan:
    part = Partition(stages=[
        StageSpec(stage_index=i, rank=i, modules=mods,
                  unit_policies={m: p for m, p in policies.items() if _in(m, mods)},
                  unit_saved_ops={m: ops for m, ops in saved.items() if _in(m, mods)},
                  unit_offload_ops={m: ops for m, ops in (offload or {}).items()
                                    if _in(m, mods)},
                  recompute_microbatches=(recompute or {}).get(i, []))
        for i, mods in enumerate(SPLIT)])
    made = make_schedule(schedule, 2, MICROBATCHES)
    rows = made.compute_lists() if schedule == "gpipe" else made.rank_actions()
    return Plan(graph_hash="hand-made", method="hand", status=PlanStatus.feasible,
                partition=part, rank_actions=rows, resources=Resources(microbatches=MICROBATCHES))


def _one_stage(saved: dict[str, list[str]], policies: dict[str, str] | None = None,
               stage_checkpointed: bool = False) -> dict[str, Any]:
    """Forward + backward of the whole GPT as one stage, its blocks recomputed with `saved`."""
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    spec = StageSpec(stage_index=0, rank=0, modules=["tok", "pos", *BLOCKS, "ln_f", "head"],
                     unit_policies=ALL_RECOMPUTE if policies is None else policies,
                     unit_saved_ops=saved)
    split = split_model(model, Partition(stages=[spec]), inputs)
    switch = UnitSwitch()
    calls = apply_unit_policies(split.stages[0].module, check_unit_policies(spec), switch,
                                HostMemory())
    stage = StageModule(split.stages[0], frozenset({0}), switch)
    stage.microbatch = 0 if stage_checkpointed else None
    tracker = StorageTracker(keep_timeline=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only contend on a busy machine
    try:
        with tracker:
            loss = stage(*inputs)
            loss.backward()
    finally:
        torch.set_num_threads(threads)
    return {"loss": float(loss.detach()), "peak": tracker.peak_bytes,
            "calls": {c.name: c for c in calls},
            "grads": {k: p.grad for k, p in model.named_parameters()}}


# -- a) the policy counts calls as the graph names its nodes ----------------------------------
def test_the_policy_counts_a_units_calls_as_the_traced_graph_has_them() -> None:
    """Calls per op name in h.3's forward, as the runtime's policy saw them, against the traced
    graph's forward nodes in h.3. The graph leaves views out (aten.view, t, transpose, expand,
    split, _unsafe_view: no memory, no compute of their own) and the policy sees them, so the
    check covers the ops the graph has, and says that what is left over is views only."""
    run = _one_stage({"h.3": ["aten.addmm#0"]})
    call: UnitCall = run["calls"]["h.3"]
    assert call.observed is not None
    observed = call.observed
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    graph = trace(model, inputs).graph
    nodes = Counter(
        n.op for n in graph.nodes
        if n.phase.value == "forward" and n.op != "getitem"
        and (n.module_path == "h.3" or n.module_path.startswith("h.3."))
    )
    assert nodes["aten.addmm"] == 4 and nodes["aten.native_layer_norm"] == 2  # the trace's
    assert {op: observed[op] for op in nodes} == dict(nodes)
    views = {"aten.view", "aten.t", "aten.transpose", "aten.expand", "aten.split",
             "aten._unsafe_view"}
    assert set(observed) - set(nodes) <= views, set(observed) - set(nodes)


def test_in_place_calls_count_as_their_functional_op() -> None:
    assert op_name(torch.ops.aten.add_.Tensor) == "aten.add"
    assert op_name(torch.ops.aten.addmm.default) == "aten.addmm"
    assert op_name(torch.ops.aten.__and__.Tensor) == "aten.__and__"

    class Unit(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.sin()
            y.mul_(2.0)  # in place: aten.mul#0
            return (y * x).cos()  # aten.mul#1

    x = torch.randn(4, 4, requires_grad=True)
    call = UnitCall(Unit(), "u", "recompute", UnitSwitch(), HostMemory(), ["aten.mul_#1"])
    out = call(x)
    assert call.observed == Counter({"aten.sin": 1, "aten.mul": 2, "aten.cos": 1})
    out.sum().backward()
    expected = torch.autograd.grad(((x.sin() * 2.0) * x).cos().sum(), x)[0]
    assert x.grad is not None and torch.allclose(x.grad, expected)


# -- single process: whole-stage checkpoints around selective units --------------------------
def test_selective_units_inside_a_checkpointed_stage_keep_the_step_and_its_peak() -> None:
    """A micro-batch whose whole stage is checkpointed reruns its selective units under plain
    checkpoints (UnitSwitch.rerun): the backward uses the forward's selective saves, so the
    rerun keeps none again and the peak is the unit plan's."""
    plain = _one_stage({}, policies={})
    selective = _one_stage(SAVED)
    inside = _one_stage(SAVED, stage_checkpointed=True)
    recompute = _one_stage({})
    assert recompute["peak"] < selective["peak"] < plain["peak"]
    assert inside["peak"] == selective["peak"], (inside["peak"], selective["peak"])
    for r in (selective, inside):
        assert r["loss"] == pytest.approx(plain["loss"], rel=1e-6)
        for k, g in plain["grads"].items():
            assert torch.allclose(r["grads"][k], g, rtol=1e-5, atol=1e-6), k


# -- c) a call the forward does not make ----------------------------------------------------
def test_a_saved_op_the_forward_does_not_call_is_refused_in_one_line() -> None:
    with pytest.raises(InputError) as info:
        _one_stage({"h.1": ["aten.addmm#0", "aten.addmm#99"]})
    message = str(info.value)
    assert message == (
        "partition: stage 0's unit_saved_ops['h.1']: 'aten.addmm#99' is not a call of the "
        "unit's forward (aten.addmm is called 4 times there); name calls 'OP#K' with K below "
        "that"
    )
    assert "\n" not in message
    with pytest.raises(InputError, match=r"'aten\.conv2d#0' is not a call .* \(aten\.conv2d is "
                                         r"called 0 times there\)"):
        _one_stage({"h.6": ["aten.conv2d#0"]})
    odd = StageSpec.model_construct(stage_index=1, rank=1, modules=["h.4"], nodes=[],
                                    recompute_microbatches=[], unit_policies={"h.4": "offload"},
                                    unit_saved_ops={"h.4": ["aten.addmm#0"]})
    with pytest.raises(InputError, match=r"^partition: stage 1's unit_saved_ops name 'h.4', "
                                         r"which is not one of its 'recompute' units"):
        check_unit_policies(odd)


# -- b) two processes (gloo) ------------------------------------------------------------------
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
        plan = make_plan(cfg["schedule"], cfg["policies"], cfg["saved"], cfg.get("recompute"),
                         cfg.get("offload"))
        run = build_pipeline(model, plan, inputs)
        starts: Counter[str] = Counter()  # forwards begun per block: runs and reruns
        hooks = [model.get_submodule(b).register_forward_pre_hook(
            lambda *_, b=b, starts=starts: starts.update([b])) for b in BLOCKS]
        loss = run.step(*inputs)
        for h in hooks:
            h.remove()
        every: list[Any] = [None] * world
        torch.distributed.all_gather_object(every, dict(starts))
        grads = gather_gradients(run)
        errors = [float((grads[k] - g).abs().max()) for k, g in expected.items() if k in grads]
        out.append({"loss": loss, "reference_loss": reference_loss,
                    "same_parameters": sorted(grads) == sorted(expected),
                    "max_grad_error": max(errors), "grad_scale": scale,
                    "forwards": every,
                    "memory": gather_memory(run, run.measure_step(*inputs))})
    return out


CONFIGS: list[dict[str, Any]] = [
    {"schedule": "1f1b", "policies": {}, "saved": {}},  # keep
    {"schedule": "1f1b", "policies": ALL_RECOMPUTE, "saved": {}},  # recompute
    {"schedule": "1f1b", "policies": ALL_RECOMPUTE, "saved": SAVED},  # selective
    {"schedule": "1f1b", "policies": ALL_RECOMPUTE, "saved": SAVED, "recompute": {0: [1]}},
    {"schedule": "gpipe", "policies": ALL_RECOMPUTE, "saved": SAVED},
    {"schedule": "zb-h1", "policies": ALL_RECOMPUTE, "saved": SAVED},
    {"schedule": "1f1b", "policies": ALL_OFFLOAD, "saved": {}},  # offload everything saved
    {"schedule": "1f1b", "policies": ALL_OFFLOAD, "saved": {}, "offload": MOVED},  # partial
    {"schedule": "zb-h1", "policies": ALL_OFFLOAD, "saved": {}, "offload": MOVED},
    {"schedule": "zb-h1", "policies": ALL_RECOMPUTE, "saved": {}},  # whole blocks, split W
    {"schedule": "zb-h1", "policies": {}, "saved": {}, "recompute": {1: [0, 2]}},  # stage 1
    # stage 0's last block keeps its output (the one it sends): nothing to rerun after its
    # backward's first linear, whose input and weight gradients are then its peak
    {"schedule": "1f1b", "policies": {"h.3": "recompute"}, "saved": {"h.3": ["aten.add#1"]}},
    # and calls no backward reads (the mask, the output projections), as the planner keeps them
    {"schedule": "1f1b", "policies": {"h.3": "recompute"}, "saved": {"h.3": UNREAD}},
    # submodules checkpointed on their own: every block's MLP (its input kept, only it rerun)
    {"schedule": "1f1b", "policies": MLPS, "saved": {}},
    # the attention and the MLP apart, the MLP keeping its first linear's output (GELU rerun)
    {"schedule": "1f1b", "policies": {**ATTNS, **MLPS}, "saved": MLP_FIRST},
    {"schedule": "zb-h1", "policies": MLPS, "saved": MLP_FIRST},
    {"schedule": "1f1b", "policies": MLPS, "saved": {}, "recompute": {0: [1]}},
]
OFFLOAD, PARTIAL = 6, 7
KEEP, RECOMPUTE, SELECTIVE = 0, 1, 2


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_local(_worker, 2, CONFIGS)[0]


@pytest.mark.parametrize("index", range(len(CONFIGS)))
@pytest.mark.slow  # the shared fixture runs 2-process pipelines
def test_selective_units_match_the_single_process_step(
    results: list[dict[str, Any]], index: int
) -> None:
    r = results[index]
    assert r["same_parameters"]
    assert r["loss"] == pytest.approx(r["reference_loss"], rel=1e-6)
    assert r["max_grad_error"] <= 1e-5 * max(1.0, r["grad_scale"])


@pytest.mark.slow  # shares the 2-process fixture
def test_a_split_weight_backward_reruns_each_checkpoint_once(
    results: list[dict[str, Any]],
) -> None:
    """Under ZB-H1 a recomputed block of the last stage reruns its forward for I and once more
    for W (the runtime's W is one autograd call; torch's runs one per weight group, six per
    block here, each a rerun): one forward a micro-batch more than under 1F1B. On the first
    stage W is the whole backward: as many as under 1F1B. As the simulator times them.
    (Forwards begun also count torch's shape inference at the first step.)"""
    for cfg, r in zip(CONFIGS, results, strict=True):
        print("forwards begun per block", cfg["schedule"], len(cfg["policies"]),
              len(cfg["saved"]), r["forwards"])
    for saved in (SAVED, {}):
        zb = results[CONFIGS.index({"schedule": "zb-h1", "policies": ALL_RECOMPUTE,
                                    "saved": saved})]["forwards"]
        one = results[CONFIGS.index({"schedule": "1f1b", "policies": ALL_RECOMPUTE,
                                     "saved": saved})]["forwards"]
        assert zb[0] == one[0], (zb, one)
        assert zb[1] == {b: n + MICROBATCHES for b, n in one[1].items()}, (zb, one)
        assert one[1] == dict.fromkeys(BLOCKS[4:], one[1]["h.4"]) and one[1]["h.4"] >= 8


@pytest.mark.slow  # shares the 2-process fixture
def test_selective_peak_lies_between_all_recompute_and_all_keep(
    results: list[dict[str, Any]],
) -> None:
    keep, recompute, selective = (results[i]["memory"] for i in (KEEP, RECOMPUTE, SELECTIVE))
    for rank in (0, 1):
        print(f"rank {rank}: device peak {keep[rank].peak_bytes:,} B keep, "
              f"{selective[rank].peak_bytes:,} B selective, {recompute[rank].peak_bytes:,} B "
              "recompute")
        assert recompute[rank].peak_bytes < selective[rank].peak_bytes < keep[rank].peak_bytes
        assert selective[rank].host_peak_bytes == 0


def _refusing_worker(rank: int, world: int, saved: dict[str, list[str]]) -> None:
    """The rank whose unit names a call its forward does not make raises InputError from
    `step`; its peer then loses the connection."""
    from planner.runtime.pipeline import build_pipeline

    model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
    build_pipeline(model, make_plan("1f1b", ALL_RECOMPUTE, saved), inputs).step(*inputs)


@pytest.mark.slow  # 2 processes
def test_a_pipeline_refuses_a_saved_op_the_forward_does_not_call_in_one_line() -> None:
    """run_local reports the rank that failed first (not its peer's closed connection)."""
    with pytest.raises(RuntimeError) as info:
        run_local(_refusing_worker, 2, {"h.1": ["aten.addmm#99"]})
    first = str(info.value).splitlines()[0]
    assert first.startswith("rank 0: InputError: partition: stage 0's unit_saved_ops['h.1']: "
                            "'aten.addmm#99' is not a call of the unit's forward"), first


@pytest.fixture(scope="module")
def step_graph() -> Any:
    """One micro-batch's step of the GPT at op level (the plans' graph)."""
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    return trace(model, inputs).graph


# measured <= predicted <= SLACK x measured per rank (the simulator's selective rule,
# planner.sim.selective_units). Measured (CPU, 2026-11-26): see the printed rows.
SLACK = {"1f1b": 1.10, "gpipe": 1.10, "zb-h1": 1.45}  # split W: its reruns bounded loosely
HOST_TIER = resources_preset("h100-pcie-gen5")  # offload needs host links in the simulator


@pytest.mark.parametrize("index", range(len(CONFIGS)))
@pytest.mark.slow  # shares the 2-process fixture
def test_measured_peak_is_at_most_the_simulated_and_close(
    results: list[dict[str, Any]], step_graph: Any, index: int
) -> None:
    cfg = CONFIGS[index]
    plan = make_plan(cfg["schedule"], cfg["policies"], cfg["saved"], cfg.get("recompute"),
                     cfg.get("offload"))
    assert plan.partition is not None and plan.rank_actions is not None
    predicted = simulate_pipeline(step_graph, plan.partition, plan.rank_actions, HOST_TIER)
    measured = [m.peak_bytes for m in results[index]["memory"]]
    ratios = [p / m for m, p in zip(measured, predicted.per_rank_peak_bytes, strict=True)]
    print(f"{cfg['schedule']} {len(cfg['saved'])} selective: measured {measured}, predicted "
          f"{predicted.per_rank_peak_bytes}, predicted/measured {[round(r, 3) for r in ratios]}")
    # known gap: ZB-H1 with partial offload, the last rank is predicted 0.6 % under torch
    # (1,358,362 against 1,366,072 B, 2026-11-26; the planner offers no partial offload
    # under zero-bubble schedules)
    least = 0.99 if cfg["schedule"] == "zb-h1" and cfg.get("offload") else 1.0
    # measured: the allocator's count where it is the larger (the checkpoints' RNG states
    # included: the simulator counts them on a CPU run, issue 47)
    for r, m, p in zip(ratios, measured, predicted.per_rank_peak_bytes, strict=True):
        assert least * m <= p and r <= SLACK[cfg["schedule"]], (
            cfg, measured, predicted.per_rank_peak_bytes)
    host = [m.host_peak_bytes for m in results[index]["memory"]]
    assert host == [r.host_peak_bytes for r in predicted.ranks], host  # one copy per saving


@pytest.mark.slow  # shares the 2-process fixture
def test_a_partial_offload_moves_only_the_named_calls_outputs(
    results: list[dict[str, Any]],
) -> None:
    keep, full, part = (results[i]["memory"] for i in (KEEP, OFFLOAD, PARTIAL))
    for rank in (0, 1):
        print(f"rank {rank}: device peak {keep[rank].peak_bytes:,} B keep, "
              f"{part[rank].peak_bytes:,} B partial offload ({part[rank].host_peak_bytes:,} B "
              f"host), {full[rank].peak_bytes:,} B full offload ({full[rank].host_peak_bytes:,}"
              " B host)")
        assert full[rank].peak_bytes < part[rank].peak_bytes < keep[rank].peak_bytes
        assert 0 < part[rank].host_peak_bytes < full[rank].host_peak_bytes
