"""The whole-job search's proposals (planner.solvers.pipeline.proposals): the proxy stage cost
and the boundary moves that go on past a local optimum."""

from __future__ import annotations

import math

import pytest

from planner.core.graph import Graph
from planner.engine.partition import make_problem
from planner.sim.stage_costs import one_stage_peak_bytes
from planner.solvers.pipeline import whole_job
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.pipeline.dp import least_memory_split, neighbours
from planner.solvers.pipeline.policy_splits import WholeJob
from planner.solvers.pipeline.problem import PipelineProblem, Split
from planner.solvers.pipeline.proposals import Bounds, ProxyCosts, propose
from planner.solvers.pipeline.whole_job import whole_job_partition


@pytest.fixture(scope="module")
def gpt() -> Graph:
    """A GPT-8 as module-level chain figures (torch-free)."""
    return chain_graph(transformer_layers(8, 1024, 16, 32000, 512, 2, tflops=10),
                       optimizer="adam")


def problem(g: Graph, level: float | None, ranks: int = 4) -> PipelineProblem:
    memory = None
    if level is not None:
        plain = make_problem(g, devices=ranks, memory_bytes=None, microbatches=8,
                             schedule="1f1b")
        memory = int(least_memory_split(plain)[0] * level)
    return make_problem(g, devices=ranks, memory_bytes=memory, microbatches=8,
                        schedule="1f1b")


def test_the_proxy_adds_nothing_where_all_keep_fits_and_more_as_memory_shrinks(
        gpt: Graph) -> None:
    roomy, tight = problem(gpt, 1.0), problem(gpt, 0.8)
    proxies = [ProxyCosts(p, WholeJob(p).cap, WholeJob(p).facts) for p in (roomy, tight)]
    fits_some = needs_some = 0
    for s in range(roomy.stage_count):
        for i in range(roomy.length):
            for j in range(i + 1, roomy.length + 1):
                base = roomy.costs(i, j, s)
                keeps = one_stage_peak_bytes(base, roomy.inflight[s], microbatches=8) \
                    <= WholeJob(roomy).cap
                loose, small = (x.added_ms(i, j, s) for x in proxies)
                assert (loose == 0.0) == keeps
                if loose is None:
                    assert small is None  # less memory: nothing fits either
                elif small is not None:
                    assert small >= loose - 1e-12
                fits_some += keeps
                needs_some += loose is not None and loose > 0
    assert fits_some and needs_some


def test_moves_go_on_from_the_next_fastest_split_past_a_local_optimum(gpt: Graph) -> None:
    """A synthetic step: each split's distance to a target split, with the DP's proposal a
    local optimum (every move of it is slower). The moves leave it from the next fastest split
    judged and reach the target."""
    p = problem(gpt, None)
    proxy = ProxyCosts(p, math.inf, WholeJob(p).facts)
    proposal = tuple(_dp_proposal(p, proxy))
    target: Bounds = ((0, 2), (2, 5), (5, 7), (7, p.length))  # several moves away
    assert proposal != target and target not in {n.bounds for n in neighbours(Split(proposal))}

    def step(bounds: Bounds) -> float:
        if bounds == proposal:
            return 10.0  # a local optimum: every move of it is slower
        return 11.0 + sum(abs(a[0] - b[0]) for a, b in zip(bounds, target, strict=True))

    fitting: dict[Bounds, float] = {}
    tried: list[Bounds] = []
    best: list[Bounds] = []

    def try_bounds(bounds: Bounds, name: str) -> None:
        tried.append(bounds)
        fitting[bounds] = step(bounds)
        if not best or step(bounds) < step(best[0]):
            best[:] = [bounds]

    class Best:
        def __init__(self, bounds: Bounds) -> None:
            self.split = Split(bounds)

    current: dict[Bounds, Best] = {}

    def now() -> Best | None:
        if not best:
            return None
        return current.setdefault(best[0], Best(best[0]))

    propose(p, proxy, try_bounds, now, lambda: math.inf, lambda: fitting)  # type: ignore[arg-type]
    assert tried[0] == proposal
    assert all(n.bounds in tried for n in neighbours(Split(proposal)))
    assert target in tried


def _dp_proposal(p: PipelineProblem, proxy: ProxyCosts) -> list[tuple[int, int]]:
    from planner.solvers.pipeline.chain_dp import minmax_dp

    found = minmax_dp(p.length, p.stage_count, proxy.stage_ms)
    assert found is not None
    return found[1]


def test_proposals_plan_where_splits_are_too_many_to_enumerate(gpt: Graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p = problem(gpt, 0.9)
    enumerated = whole_job_partition(p, time_limit_s=5)
    monkeypatch.setattr(whole_job, "ENUMERATE_LIMIT", 0)
    proposed = whole_job_partition(problem(gpt, 0.9), time_limit_s=5)
    assert proposed.best is not None and proposed.best.fits
    assert any("DP proposals" in n for n in proposed.notes)
    assert enumerated.best is not None and enumerated.best.simulation is not None
    assert proposed.best.simulation is not None
    # the proposals reach the enumeration's plan on this small chain
    assert proposed.best.simulation.makespan_ms <= enumerated.best.simulation.makespan_ms * 1.01
