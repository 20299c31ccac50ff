"""Pipeline schedules as data: generated, validated and timed by the event simulator."""

from __future__ import annotations

import pytest

from planner.core.errors import InputError
from planner.core.pipeline_actions import (
    PipelineOp,
    rank_actions_from_csv,
    rank_actions_to_csv,
)
from planner.sim.pipeline_ranks import simulate_pipeline, simulate_pipeline_spans
from planner.sim.result import PlanError
from planner.solvers.pipeline.chains import LayerSpec, chain_graph
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.schedules import (
    check_schedule,
    compute_lists,
    inflight_counts,
    with_communication,
)
from planner.solvers.pipeline.units import UnitChain

MiB = 2**20


def uniform_graph(layers: int = 8):
    specs = [LayerSpec(f"h.{i}", 1.0, 2.0, 10 * MiB, MiB, 4 * MiB) for i in range(layers)]
    return chain_graph(specs)


def problem(schedule: str, ranks: int, m: int, layers: int = 8, chunks: int = 2):
    g = uniform_graph(layers)
    return PipelineProblem(g, UnitChain(g), ranks, m, schedule, None, chunks=chunks)


def even_split(p: PipelineProblem) -> Split:
    per = p.length // p.stage_count
    return Split(tuple((s * per, (s + 1) * per) for s in range(p.stage_count)))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"])
@pytest.mark.parametrize("ranks,m", [(2, 4), (4, 8), (4, 4)])
def test_every_schedule_is_valid(schedule: str, ranks: int, m: int) -> None:
    p = problem(schedule, ranks, m)
    split = even_split(p)
    lists = p.action_lists(split)
    stage_count = p.stage_count
    # every (stage, micro-batch) runs F once and its backward once, F before the backward
    for row in lists:
        seen_f: set[tuple[int, int]] = set()
        for a in row:
            key = (a.stage_index, a.microbatch_index)
            if a.op is PipelineOp.forward:
                seen_f.add(key)
            elif a.op in (PipelineOp.backward, PipelineOp.backward_input):
                assert key in seen_f, f"{a} before its forward"
    computes = [a for row in lists for a in row if a.is_compute]
    per_mb = 3 if schedule.startswith("zb") else 2
    assert len(computes) == per_mb * stage_count * m
    # the simulator matches every send with its receive and finds no deadlock
    partition = p.partition(split)
    sim = simulate_pipeline(p.graph, partition, lists)
    assert sim.microbatches == m
    assert sim.bubble_fraction is not None and 0 <= sim.bubble_fraction < 1
    # per-rank peaks from list order equal the simulator's
    assert p.peaks(split, lists) == [r.peak_bytes for r in sim.ranks]
    # torch's CSV round-trips
    assert rank_actions_from_csv(rank_actions_to_csv(lists)) == lists


@pytest.mark.parametrize("ranks,m", [(4, 8), (4, 2), (3, 5)])
def test_1f1b_in_flight_is_min_m_p_minus_s(ranks: int, m: int) -> None:
    lists = compute_lists("1f1b", ranks, m)
    assert inflight_counts(lists, ranks) == [min(m, ranks - s) for s in range(ranks)]
    assert inflight_counts(compute_lists("gpipe", ranks, m), ranks) == [m] * ranks
    zb = compute_lists("zb-h1", ranks, m)
    assert inflight_counts(zb, ranks) == [min(m, ranks - s) for s in range(ranks)]


def test_uniform_stage_times_give_the_textbook_bubbles() -> None:
    # F = 2 ms, B = 4 ms per stage (2 units each), no transfers: bubble (P-1)/(m+P-1)
    for schedule in ("gpipe", "1f1b"):
        p = problem(schedule, 4, 8)
        sim = p.candidate(even_split(p)).simulation
        assert sim is not None
        assert sim.bubble_fraction == pytest.approx(3 / 11)
        assert sim.makespan_ms == pytest.approx((8 + 3) * 6.0)
    zb = problem("zb-h1", 4, 8)
    zsim = zb.candidate(even_split(zb)).simulation
    assert zsim is not None and zsim.makespan_ms < (8 + 3) * 6.0  # W fills the drain
    inter = problem("interleaved-1f1b", 4, 8)
    isim = inter.candidate(even_split(inter)).simulation
    assert isim is not None and isim.makespan_ms < (8 + 3) * 6.0  # v = 2: bubble / 2


def test_interleaved_needs_a_multiple_of_the_ranks() -> None:
    with pytest.raises(InputError, match="multiple of 4"):
        check_schedule("interleaved-1f1b", 4, 6, 2)
    with pytest.raises(InputError, match="schedule"):
        check_schedule("pipedream", 4, 8)


def test_dropping_a_receive_is_named() -> None:
    p = problem("1f1b", 2, 2)
    split = even_split(p)
    lists = with_communication(compute_lists("1f1b", 2, 2), 2)
    broken = [list(row) for row in lists]
    broken[1] = [a for a in broken[1] if str(a) != "1RECV_F1"]
    with pytest.raises(PlanError, match="RECV_F1|input"):
        simulate_pipeline(p.graph, p.partition(split), broken)


def test_recomputation_trades_memory_for_time() -> None:
    p = problem("1f1b", 2, 4)
    keep = Split(((0, 4), (4, 8)))
    again = Split(((0, 4), (4, 8)), (0, None))  # stage 0 recomputes every micro-batch
    a, b = p.candidate(keep), p.candidate(again)
    assert a.simulation is not None and b.simulation is not None
    assert b.peaks[0] < a.peaks[0] and b.peaks[1] == a.peaks[1]
    assert b.simulation.compute_ms == pytest.approx(a.simulation.compute_ms + 4 * 4.0)
    assert b.peaks == [r.peak_bytes for r in b.simulation.ranks]
    assert b.partition.stage(0).recompute_microbatches == [0, 1, 2, 3]


def test_spans_cover_every_compute() -> None:
    p = problem("zb-h1", 4, 4)
    split = even_split(p)
    sim, spans = simulate_pipeline_spans(p.graph, p.partition(split), p.action_lists(split))
    assert len(spans) == 3 * 4 * 4
    assert max(s.end_ms for s in spans) == pytest.approx(sim.makespan_ms)
    for r in range(4):
        mine = [s for s in spans if s.rank == r]
        assert all(x.end_ms <= y.start_ms + 1e-9 for x, y in zip(mine, mine[1:], strict=False))


@pytest.mark.parametrize("schedule", ["zb-h1", "1f1b", "gpipe"])
def test_recomputation_peaks_stay_within_the_partitioners_bound(schedule: str) -> None:
    p = problem(schedule, 4, 8)
    split = Split(even_split(p).bounds, (1, 0, None, 2))
    cand = p.candidate(split)
    assert cand.simulation is not None
    assert cand.peaks == [r.peak_bytes for r in cand.simulation.ranks]
    for s, (i, j) in enumerate(split.bounds):
        bound = p.stage_memory(p.costs(i, j, s), s, split.stored_of(s))
        assert cand.peaks[s] <= bound
