"""The same request, the same answer for `whole` (issues 47 and 48): every phase of the
whole-job search stops on counted work, the DP's boundary moves included, so a slower machine
(here: a clock that runs fast, as a loaded machine's would seem to) costs time, not quality."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import planner.solvers.pipeline.whole_job as whole_job
from planner.core.graph import Graph
from planner.engine.partition import make_problem
from planner.solvers.pipeline import (
    dp,
    ilp,
    policy_splits,
    proposals,
    stage_items,
    stage_menu,
)
from planner.solvers.pipeline import enumerate as enumeration
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem

SLOWDOWN = 5.0  # each real second reads as this many: a machine five times as slow
CLOCKED = (whole_job, dp, enumeration, ilp, policy_splits, proposals, stage_items, stage_menu)


@pytest.fixture(scope="module")
def gpt() -> Graph:
    return chain_graph(transformer_layers(12, 1024, 16, 32000, 512, 2, tflops=10),
                       optimizer="adam")


def _problem(g: Graph, schedule: str) -> PipelineProblem:
    p = make_problem(g, devices=4, memory_bytes=None, microbatches=8, schedule=schedule)
    p.memory_bytes = int(dp.least_memory_split(p)[0] * 1.05)
    return p


def _answer(out: PartitionOutcome) -> tuple[object, ...]:
    split = out.best.split if out.best is not None else None
    step = out.best.simulation.makespan_ms if out.best and out.best.simulation else None
    return split, step, out.status, out.objective


def _slow_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.perf_counter()
    fake = SimpleNamespace(perf_counter=lambda: start + SLOWDOWN * (time.perf_counter() - start),
                           monotonic=time.monotonic, sleep=time.sleep)
    for module in CLOCKED:
        if hasattr(module, "time"):
            monkeypatch.setattr(module, "time", fake)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_whole_answers_the_same_on_a_slowed_clock(gpt: Graph, schedule: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the wall-clock safety nets out of the way: the work budgets alone must decide
    monkeypatch.setattr(whole_job, "ROOM_S", -1e6)
    monkeypatch.setattr(enumeration, "WALL_SAFETY", 1e6)
    monkeypatch.setattr(ilp, "WALL_SAFETY", 1e6)
    first = whole_job.whole_job_partition(_problem(gpt, schedule), time_limit_s=1.0)
    _slow_clock(monkeypatch)
    slowed = whole_job.whole_job_partition(_problem(gpt, schedule), time_limit_s=1.0)
    assert first.best is not None
    assert _answer(slowed) == _answer(first)
