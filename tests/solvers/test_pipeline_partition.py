"""Partitioners: unit costs equal the simulator's, DP against brute force, the ILP, baselines."""

from __future__ import annotations

import itertools

import pytest
from pipeline_chains import random_chain

from planner.sim.stage_costs import stage_costs
from planner.solvers.pipeline.baselines import baseline_partition, layer_balanced
from planner.solvers.pipeline.chains import LayerSpec, chain_graph, transformer_layers
from planner.solvers.pipeline.dp import dp_partition, least_memory_split, memory_caps, proposals
from planner.solvers.pipeline.ilp import ilp_partition
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.units import UnitChain, unit_key

MiB = 2**20


def all_splits(length: int, stages: int):
    for cuts in itertools.combinations(range(1, length), stages - 1):
        edges = [0, *cuts, length]
        yield Split(tuple((edges[s], edges[s + 1]) for s in range(stages)))


def test_unit_keys() -> None:
    assert unit_key("h.3.attn.qkv") == "h.3"
    assert unit_key("head") == "head"
    assert unit_key("encoder.layer.11.out") == "encoder.layer.11"
    assert unit_key("") == ""


@pytest.mark.parametrize("seed", range(4))
def test_range_costs_equal_the_simulator_stage_costs(seed: int) -> None:
    g = random_chain(seed, 7)
    chain = UnitChain(g)
    p = PipelineProblem(g, chain, 3, 4, "1f1b", None)
    for split in list(all_splits(7, 3))[seed::5]:
        truth = stage_costs(g, p.partition(split))
        for s, (i, j) in enumerate(split.bounds):
            c = p.costs(i, j, s)
            t = truth[s]
            assert (c.saved_bytes, c.input_bytes, c.transient_bytes, c.model_state_bytes,
                    c.send_forward_bytes, c.send_backward_bytes) == (
                t.saved_bytes, t.input_bytes, t.transient_bytes, t.model_state_bytes,
                t.send_forward_bytes, t.send_backward_bytes)
            assert c.forward_ms == pytest.approx(t.forward_ms)
            assert c.backward_ms == pytest.approx(t.backward_ms)
            assert c.backward_weight_ms == pytest.approx(t.backward_weight_ms)


@pytest.mark.parametrize("seed,schedule", [(0, "1f1b"), (1, "gpipe"), (2, "1f1b"),
                                           (3, "zb-h1")])
