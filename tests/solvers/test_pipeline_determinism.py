"""The same request, the same answer (issue 47): the pipeline ILP, DP and enumeration cut their
searches by counted work and CP-SAT's deterministic time, never by the wall clock, so a slower
machine (here: a clock that runs fast, as a loaded machine's would seem to) costs time, not
quality. The wall clock stays a safety net at WALL_SAFETY x the limit."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from pipeline_chains import random_chain

from planner.solvers.pipeline import dp, ilp
from planner.solvers.pipeline import enumerate as enumeration
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem
from planner.solvers.pipeline.units import UnitChain

SLOWDOWN = 5.0  # each real second reads as this many: a machine five times as slow


@pytest.fixture
def slowed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Call the fixture's function to make the partitioners' clock run SLOWDOWN x fast. The
    wall-clock safety net (WALL_SAFETY x the limit, below SLOWDOWN) is moved out of the way:
    the work budgets alone must give the same answer (the old wall-clock cut-offs did not:
    the ILP below solved one lower memory level at the real clock, none at the slowed one).
    The net is out of the way from the start, so a busy machine (slower than the work rates
    were measured on) cannot fire it in the runs at the real clock either."""
    monkeypatch.setattr(enumeration, "WALL_SAFETY", 100.0)
    monkeypatch.setattr(ilp, "WALL_SAFETY", 100.0)

    def slow() -> None:
        start = time.perf_counter()
        fake = SimpleNamespace(
            perf_counter=lambda: start + SLOWDOWN * (time.perf_counter() - start))
        for module in (dp, enumeration, ilp):
            monkeypatch.setattr(module, "time", fake)

    yield slow


def problem(seed: int = 3, layers: int = 12, share: float = 0.9, ranks: int = 3,
            microbatches: int = 6) -> PipelineProblem:
    """A random chain under 1F1B at `share` of the least memory without recomputation (below
    1: the ILP recomputes)."""
    g = random_chain(seed, layers)
    p = PipelineProblem(g, UnitChain(g), ranks, microbatches, "1f1b", None)
    p.memory_bytes = int(dp.least_memory_split(p)[0] * share)
    return p


def ilp_problem() -> PipelineProblem:
    return problem(layers=30, ranks=4, microbatches=8)


def answer(out: PartitionOutcome) -> tuple[object, ...]:
    """What must not change between runs: the split, its step, status and notes."""
    split = out.best.split if out.best is not None else None
    return split, out.objective, out.status, out.proxy_objective, out.proxy_bound, out.notes


@pytest.mark.parametrize("threads,interleave", [(1, False), (2, False), (2, True)])
def test_the_ilp_answers_the_same_on_a_slowed_clock(slowed_clock: Callable[[], None],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    threads: int, interleave: bool) -> None:
    """Twice at the real clock and once at a slowed one: the same split, step and notes (one
    CP-SAT worker, or several interleaved: deterministic either way)."""
    monkeypatch.setattr(ilp, "INTERLEAVE_THREADS", interleave)
    first = ilp.ilp_partition(ilp_problem(), time_limit_s=1.0, threads=threads)
    assert first.best is not None and any(q is not None for q in first.best.split.stored)
    again = ilp.ilp_partition(ilp_problem(), time_limit_s=1.0, threads=threads)
    slowed_clock()
    slowed = ilp.ilp_partition(ilp_problem(), time_limit_s=1.0, threads=threads)
    assert answer(again) == answer(first)
    assert answer(slowed) == answer(first)
    assert not any("safety net" in note for note in first.notes + slowed.notes)


def test_the_dp_moves_the_same_on_a_slowed_clock(slowed_clock: Callable[[], None]) -> None:
    """No enumeration (max_splits=0): the proposals and a budget of boundary moves."""
    first = dp.dp_partition(problem(share=1.2), time_limit_s=0.3, max_splits=0)
    slowed_clock()
    slowed = dp.dp_partition(problem(share=1.2), time_limit_s=0.3, max_splits=0)
    assert first.best is not None and answer(slowed) == answer(first)


def test_the_enumeration_stops_after_the_same_splits(slowed_clock: Callable[[], None],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut short by its budget, the enumeration examines the same splits however fast the
    clock runs; with no budget it finishes."""
    monkeypatch.setattr(enumeration, "WALL_SAFETY", 100.0)  # its budget is a few ms here
    full_work = enumeration.Work(math.inf)
    full = enumeration.enumerate_splits(problem(layers=14, share=1.5), work=full_work)
    assert full.finished and full.examined > 2
    limit_s = full_work.spent_s - 0.5 * (full_work.spent_s - ranges_and_bounds_s())
    first = enumeration.enumerate_splits(problem(layers=14, share=1.5), time_limit_s=limit_s)
    slowed_clock()
    slowed = enumeration.enumerate_splits(problem(layers=14, share=1.5), time_limit_s=limit_s)
    assert not first.finished and "counted work" in first.reason
    assert 0 < first.examined < full.examined
    assert (slowed.examined, slowed.simulated, slowed.reason) == (
        first.examined, first.simulated, first.reason)
    assert (slowed.best.split if slowed.best else None) == (
        first.best.split if first.best else None)


def ranges_and_bounds_s() -> float:
    """The enumeration's work before it examines a split (bounds, range costs)."""
    work = enumeration.Work(0.0)
    enumeration.enumerate_splits(problem(layers=14, share=1.5), work=work)
    return work.spent_s


def test_the_wall_clock_is_only_a_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock past WALL_SAFETY x the limit stops the search and says so; the answer is the
    best so far."""
    monkeypatch.setattr(enumeration, "WALL_SAFETY", 0.0)
    out = dp.dp_partition(problem(share=1.2), time_limit_s=0.3, max_splits=0)
    assert out.best is not None and any("safety net" in note for note in out.notes)
    found = enumeration.enumerate_splits(problem(layers=14, share=1.2), time_limit_s=10.0)
    assert not found.finished and "safety net" in found.reason
