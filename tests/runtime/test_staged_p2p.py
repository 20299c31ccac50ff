"""planner.runtime.staged_p2p: pipeline messages staged through host memory (how several ranks
share one GPU) change nothing a rank computes or holds. On CPU, with every tensor staged, a
pipeline step gives the same loss, gradients and per-rank measured peaks as unstaged; and the
runtime refuses split-backward (W) plans on a torch older than the one they are verified on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from planner import zoo
from planner.core.errors import InputError
from planner.core.pipeline_actions import rank_actions_from_text
from planner.core.plan import Plan
from planner.engine.partition import partition_plan
from planner.runtime.pipeline_launch import run_local
from planner.tracing.api import trace

BATCH, MICROBATCHES = 8, 4
GPT: dict[str, Any] = {"context": 32, "dim": 32, "layers": 4, "vocab": 64, "dropout": 0.0}


def _plan(schedule: str) -> Plan:
    model, inputs = zoo.gpt(batch_size=BATCH // MICROBATCHES, **GPT)
    graph = trace(model, inputs).graph
    return partition_plan(graph, devices=2, device_memory_bytes=2**30, microbatches=MICROBATCHES,
                          schedule=schedule, method="dp", time_limit_s=5.0, threads=1).plan


def _worker(rank: int, world: int, plan: Plan, staged: bool) -> dict[str, Any]:
    from planner.runtime.pipeline import build_pipeline
    from planner.runtime.staged_p2p import install, uninstall

    if staged:
        install(stage_all=True)
    try:
        model, inputs = zoo.gpt(batch_size=BATCH, **GPT)
        run = build_pipeline(model, plan, inputs)
        loss = run.step(*inputs)
        # bytes, not tensors: tensors would travel back through shared memory
        grads = {k: p.grad.numpy().tobytes() for k, p in run.parameters().items()
                 if p.grad is not None}
        memory = run.measure_step(*inputs)
    finally:
        uninstall()
    return {"loss": loss, "grads": grads, "peak": memory.peak_bytes}


@pytest.mark.slow  # two pipelines of 2 gloo processes per schedule
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_staged_messages_change_no_loss_gradient_or_peak(schedule: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan = _plan(schedule)
        plain = run_local(_worker, 2, plan, False)
        staged = run_local(_worker, 2, plan, True)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(plain, staged, strict=True):
        assert a["loss"] == b["loss"]
        assert sorted(a["grads"]) == sorted(b["grads"])
        for k, g in a["grads"].items():
            assert g == b["grads"][k], k  # bit for bit
        assert a["peak"] == b["peak"]  # the host copies are not the rank's device memory


def test_split_backward_needs_the_verified_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.runtime import pipeline_checks

    rows = rank_actions_from_text("0F0 0I0 0W0\n")
    plan = SimpleNamespace(rank_actions=rows, details={"schedule": "zb-h1"}, method="dp")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    with pytest.raises(InputError, match="torch==2.13.0"):
        pipeline_checks.check_split_backward(plan)  # type: ignore[arg-type]
    no_w = SimpleNamespace(rank_actions=rank_actions_from_text("0F0 0B0\n"), details={},
                           method="dp")
    pipeline_checks.check_split_backward(no_w)  # type: ignore[arg-type]
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    pipeline_checks.check_split_backward(plan)  # type: ignore[arg-type]