def test_dp_is_optimal_against_brute_force(seed: int, schedule: str) -> None:
    g = random_chain(seed, 8)
    chain = UnitChain(g)
    p = PipelineProblem(g, chain, 3, 4, schedule, None)
    # every split, its exact per-rank peaks and bottleneck stage time
    table = []
    for split in all_splits(8, 3):
        peaks = p.candidate(split, simulate=False).peaks
        worst = max(p.stage_time(p.costs(i, j, s), s) for s, (i, j) in enumerate(split.bounds))
        table.append((split, max(peaks), worst))
    least = min(t[1] for t in table)
    assert least_memory_split(p)[0] == least  # the memory DP is exact with one stage a rank
    peaks_sorted = sorted({t[1] for t in table})
    p.memory_bytes = peaks_sorted[len(peaks_sorted) // 3]  # tight: a third of the splits fit
    fitting = [t for t in table if t[1] <= p.memory_bytes]
    out = dp_partition(p)
    assert out.best is not None and out.best.fits
    # 21 splits: enumerated, so proven fastest in the simulator; the objective is its step
    assert out.status == "optimal"
    fastest = min(p.candidate(t[0]).simulation.makespan_ms for t in fitting)
    assert out.objective == pytest.approx(fastest)
    # the DP's own pass (used past the enumeration's budget) finds the least bottleneck
    assert proposals(p, memory_caps(p))[1] == pytest.approx(min(t[2] for t in fitting))
    # the chosen split is never slower (simulated) than the best-bottleneck fitting split
    best_bottleneck = min(fitting, key=lambda t: t[2])[0]
    other = p.candidate(best_bottleneck).simulation
    assert out.best.simulation is not None and other is not None
    assert out.best.simulation.makespan_ms <= other.makespan_ms + 1e-9
    p.memory_bytes = least - 1
    assert dp_partition(p).best is None


@pytest.mark.parametrize("seed", range(3))
def test_ilp_is_never_slower_than_the_dp_and_fits_more(seed: int) -> None:
    g = random_chain(10 + seed, 9)
    p = PipelineProblem(g, UnitChain(g), 3, 6, "1f1b", None)
    least = least_memory_split(p)[0]
    p.memory_bytes = int(least * 1.05)
    dp, ilp = dp_partition(p), ilp_partition(p, time_limit_s=5)
    assert dp.best is not None and ilp.best is not None
    assert dp.best.simulation is not None and ilp.best.simulation is not None
    assert ilp.best.simulation.makespan_ms <= dp.best.simulation.makespan_ms + 1e-9
    # CP-SAT's bound is on its proxy only: no "optimal" and no bound on the simulated step
    assert ilp.status == "feasible" and ilp.lower_bound is None
    assert ilp.objective == pytest.approx(ilp.best.simulation.makespan_ms)
    assert ilp.proxy_bound is not None and ilp.proxy_objective is not None
    assert ilp.proxy_bound <= ilp.proxy_objective + 1e-6
    # below the least memory without recomputation only recomputation fits
    p.memory_bytes = least - 1
    assert dp_partition(p).best is None
    full = least_memory_split(p, recompute=True)[0]
    if full < least - 1:
        out = ilp_partition(p, time_limit_s=5)
        assert out.best is not None and out.best.fits and max(out.best.peaks) < least
        assert any(q is not None for q in out.best.split.stored)


def test_baselines() -> None:
    assert layer_balanced(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    g = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 1))  # tok, h.0..h.5, head
    p = PipelineProblem(g, UnitChain(g), 2, 8, "1f1b", None)
    layer = baseline_partition(p, "layer-balanced")
    assert layer.best is not None and layer.best.split.bounds == ((0, 4), (4, 8))
    params = baseline_partition(p, "param-balanced")
    units = p.chain.units
    assert params.best is not None
    per_stage = [sum(u.parameter_bytes for u in units[i:j]) for i, j in params.best.split.bounds]
    for split in all_splits(8, 2):
        other = [sum(u.parameter_bytes for u in units[i:j]) for i, j in split.bounds]
        assert max(per_stage) <= max(other)
    compute = baseline_partition(p, "compute-balanced")
    assert compute.best is not None
    # baselines ignore activations: under memory only the DP is sure to fit
    p.memory_bytes = least_memory_split(p)[0]
    for name in ("param-balanced", "layer-balanced", "compute-balanced"):
        out = baseline_partition(p, name)
        assert out.best is not None
        assert out.best.fits == (max(out.best.peaks) <= p.memory_bytes)
    assert dp_partition(p).best is not None


def test_first_stage_holds_most_under_1f1b() -> None:
    g = chain_graph([LayerSpec(f"h.{i}", 1, 2, 8 * MiB, MiB, MiB) for i in range(8)])
    p = PipelineProblem(g, UnitChain(g), 4, 8, "1f1b", None)
    cand = p.candidate(Split(((0, 2), (2, 4), (4, 6), (6, 8))))
    assert cand.peaks[0] > cand.peaks[1] > cand.peaks[2] > cand.peaks[3]


def test_parameters_of_submodules_go_to_their_block() -> None:
    from planner.core.graph import ModelState, ParameterState

    g = chain_graph([LayerSpec(f"h.{i}", 1, 2, MiB, MiB, 0) for i in range(4)])
    params = [ParameterState(name=f"h.{i}.attn.qkv.weight", module_path=f"h.{i}.attn.qkv",
                             bytes=(i + 1) * MiB) for i in range(4)]  # no gradient node
    g = g.model_copy(update={"model_state": ModelState(parameters=params, optimizer="sgd")})
    p = PipelineProblem(g, UnitChain(g), 2, 2, "1f1b", None)
    split = Split(((0, 1), (1, 4)))
    truth = stage_costs(g, p.partition(split))
    assert [t.model_state_bytes for t in truth] == [2 * MiB, (4 + 6 + 8) * MiB]  # w + grad
    assert [p.costs(i, j, s).model_state_bytes for s, (i, j) in enumerate(split.bounds)] == [
        t.model_state_bytes for t in truth]
