"""A whole-job plan from the planner, run as planned: `pipeline-whole` plans a GPT over 2 and 4
ranks under device memory below what any plain contiguous split needs (so its stages must
recompute or offload modules; without a host tier, op-level options: recomputed modules keep
some of their calls' outputs, or their submodules recompute alone), and
torch.distributed.pipelining runs that plan (gloo, CPU): the loss and gradients equal one
process, and every rank's measured device peak stays within the plan's predicted peak, which is
within the device memory; host peaks within the predicted."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from planner import zoo
from planner.core.plan import Plan
from planner.core.resources import resources_preset
from planner.engine.partition import partition_plan
from planner.engine.request import with_host_memory
from planner.runtime.pipeline_launch import run_local
from planner.sim.pipeline_ranks import simulate_pipeline
from planner.solvers.pipeline.dp import least_memory_split
from planner.solvers.pipeline.problem import PipelineProblem
from planner.solvers.pipeline.units import UnitChain
from planner.tracing.api import trace

BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 32, "dim": 32, "layers": 8, "vocab": 64, "dropout": 0.0}
MACHINE = with_host_memory(resources_preset("h100-pcie-gen5"), "1GiB")
NO_HOST = resources_preset("h100-pcie-gen5")  # no host tier: stages can only recompute
SHARE = 0.85  # of the least memory any plain contiguous split needs


def _plan(world: int, machine: Any, schedule: str = "1f1b") -> tuple[Plan, int, Any]:
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    graph = trace(model, inputs).graph
    plain = PipelineProblem(graph, UnitChain(graph), world, MICROBATCHES, "1f1b", None)
    memory = int(SHARE * least_memory_split(plain)[0])
    report = partition_plan(graph, devices=world, device_memory_bytes=memory,
                            microbatches=MICROBATCHES, schedule=schedule, method="whole",
                            resources=machine, time_limit_s=5.0, threads=1)
    return report.plan, memory, graph


def _worker(rank: int, world: int, plan: Plan) -> dict[str, Any]:
    from planner.runtime.pipeline import build_pipeline, gather_gradients, gather_memory

    reference, inputs = zoo.gpt(batch_size=BATCH, **GPT)
    loss = reference(*inputs)
    loss.backward()
    expected = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
    model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
    run = build_pipeline(model, plan, inputs)
    step_loss = run.step(*inputs)
    grads = gather_gradients(run)
    return {"loss": step_loss, "reference_loss": float(loss.detach()),
            "same_parameters": sorted(grads) == sorted(expected),
            "max_grad_error": max(float((grads[k] - g).abs().max()) for k, g in expected.items()),
            "grad_scale": max(float(g.abs().max()) for g in expected.values()),
            "memory": gather_memory(run, run.measure_step(*inputs))}


@pytest.mark.slow  # traces, plans (5 s) and runs 2 and 4 gloo processes
@pytest.mark.parametrize(("world", "host"), [(2, True), (4, True), (2, False)])
def test_a_whole_job_plan_runs_as_planned(world: int, host: bool) -> None:
    machine = MACHINE if host else NO_HOST
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; the machine's cores go to the processes
    try:
        plan, memory, graph = _plan(world, machine)
        result = run_local(_worker, world, plan)[0]
    finally:
        torch.set_num_threads(threads)
    assert plan.partition is not None and plan.predicted is not None
    policies = [p for s in plan.partition.stages for p in s.unit_policies.values()]
    allowed = {"recompute", "offload"} if host else {"recompute"}
    assert policies and set(policies) <= allowed, plan.partition
    if not host:  # op-level plans: recomputed blocks keep some calls' outputs (selective), or
        # submodules recompute alone (the MLPs: their rerun stops before the second linear)
        assert any(s.unit_saved_ops or set(s.unit_policies) - set(s.modules)
                   for s in plan.partition.stages), plan.partition
    predicted = plan.predicted.per_rank_peak_bytes
    assert predicted is not None and max(predicted) <= memory
    assert result["same_parameters"]
    assert result["loss"] == pytest.approx(result["reference_loss"], rel=1e-6)
    assert result["max_grad_error"] <= 1e-5 * max(1.0, result["grad_scale"])
    measured = [m.peak_bytes for m in result["memory"]]
    print(f"{world} ranks at {memory:,} B ({SHARE} of the least plain split): policies "
          f"{[dict(s.unit_policies) for s in plan.partition.stages]}, saved calls "
          f"{[dict(s.unit_saved_ops) for s in plan.partition.stages]}, moved calls "
          f"{[dict(s.unit_offload_ops) for s in plan.partition.stages]}; measured {measured}, "
          f"predicted {predicted}; host measured "
          f"{[m.host_peak_bytes for m in result['memory']]}, predicted "
          f"{plan.predicted.host_peak_bytes}")
    # measured: the allocator's count where it is the larger (the checkpoints' RNG states
    # included: the simulator counts them on a CPU run, issue 47)
    for m, p in zip(measured, predicted, strict=True):
        assert m <= p <= memory
        # the prediction is an upper bound, close: 1.02-1.10 measured (2026-11-26; the last
        # rank of 4, which keeps everything, 1.103)
        assert p <= 1.15 * m
    assert plan.rank_actions is not None
    ranks = simulate_pipeline(graph, plan.partition, plan.rank_actions, machine).ranks
    for m, r in zip(result["memory"], ranks, strict=True):
        assert m.host_peak_bytes <= r.host_peak_bytes


@pytest.mark.slow  # traces, plans (5 s) and runs 4 gloo processes
def test_a_zero_bubble_plan_with_full_backwards_runs_as_planned() -> None:
    """Under ZB-H1 a stage whose W would rerun its recomputed blocks, or whose W's deferred
    into the bubbles would hold more than its memory, runs B instead of I and W: the plan has
    B actions there, I/W elsewhere, and runs as planned (measured <= predicted per rank)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan, memory, graph = _plan(4, NO_HOST, "zb-h1")
        result = run_local(_worker, 4, plan)[0]
    finally:
        torch.set_num_threads(threads)
    assert plan.partition is not None and plan.predicted is not None and plan.rank_actions
    ops = {(a.stage_index, a.op.value) for row in plan.rank_actions for a in row}
    fused = {s for s, op in ops if op == "B"}
    assert fused and {s for s, op in ops if op == "W"}, ops  # both kinds in one plan
    # a fused stage recomputes (one rerun, not two) or holds less with W not deferred
    # (fused for memory); it is not the first (whose W is a B anyway)
    assert all(s > 0 for s in fused)
    assert result["same_parameters"]
    assert result["loss"] == pytest.approx(result["reference_loss"], rel=1e-6)
    assert result["max_grad_error"] <= 1e-5 * max(1.0, result["grad_scale"])
    predicted = plan.predicted.per_rank_peak_bytes
    assert predicted is not None and max(predicted) <= memory
    measured = [m.peak_bytes for m in result["memory"]]
    print(f"ZB-H1 on 4 ranks at {memory:,} B: B on stages {sorted(fused)}; measured {measured}, "
          f"predicted {predicted}")
    for m, p in zip(measured, predicted, strict=True):
        assert m <= p
