"""The module-level chain DP as a candidate of auto's portfolio (op-level actions).

rotor on a linearisation of the graph, each F_all choosing how much of its segment to keep
(`planner.solvers.chain.saving`), translated to op-level actions and offered like any other
plan: on stacks of identical blocks op-level auto is then never worse than the chain DP.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.core.graph import Graph, Phase
from planner.core.plan import Action, PlanStatus

Offer = Callable[[list[Action] | None, str], bool]  # (plan, source) -> became the best
COARSE_SEGMENTS = 100  # large training graphs: a chain DP this long first (~8x faster than 200)
# after the first phase, when time allows, a finer DP than the default (twice the saving levels,
# three times the slots; about FINE_CHAIN_COST times as long): llama32 at 0.6 +18.1 % vs +20.5 %
FINE_CHAIN: dict[str, object] = {"saving_levels": 20, "slots": 1500}
FINE_CHAIN_COST = 3.0  # measured 1.7-2.4


def is_training(graph: Graph) -> bool:
    return any(node.phase is Phase.backward for node in graph.nodes)


def chain_candidate(graph: Graph, budget_bytes: int, offer: Offer, threads: int,
                     deadline: float, notes: list[str], timings: dict[str, float],
                     refine_until: float | None = None) -> bool | None:
    """The module-level chain DP (rotor on a linearisation, each F_all choosing how much of
    its segment to keep: `planner.solvers.chain.saving`) as an op-level candidate; whether it became
    the best plan (None: not finished by `deadline`). With `refine_until` (large graphs), a
    chain of COARSE_SEGMENTS first where the linearisation is longer: the DP is cubic in the
    segments, and the 200-segment one alone took 3.1 s of a 4.8 s phase at 5,001 nodes, past
    it on a slower run."""
    from planner.solvers.chain.methods import chain_problem

    found: bool | None = None
    if refine_until is not None:
        try:
            length = chain_problem(graph).chain.length
        except Exception as e:  # noqa: BLE001 (a graph the chain model cannot take: skip it)
            notes.append(f"chain DP skipped: {type(e).__name__}: {e}")
            return False
        if length > COARSE_SEGMENTS:
            found = _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, None,
                              {"segments": COARSE_SEGMENTS, "refine": 0})
    began = time.perf_counter()
    plain = _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, refine_until, {})
    if plain is None:
        return found
    timings["chain_dp_s"] = time.perf_counter() - began
    return bool(found or plain)


def finer_chain_candidate(graph: Graph, budget_bytes: int, offer: Offer, threads: int,
                          deadline: float, notes: list[str], chain_dp_s: float) -> bool | None:
    """The chain DP again with FINE_CHAIN (more saving levels and slots) when it fits before
    `deadline` by the first DP's time `chain_dp_s`; whether it became the best plan."""
    if time.perf_counter() + FINE_CHAIN_COST * chain_dp_s > deadline:
        return None
    return _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, None, FINE_CHAIN)


def _chain_dp(graph: Graph, budget_bytes: int, offer: Offer, threads: int, deadline: float,
              notes: list[str], refine_until: float | None, options: dict[str, object]
              ) -> bool | None:
    from planner.solvers.chain.methods import rotor
    from planner.solvers.request import SolveRequest

    try:
        now = time.perf_counter()
        result = rotor(SolveRequest(graph, budget_bytes, time_limit_s=max(0.1, deadline - now),
                                    threads=threads, options={"saving": True, **options}),
                       refine_within_s=None if refine_until is None else refine_until - now)
    except Exception as e:  # noqa: BLE001 (a graph the chain model cannot take: skip it)
        notes.append(f"chain DP skipped: {type(e).__name__}: {e}")
        return False
    if result.actions is None and result.status is PlanStatus.timeout:
        return None
    return offer(result.actions, "chain-dp")
