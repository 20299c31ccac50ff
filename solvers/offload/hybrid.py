"""Offloading combined with recomputation on any graph, and `improve_with_offload` for auto.

A recomputation plan at a budget above the target recomputes less; offloading the windows it
leaves brings its peak down to the target. `remat_offload_search` tries offloading on store-all
(both Beaumont-style orders, planner.solvers.offload.heuristics), the pofo chain DP, the offload
MILP
(small graphs) and remat plans at budgets between the target and store-all's peak (greedy
eviction, Chen's greedy segments) brought down by offloading, and keeps the fastest plan by the
simulator's makespan. The given pure-remat plan is a candidate too: nothing returned is slower
than it (remat is the special case with no copies).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.core.resources import Resources
from planner.sim.simulator import simulate
from planner.solvers.baselines import chen_greedy, store_all
from planner.solvers.offload.heuristics import bandwidth_first, beaumont
from planner.solvers.offload.search import Judge, Judged, better

INTERMEDIATE_FRACTIONS = (0.75, 0.5, 0.25)  # of the way from the target budget to store-all
HIDEABLE_FRACTIONS = (1.0, 0.5, 0.25)  # of the bytes the link can hide under forward compute
MILP_MAX_NODES = 150  # the offload MILP joins the search up to here


def hideable_bytes(graph: Graph, resources: Resources) -> int:
    """Bytes the d2h link can carry while the forward pass computes: what offloading can take
    off the device by the backward pass without waits (Beaumont et al.'s bandwidth cap)."""
    from planner.core.graph import Phase

    assert resources.d2h is not None
    forward_ms = sum(n.compute_ms for n in graph.nodes if n.phase is not Phase.backward)
    return int(resources.d2h.bandwidth_bytes_per_s * forward_ms / 1e3)


def remat_levels(budget_bytes: int, top_bytes: int, hideable: int) -> list[tuple[str, int]]:
    """Budgets to plan recomputation at before offloading down to `budget_bytes`: the target
    plus what the link can hide (all, half, a quarter), then fractions of the way to store-all."""
    levels: list[tuple[str, int]] = []
    for f in HIDEABLE_FRACTIONS:
        levels.append((f"+{f:g}·hideable", budget_bytes + int(f * hideable)))
    for f in INTERMEDIATE_FRACTIONS:
        levels.append((f"{f:g}·to-store-all", int(budget_bytes + f * (top_bytes - budget_bytes))))
    out: list[tuple[str, int]] = []
    for name, level in levels:
        if budget_bytes < level < top_bytes and all(abs(level - b) > 0.02 * (top_bytes -
                                                        budget_bytes) for _, b in out):
            out.append((name, level))
    return out


def remat_bases(graph: Graph, budget_bytes: int, resources: Resources,
                deadline: float) -> Iterator[tuple[str, list[Action]]]:
    """Compute/free plans that recompute less than a plan at `budget_bytes` would: remat plans
    at budgets between it and store-all's peak (`remat_levels`; auto's first plans within a
    short limit, greedy eviction, Chen's greedy segments), generated while time is left."""
    from planner.solvers.remat.auto import solve_auto
    from planner.solvers.remat.greedy import greedy_eviction

    top = simulate(graph, store_all(graph)).peak_bytes
    for name, level in remat_levels(budget_bytes, top, hideable_bytes(graph, resources)):
        if time.perf_counter() >= deadline:
            return
        left = max(0.3, min(2.0, (deadline - time.perf_counter()) / 4))
        quick = solve_auto(graph, level, time_limit_s=left).actions
        if quick is not None:
            yield f"auto@{name}", quick
        if time.perf_counter() >= deadline:
            return
        evicted = greedy_eviction(graph, level, time_limit_s=max(0.05, left / 2))
        if evicted is not None:
            yield f"greedy-eviction@{name}", evicted
        if time.perf_counter() < deadline:
            yield f"chen-greedy@{name}", chen_greedy(graph, level)


def remat_offload_search(
    graph: Graph,
    budget_bytes: int,
    resources: Resources,
    deadline: float,
    remat_actions: Sequence[Action] | None = None,
) -> tuple[Judged | None, str]:
    """The fastest fitting plan found, and where it came from. Phases, each within its share
    of the time left: offloading on store-all (Beaumont-style, 25 %), the pofo chain DP (when
    its own estimate fits 35 %), remat plans at larger budgets brought down by offloading (40 %
    each, greedy eviction at 3/4 of the way to store-all first), then on small graphs the
    offload MILP hinted with the store-all plan (the rest)."""
    judge = Judge(graph, budget_bytes, resources)
    best: Judged | None = None
    source = "none"

    def offer(found: Judged | None, name: str) -> None:
        nonlocal best, source
        if found is not None and found.fits and better(best, found) is found:
            best, source = found, name

    def share(fraction: float) -> float:
        return max(0.05, (deadline - time.perf_counter()) * fraction)

    if remat_actions is not None:
        offer(judge(list(remat_actions)), "remat")
    full = store_all(graph)
    on_full = beaumont(judge, full, time.perf_counter() + share(0.25)).best
    offer(on_full, "store-all+offload")
    from planner.solvers.offload.pofo import pofo_floor_s
    from planner.solvers.offload.pofo_method import chain_length, pofo_plan

    if pofo_floor_s(chain_length(graph)) <= share(0.35):
        dp, how, _, _ = pofo_plan(graph, judge, time_limit_s=share(0.35), with_rotor=False)
        offer(dp, f"pofo:{how}")
    seen: set[str] = set()
    for name, base in remat_bases(graph, budget_bytes, resources, deadline - share(0.2)):
        text = " ".join(map(str, base))
        if text in seen or time.perf_counter() >= deadline:
            continue
        seen.add(text)
        if best is not None and simulate(graph, base).compute_cost >= best.makespan_ms:
            continue  # its compute alone is no faster than the best plan
        offer(bandwidth_first(judge, base, time.perf_counter() + share(0.4)), name)
    if len(graph.nodes) <= MILP_MAX_NODES and deadline - time.perf_counter() > 0.2:
        from planner.solvers.offload.milp import milp_plan

        hint = on_full if on_full is not None and on_full.fits else None
        exact, how, _ = milp_plan(judge, full, hint, share(1.0))
        offer(exact, f"milp:{how}")
    return best, source


def improve_with_offload(
    graph: Graph,
    budget_bytes: int,
    resources: Resources | None,
    remat_actions: Sequence[Action] | None,
    deadline_s: float,
) -> list[Action] | None:
    """A plan with host copies that the simulator says is strictly faster (makespan) than
    `remat_actions` within `budget_bytes` and the host memory of `resources`; None when there is
    no host tier or nothing faster was found. `remat_actions` None (no pure-remat plan fits):
    any plan found within both budgets. `deadline_s`: seconds allowed for the search (from the
    call)."""
    if resources is None or not resources.has_host_tier or resources.h2d is None:
        return None
    deadline = time.perf_counter() + max(0.0, deadline_s)
    judge = Judge(graph, budget_bytes, resources)
    reference = judge(list(remat_actions)) if remat_actions is not None else None
    found, source = remat_offload_search(graph, budget_bytes, resources, deadline,
                                         remat_actions)
    if found is None or source == "remat" or not found.fits:
        return None
    if reference is not None and reference.fits and \
            found.makespan_ms >= reference.makespan_ms * (1 - 1e-9):
        return None
    return found.actions
