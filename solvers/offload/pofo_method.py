"""The `pofo` method: the remat+offload chain DP (planner.solvers.offload.pofo) on any graph.

A graph built from a chain.json is solved on that exact chain; any other graph is linearised
(planner.solvers.chain.linearize), as Rotor does (planner.solvers.chain.methods.chain_problem). Per
stage, the
offloadable part of ā^s is its saved nodes beyond the joint a^s that own storage (views cannot be
copied on their own). The item sequence becomes actions with `planner.solvers.chain.translate`
(operations) plus `O`/`F`/`P`/`D` for the marks; the event simulator judges the plan. When it
peaks over the budget (a copy out outlasting the next operation, views), the DP runs again at a
budget lowered by the overshoot (up to 4 times). Rotor's own plan (no copies) is judged too and
the faster fitting plan is returned: the DP's space contains Rotor's.

Options: `PofoOptions` (planner.solvers.offload.methods): `slots`, the memory discretisation.
"""

from __future__ import annotations

import time
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.plan import Action, drop, free, offload, prefetch
from planner.sim.ledger import MemoryLedger
from planner.solvers.chain.layout import ChainLayout
from planner.solvers.chain.methods import chain_problem
from planner.solvers.chain.translate import op_actions
from planner.solvers.offload.options import PofoOptions
from planner.solvers.offload.pofo import (
    Item,
    Mark,
    OffloadChain,
    items_text,
    slots_for_time,
    solve_pofo,
)
from planner.solvers.offload.search import (
    Judge,
    Judged,
    better,
    judged_result,
    require_host_tier,
)
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import read_options

RETRIES = 4


def offload_nodes(graph: Graph, layout: ChainLayout) -> list[list[int]]:
    """Per stage (index 0 unused): the saved nodes beyond the joint that can be copied."""
    ledger = MemoryLedger.of(graph)
    out: list[list[int]] = [[]]
    for s in range(1, layout.length + 1):
        joint = set(layout.joint[s])
        # a saved view keeps its base's storage on the device (the base of a view of a view too)
        kept_alive = {ledger.storage_root[v] for v in layout.saved[s] if ledger.is_view(v)}
        out.append(sorted(
            v for v in layout.saved[s]
            if v not in joint and ledger.storage_bytes[v] > 0
            and not ledger.is_view(v) and v not in kept_alive
        ))
    return out


def offload_chain(graph: Graph, judge: Judge, layout: ChainLayout, chain: Any,
                  nodes: list[list[int]]) -> OffloadChain:
    size = graph.index.storage_bytes
    h2d = judge.h2d
    index = graph.index

    def input_reload_ms(s: int) -> float:
        """Copying a^s back; inf (never chosen) when a joint node cannot be copied alone."""
        joint = layout.joint[s]
        if not joint or any(index.node(v).alias_of is not None or size[v] == 0 for v in joint):
            return float("inf")
        return sum(h2d.transfer_ms(size[v]) for v in joint)

    return OffloadChain(
        chain=chain,
        offload_bytes=tuple(sum(size[v] for v in nodes[s]) for s in range(1, chain.length + 1)),
        reload_ms=tuple(sum(h2d.transfer_ms(size[v]) for v in nodes[s])
                        for s in range(1, chain.length + 1)),
        input_reload_ms=tuple(input_reload_ms(s) for s in range(1, chain.length + 1)),
    )


def items_actions(graph: Graph, layout: ChainLayout, nodes: list[list[int]],
                  items: tuple[Item, ...]) -> list[Action]:
    actions = [Action.model_validate({"op": "compute", "node": v}) for v in layout.joint[0]]
    for it in items:
        if isinstance(it, Mark):
            vs = nodes[it.stage] if it.kind in ("O", "F", "P") else list(layout.joint[it.stage])
            if it.kind in ("O", "Oi"):
                actions += [offload(v) for v in vs]
            elif it.kind in ("F", "Fi"):
                actions += [free(v) for v in vs]
            else:
                for v in vs:
                    actions += [prefetch(v), drop(v)]
        else:
            actions += op_actions(graph, layout, it)
    return actions


def chain_length(graph: Graph) -> int:
    """Stages of the graph's chain (its chain.json, or its linearisation)."""
    return chain_problem(graph).chain.length


def pofo_plan(graph: Graph, judge: Judge, slots: int = 200, time_limit_s: float = 10.0,
              with_rotor: bool = True) -> tuple[Judged | None, str, list[str], dict[str, Any]]:
    """The DP's plan judged by the simulator (re-solved at lower budgets while it overshoots),
    beside Rotor's plan without copies when `with_rotor`: (best, source, notes, details)."""
    from planner.solvers.chain.rotor import solve_rotor
    from planner.solvers.chain.translate import translate

    started = time.perf_counter()
    problem = chain_problem(graph)
    nodes = offload_nodes(graph, problem.layout)
    model = offload_chain(graph, judge, problem.layout, problem.chain, nodes)
    notes = list(problem.notes)
    details: dict[str, Any] = {"chain": {"source": problem.source,
                                         "stages": problem.chain.length}}
    best: Judged | None = None
    source = "none"
    budget = judge.budget_bytes
    for _ in range(RETRIES):
        if time.perf_counter() - started > time_limit_s:
            break
        left = time_limit_s - (time.perf_counter() - started)
        sol = solve_pofo(model, budget, slots_for_time(problem.chain.length, left / 2, slots))
        if sol.items is None or sol.replay is None:
            notes.append(f"no sequence of the chain model ({problem.chain.length} stages) fits "
                         f"{budget} bytes")
            break
        got = judge(items_actions(graph, problem.layout, nodes, sol.items))
        details["pofo"] = {"sequence": items_text(sol.items), "dp_cost_ms": sol.dp_cost_ms,
                           "model_peak_bytes": sol.replay.peak_bytes,
                           "model_budget_bytes": budget, "exact_slots": sol.exact_slots}
        if got is None:
            notes.append("the DP's sequence does not run on the graph")
            break
        if got.fits:
            best, source = better(best, got), "pofo-dp"
            break
        best = better(best, got)
        if not got.device_fits:
            budget -= got.peak_bytes - judge.budget_bytes
        else:
            break  # the host overflows: a smaller device budget does not help
    if with_rotor:
        rot = solve_rotor(problem.chain, judge.budget_bytes, 500, refine=2)
        if rot.ops is not None:
            plain = judge(translate(graph, problem.layout, rot.ops))
            if plain is not None and plain.fits and better(best, plain) is plain:
                best, source = plain, "rotor"
                notes.append("Rotor's plan without copies is at least as fast here")
    return best, source, notes, details


def pofo_method(request: SolveRequest) -> MethodResult:
    resources = require_host_tier(request.resources, "pofo")
    try:
        slots = int(read_options(PofoOptions, request.options).slots)
    except (TypeError, ValueError):
        raise InputError("option slots: must be an integer ≥ 1") from None
    if slots < 1:
        raise InputError(f"option slots {slots}: must be an integer ≥ 1")
    judge = Judge(request.graph, request.budget_bytes, resources)
    best, source, notes, details = pofo_plan(request.graph, judge, slots, request.time_limit_s)
    return judged_result(request, judge, best, f"pofo:{source}", notes, details)
