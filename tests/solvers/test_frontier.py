"""The stage knapsack's frontier: the Pareto filter against brute force, the cut, and the
screen that drops states no completion can fit (never one that can)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage
from planner.core.resources import Resources
from planner.engine.partition import make_problem
from planner.sim.rank_memory import mixed_stage_peak_bytes, one_stage_peak_bytes
from planner.sim.stage_costs import stage_costs, stage_of_nodes
from planner.sim.stage_policies import stage_facts
from planner.solvers.pipeline import frontier, stage_items, stage_menu

HOST = Resources(host_memory_bytes=2**36, h2d="pcie-gen5-x16", device_count=2, microbatches=8)

states = st.lists(st.builds(frontier.State, st.integers(-3, 3), st.integers(0, 3),
                            st.integers(0, 3), st.integers(0, 5).map(float),
                            st.just(()), st.integers(0, 2)), max_size=40)


def _bytes(x: frontier.State) -> tuple[int, int, int, int]:
    return (x.delta_bytes, x.offload_bytes, x.largest_bytes, x.weight_rerun_bytes)


@settings(max_examples=300, deadline=None)
@given(states)
def test_the_filter_keeps_exactly_the_states_no_earlier_one_matches(given_states) -> None:
    ordered = sorted(given_states, key=frontier.time_order)
    expected = [x for i, x in enumerate(ordered)
                if not any(all(a <= b for a, b in zip(_bytes(y), _bytes(x), strict=True))
                           for y in ordered[:i])]
    assert [_bytes(x) + (x.ms,) for x in frontier.pareto(given_states)] == \
        [_bytes(x) + (x.ms,) for x in expected]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(-10**6, 10**6)), min_size=1,
                max_size=4), st.integers(-10**6, 10**7), st.integers(-10**6, 0),
       st.booleans())
def test_the_screens_bound_is_the_last_delta_that_fits(pieces, cap, least, steps) -> None:
    """The most saved delta whose peak fits, for peaks made of linear pieces (their max) or
    of steps, found with few peak evaluations, equals the brute-force answer."""
    calls = []

    def peak_of(delta: int, largest: int, reruns: int) -> int:
        calls.append(delta)
        if steps:  # non-decreasing, not convex
            return sum(max(0, (delta - b) // 1000) for _, b in pieces) + largest
        return max(a * delta + b for a, b in pieces) + largest

    screen = frontier.FitScreen(peak_of, cap, [least, 0], 0)
    got = screen._most_delta(5, 0)
    if peak_of(least, 5, 0) > cap:
        assert got == least - 1
    elif got != frontier.EVERYTHING_FITS:
        assert peak_of(got, 5, 0) <= cap < peak_of(got + 1, 5, 0)
    assert len(calls) < 250


def test_a_cut_frontier_keeps_the_plans_that_offload_nothing() -> None:
    """Offloading states that look faster and smaller than every local one fill both halves
    of a cut; the local ones (the frontier without a host tier) are kept all the same."""
    offloading = [frontier.State(1000 - k, 10 + k, 0, 0.1 * k, ("offload",))
                  for k in range(40)]
    local = [frontier.State(5000 - k, 0, 0, 10.0 + k, ("recompute",)) for k in range(6)]
    kept = frontier.cut(sorted(offloading + local, key=lambda x: x.ms), 4, 10)
    assert all(x in kept for x in local)
    assert [x.ms for x in kept] == sorted(x.ms for x in kept)
    many = [frontier.State(5000 - k, 0, 0, 10.0 + k, ("recompute",)) for k in range(30)]
    kept = frontier.cut(sorted(offloading + many, key=lambda x: x.ms), 4, 10)
    assert sum(1 for x in kept if not x.offload_bytes) == 10


@pytest.fixture(scope="module")
def op_gpt() -> Graph:
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    return trace(model, inputs).graph


@pytest.mark.parametrize(("s", "mixes"), [(0, False), (0, True), (1, False)])
def test_the_screen_never_drops_a_state_some_fitting_plan_extends(op_gpt: Graph, s: int,
                                                                   mixes: bool) -> None:
    """Every policy choice of the stage's blocks (op-level options included): at a cap where
    some plans fit and others do not, each prefix of a plan that fits alone, or (`mixes`) in
    any mix with another plan (1 to k - 1 of every k micro-batches each), passes the screen,
    and the screen drops some prefixes of the others."""
    mods = [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]]
    part = Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(mods)])
    nodes = [v for v, i in stage_of_nodes(op_gpt, part).items() if i == s]
    facts, base = stage_facts(op_gpt, nodes, mods[s]), stage_costs(op_gpt, part)[s]
    p = make_problem(op_gpt, devices=2, memory_bytes=None, microbatches=8, schedule="1f1b",
                     resources=HOST)
    # mixes: four in flight (the first stage of four ranks), so 1 and k - 1 slots differ
    k, m = (4 if mixes else p.inflight[s]), p.microbatches
    figures = stage_items.items(p, facts)
    forward = stage_items.forward_bytes(p, facts)
    menus = [("keep", "recompute", "offload", *(f"op{j}" for j in range(len(it.ops))))
             for it in figures]
    blocks = [i for i, u in enumerate(facts.units) if u.name.startswith("h.")]
    choices = []
    for picked in itertools.product(*(menus[i] for i in blocks)):
        choice = ["keep"] * len(figures)
        for i, policy in zip(blocks, picked, strict=True):
            choice[i] = policy
        choices.append(tuple(choice))
    costs = {c: stage_menu.bound_costs(base, forward, stage_menu.additive_state(figures, c))
             for c in choices}
    alone = {c: one_stage_peak_bytes(x, k, microbatches=m) for c, x in costs.items()}
    # mixes fit far more: their cap is near the least a plan alone needs
    cap = sorted(alone.values())[len(alone) // (20 if mixes else 2)]
    fitting = {c for c in choices if alone[c] <= cap}
    if mixes:  # light in k - q of every k micro-batches, heavy in q
        fitting |= {c for a, b in itertools.product(choices, choices) for q in range(1, k)
                    if mixed_stage_peak_bytes(costs[a], costs[b], k, q, m) <= cap
                    for c in (a, b)}
    assert 0 < len(fitting) < len(choices)
    screen = stage_menu._fit_screen(p, base, forward, k, cap, 2**36, figures, True, mixes)
    dropped = 0
    for choice in choices:
        for n in range(1, len(figures) + 1):
            kept = screen.keeps(stage_menu.additive_state(figures[:n], choice[:n]), n)
            assert kept or choice not in fitting, (choice, n)
            dropped += not kept
    assert dropped > 0
