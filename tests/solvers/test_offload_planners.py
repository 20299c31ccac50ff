"""Offload planners (planner.solvers.offload): plans within device and host budgets per the event
simulator, the POFO DP against brute force, remat+offload never slower than pure remat, and the
MILP's gap reported only for its own space."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from planner.core.errors import InputError
from planner.core.plan import ActionOp
from planner.core.resources import resources_preset
from planner.core.synthetic import training_graph
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all
from planner.solvers.chain.model import Chain, Stage
from planner.solvers.chain.sequence import Op, OpKind
from planner.solvers.offload import methods
from planner.solvers.offload.hybrid import improve_with_offload
from planner.solvers.offload.pofo import Item, Mark, OffloadChain, replay, solve_pofo
from planner.solvers.remat.auto import solve_auto
from planner.solvers.request import SolveRequest

HOST = 2**36
GRAPH = training_graph(10, skip=3, seed=5)
STORE_ALL_PEAK = simulate(GRAPH, store_all(GRAPH)).peak_bytes


def machine(host: int | None = HOST, preset: str = "h100-pcie-gen4"):
    return resources_preset(preset).model_copy(update={"host_memory_bytes": host})


def request(fraction: float, host: int | None = HOST, **options) -> SolveRequest:
    return SolveRequest(graph=GRAPH, budget_bytes=int(STORE_ALL_PEAK * fraction),
                        resources=machine(host), time_limit_s=3.0, options=options)


PLANNERS = ["offload_all", "offload_greedy", "offload_beaumont", "offload_remat",
            "offload_milp", "pofo"]


@pytest.mark.parametrize("name", PLANNERS)
@pytest.mark.parametrize("fraction", [0.8, 0.6])
def test_plans_fit_device_and_host_per_simulator(name: str, fraction: float) -> None:
    req = request(fraction)
    r = getattr(methods, name)(req)
    if r.actions is None:  # the baselines users have today may miss the budget, and the
        # chain DP where the linearised chain is too coarse (Rotor finds nothing either)
        if name == "pofo":
            from planner.solvers.chain.methods import rotor

            assert rotor(req).actions is None
            return
        assert name in ("offload_all", "offload_greedy"), r.notes
        assert r.notes and "over the budget" in r.notes[-1]
        return
    sim = simulate(GRAPH, r.actions, req.resources)
    assert sim.peak_bytes <= req.budget_bytes
    assert sim.host_peak_bytes <= HOST
    assert r.details["makespan_ms"] == pytest.approx(sim.makespan_ms)


def test_pofo_on_a_chain_beats_rotor_with_copies() -> None:
    from planner.solvers.chain.methods import rotor

    graph = training_graph(16, seed=3)
    peak = simulate(graph, store_all(graph)).peak_bytes
    req = SolveRequest(graph=graph, budget_bytes=int(0.5 * peak), resources=machine(),
                       time_limit_s=3.0)
    r = methods.pofo(req)
    assert r.actions is not None
    sim = simulate(graph, r.actions, req.resources)
    assert sim.peak_bytes <= req.budget_bytes and sim.host_peak_bytes <= HOST
    plain = rotor(req)
    assert plain.actions is not None
    assert sim.makespan_ms < simulate(graph, plain.actions).compute_cost
    assert any(a.op is ActionOp.offload for a in r.actions)


def test_pofo_on_a_module_level_chain_fits_and_uses_copies() -> None:
    from planner.solvers.chain.layout import chain_graph
    from planner.solvers.chain.model import homogeneous_chain

    chain = homogeneous_chain(12, forward_ms=2.0, backward_ms=4.0, output_bytes=2**24,
                              saved_bytes=3 * 2**24)
    graph, _ = chain_graph(chain)
    peak = simulate(graph, store_all(graph)).peak_bytes
    req = SolveRequest(graph=graph, budget_bytes=int(0.45 * peak), resources=machine(),
                       time_limit_s=3.0)
    r = methods.pofo(req)
    assert r.actions is not None and r.details["chain"]["source"] == "chain.json"
    sim = simulate(graph, r.actions, req.resources)
    assert sim.peak_bytes <= req.budget_bytes and sim.host_peak_bytes <= HOST
    assert any(a.op is ActionOp.prefetch for a in r.actions)


def test_offload_plans_move_memory_and_beat_store_all_peak() -> None:
    req = request(0.6)
    r = methods.offload_beaumont(req)
    assert r.actions is not None
    ops = {a.op for a in r.actions}
    assert {ActionOp.offload, ActionOp.prefetch, ActionOp.drop} <= ops
    sim = simulate(GRAPH, r.actions, req.resources)
    assert sim.peak_bytes < STORE_ALL_PEAK and sim.host_peak_bytes > 0


def test_no_host_tier_is_one_input_error() -> None:
    for host in (None, 0):
        with pytest.raises(InputError, match="host tier"):
            methods.offload_greedy(request(0.6, host=host))
    bare = SolveRequest(graph=GRAPH, budget_bytes=STORE_ALL_PEAK)
    with pytest.raises(InputError, match="host tier"):
        methods.pofo(bare)


def test_host_too_small_names_least_host_memory() -> None:
    r = methods.offload_beaumont(request(0.6, host=1024))
    assert r.actions is None
    need = r.details["least_host_memory_bytes"]
    assert need > 1024 and any(f"give at least {need}" in n for n in r.notes)
    again = methods.offload_beaumont(request(0.6, host=need))
    assert again.actions is not None


def test_offload_remat_never_slower_than_pure_remat() -> None:
    for fraction in (0.8, 0.5):
        req = request(fraction)
        remat = solve_auto(GRAPH, req.budget_bytes, time_limit_s=1.0)
        if remat.actions is None:
            continue
        remat_ms = simulate(GRAPH, remat.actions).compute_cost
        found = improve_with_offload(GRAPH, req.budget_bytes, req.resources, remat.actions, 1.0)
        if found is not None:
            sim = simulate(GRAPH, found, req.resources)
            assert sim.makespan_ms < remat_ms and sim.peak_bytes <= req.budget_bytes
            assert sim.host_peak_bytes <= HOST
        r = methods.offload_remat(req)
        assert r.actions is not None
        assert simulate(GRAPH, r.actions, req.resources).makespan_ms <= remat_ms + 1e-9


def test_improve_without_host_tier_is_none() -> None:
    plan = store_all(GRAPH)
    assert improve_with_offload(GRAPH, STORE_ALL_PEAK, None, plan, 1.0) is None
    assert improve_with_offload(GRAPH, STORE_ALL_PEAK, machine(0), plan, 1.0) is None


def test_milp_gap_is_for_its_own_space() -> None:
    r = methods.offload_milp(request(0.8))
    model = r.details["model"]
    if model["bound_ms"] is not None and model["objective_ms"] is not None:
        assert model["bound_ms"] <= model["objective_ms"] + 1e-9
        assert model["gap"] >= 0
    assert r.lower_bound is None  # no bound on every plan is claimed
    assert any("only in its space" in n for n in r.notes)


# -- the POFO DP against brute force on tiny chains ------------------------------------------
def tiny_chain(seed: int, length: int) -> OffloadChain:
    import random

    rng = random.Random(seed)
    stages = []
    for _ in range(length):
        x = rng.randint(1, 3)
        stages.append(Stage(forward_ms=float(rng.randint(1, 4)),
                            backward_ms=float(rng.randint(1, 5)), output_bytes=x,
                            saved_bytes=x + rng.randint(0, 3), grad_input_bytes=rng.randint(1, 3)))
    chain = Chain(stages=tuple(stages), input_bytes=1)
    extra = tuple(s.saved_bytes - s.output_bytes for s in stages)
    return OffloadChain(chain, extra, tuple(rng.choice([0.5, 2.0, 6.0]) for _ in stages),
                        tuple(rng.choice([0.5, 3.0]) for _ in stages))


def sequences(p: OffloadChain, s: int, t: int) -> Iterator[list[Item]]:
    """Every sequence of the DP's class for (s, t)."""
    if s == t:
        yield [Op(OpKind.f_all, s), Op(OpKind.backward, s)]
        return
    for off_e, off_in in itertools.product((0, 1), (0, 1)):
        if (off_e and p.e(s) == 0) or (off_in and s < 2):
            continue
        for child in sequences(p, s + 1, t):
            yield [*([Mark("Oi", s - 1)] if off_in else []), Op(OpKind.f_all, s),
                   *([Mark("O", s)] if off_e else []), *([Mark("Fi", s - 1)] if off_in else []),
                   child[0], *([Mark("F", s)] if off_e else []), *child[1:-1],
                   *([Mark("P", s)] if off_e else []), *([Mark("Pi", s - 1)] if off_in else []),
                   child[-1], Op(OpKind.backward, s)]
    for split in range(s + 1, t + 1):
        head = [Op(OpKind.f_ck, s), *(Op(OpKind.f_none, k) for k in range(s + 1, split))]
        for first in sequences(p, split, t):
            for second in sequences(p, s, split - 1):
                yield [*head, *first, Op(OpKind.discard, split - 1), *second]


@pytest.mark.parametrize("seed", range(6))
def test_pofo_dp_is_optimal_against_brute_force(seed: int) -> None:
    p = tiny_chain(seed, 4)
    runs = [replay(p, seq) for seq in sequences(p, 1, 4)]
    lowest = min(r.peak_bytes for r in runs)
    highest = max(r.peak_bytes for r in runs)
    for budget in range(lowest, highest + 1):
        fits = [r.cost_ms for r in runs if r.peak_bytes <= budget]
        sol = solve_pofo(p, budget, slots=1000)
        assert sol.exact_slots
        assert sol.replay is not None and sol.dp_cost_ms is not None
        assert sol.replay.peak_bytes <= budget
        assert sol.replay.cost_ms == pytest.approx(sol.dp_cost_ms)
        assert sol.dp_cost_ms == pytest.approx(min(fits)), (seed, budget)
    assert solve_pofo(p, lowest - 1, slots=1000).items is None


def test_exact_model_on_cpsat_fits_and_its_grid_keeps_rows_tight() -> None:
    from planner.solvers.offload.integral import integral_model, original_values
    from planner.solvers.remat.linear import INF, LinearModel

    req = request(0.6, backend="cpsat")
    r = methods.offload_milp(req)
    assert r.actions is not None and r.details["model"]["backend"] == "cpsat"
    sim = simulate(GRAPH, r.actions, req.resources)
    assert sim.peak_bytes <= req.budget_bytes and sim.host_peak_bytes <= HOST
    # time ≥ 0.3337 · fraction (a reload): on grids of 1/1000 and 1/100 the fraction's
    # coefficient rounds so that every integral solution satisfies the original row
    m = LinearModel()
    t, f = m.var("TIME_0", 0.5, INF, False), m.var("MOVE_0", 0, 1, False)
    m.row([t, f], [1.0, -0.3337], 0, INF)
    m.row([f], [1.0], 1, 1)
    m.objective[t] = 1.0
    grid = {t: 1000, f: 100}
    z = integral_model(m, grid)
    assert z.rows[0][1] == [100.0, -334.0] and z.upper[t] >= 334  # 0.3337 ms · 1000 · 100 / 100
    least = max(z.lower[t], -(-334 * 100 // 100))
    assert original_values([least, 100], grid)[0] >= 0.3337
