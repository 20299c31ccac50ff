"""Choosing windows to offload on a base plan, every candidate judged by the event simulator.

`Judge` replays a plan on the resources with the host capacity lifted, so that a plan that
parks too much on the host still yields its host peak (the least host memory it needs), and
then holds the peaks against the device budget and the real host capacity itself.

`fit_with_offloads` is the common engine of the heuristics: offload the windows of a base plan
in a heuristic order, the shortest prefix that fits (binary search; the full set is tried when
the search misses), then bring windows back one at a time where the plan still fits and is not
slower, then stretch prefetch leads. Every step is a simulation; a deadline bounds the work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.plan import Action, PlanStatus
from planner.core.resources import Link, Resources
from planner.sim.free_placement import place_frees
from planner.sim.simulator import PlanError
from planner.solvers.offload.schedule import (
    Window,
    WindowKey,
    find_windows,
    jit_positions,
    with_offloads,
)
from planner.solvers.request import MethodResult, SolveRequest

UNLIMITED_HOST_BYTES = 2**62
PREFETCH_SLACKS = (1.0, 1.3, 2.0, 3.0)  # prefetch lead stretch factors tried at the end
# when every window offloaded with just-in-time reloads still peaks too high: later reloads
# (0: right before the use, the whole copy exposed) hold the device memory for less time
FALLBACK_SLACKS = (1.0, 0.5, 0.0)
MEMO_ENTRIES = 512


@dataclass(frozen=True)
class Judged:
    """A plan and what the simulator says of it."""

    actions: list[Action]
    peak_bytes: int
    host_peak_bytes: int
    makespan_ms: float
    exposed_ms: float
    compute_ms: float
    transfer_ms: float
    device_fits: bool
    host_fits: bool

    @property
    def fits(self) -> bool:
        return self.device_fits and self.host_fits

    def __str__(self) -> str:
        return (f"peak {self.peak_bytes} B, host {self.host_peak_bytes} B, makespan "
                f"{self.makespan_ms:.4f} ms (exposed {self.exposed_ms:.4f})")


def require_host_tier(resources: Resources | None, method: str) -> Resources:
    """The resources, or one InputError line when there is no host to offload to."""
    if resources is None or not resources.has_host_tier or resources.h2d is None \
            or resources.d2h is None:
        raise InputError(
            f"method {method}: offloading needs resources with a host tier (host_memory_bytes > 0 "
            "and h2d/d2h links), e.g. --resources h100-pcie-gen5 with host_memory_bytes set; "
            "without one use a recomputation method (auto, rotor, milp)"
        )
    return resources


class Judge:
    """Simulates plans of one graph on one machine against one device budget."""

    def __init__(self, graph: Graph, budget_bytes: int, resources: Resources) -> None:
        self.graph = graph
        self.budget_bytes = budget_bytes
        self.capacity = resources.host_memory_bytes or 0
        self.resources = resources.model_copy(update={"host_memory_bytes": UNLIMITED_HOST_BYTES})
        self.simulations = 0
        # plan_for's memo: (id of the base, window keys, slack) -> (the base, its judgement)
        self.memo: dict[tuple[int, frozenset[WindowKey], float],
                        tuple[Sequence[Action], Judged | None]] = {}

    @property
    def h2d(self) -> Link:
        assert self.resources.h2d is not None
        return self.resources.h2d

    def __call__(self, actions: list[Action]) -> Judged | None:
        """The plan with its frees placed where their copies end (planner.sim.free_placement),
        judged; None when the plan cannot run (the simulator's error)."""
        self.simulations += 1
        try:
            placed, sim = place_frees(self.graph, actions, self.resources)
        except PlanError:
            return None
        return Judged(
            actions=placed,
            peak_bytes=sim.peak_bytes,
            host_peak_bytes=sim.host_peak_bytes,
            makespan_ms=sim.makespan_ms,
            exposed_ms=sim.exposed_transfer_ms,
            compute_ms=sim.compute_ms,
            transfer_ms=sim.transfer_ms,
            device_fits=sim.peak_bytes <= self.budget_bytes,
            host_fits=sim.host_peak_bytes <= self.capacity,
        )


def better(a: Judged | None, b: Judged | None) -> Judged | None:
    """The plan that fits and is faster (ties: less device memory); a fitting plan wins."""
    if a is None:
        return b
    if b is None:
        return a
    if a.fits != b.fits:
        return a if a.fits else b
    if not a.fits:  # neither fits: one within the device budget, else the closer to it
        if a.device_fits != b.device_fits:
            return a if a.device_fits else b
        if a.device_fits:
            return a if a.host_peak_bytes <= b.host_peak_bytes else b
        return a if (a.peak_bytes, a.makespan_ms) <= (b.peak_bytes, b.makespan_ms) else b
    return a if (a.makespan_ms, a.peak_bytes) <= (b.makespan_ms, b.peak_bytes) else b


def plan_for(judge: Judge, base: Sequence[Action], chosen: Sequence[Window],
             slack: float = 1.0) -> Judged | None:
    """The base plan with `chosen` offloaded, reloads just in time (`slack`), judged; repeated
    questions (the same base, set and slack) are answered from the judge's memo."""
    key = (id(base), frozenset(w.key for w in chosen), slack)
    hit = judge.memo.get(key)
    if hit is not None and hit[0] is base:
        return hit[1]
    positions = jit_positions(judge.graph, base, chosen, judge.h2d, slack)
    got = judge(with_offloads(base, chosen, positions))
    if len(judge.memo) >= MEMO_ENTRIES:
        judge.memo.clear()
    judge.memo[key] = (base, got)
    return got


def fit_with_offloads(
    judge: Judge,
    base: Sequence[Action],
    order: Callable[[Window], Any],
    deadline: float,
    *,
    windows: Sequence[Window] | None = None,
    bring_back: Callable[[Window], Any] | None = None,
) -> Judged | None:
    """The fastest fitting plan this search finds on `base` (None: none fits), or the base
    itself when it fits already. `order` ranks windows to offload first (smallest key first);
    `bring_back` ranks the chosen ones to try keeping on the device (default: reverse order)."""
    start = judge(list(base))
    if start is not None and start.fits:
        return start
    ranked = sorted(windows if windows is not None else find_windows(judge.graph, base),
                    key=order)
    if not ranked:
        return None
    slack, full = 1.0, None
    for slack in FALLBACK_SLACKS:  # later reloads hold less memory (and expose more time)
        full = better(full, plan_for(judge, base, ranked, slack))
        if full is not None and full.device_fits or time.perf_counter() >= deadline:
            break
    if full is None or not full.device_fits:
        # Copies out queue on the d2h link and a device copy is released only once its copy
        # ends (the free is placed there): offloading more can raise the peak. Grow the set
        # one window at a time instead.
        return grow(judge, base, ranked, deadline)
    lo, hi = 0, len(ranked)  # prefix hi fits the device; find the least one that fits both
    best = full if full.fits else None
    while lo + 1 < hi and time.perf_counter() < deadline:
        mid = (lo + hi) // 2
        got = plan_for(judge, base, ranked[:mid], slack)
        if got is not None and got.device_fits:
            hi = mid
            if got.fits:
                best = better(best, got)
        else:
            lo = mid
    chosen = list(ranked[:hi])
    current = plan_for(judge, base, chosen, slack)
    if current is None or not current.fits:
        return better(best, current)  # none fits: the closest (its host need is reported)
    best = better(best, current)
    back_key = bring_back or (lambda w: -ranked.index(w))
    chosen, current = bring_back_batched(judge, base, chosen, current,
                                         sorted(chosen, key=back_key), slack, deadline)
    best = better(best, current)
    return tune_leads(judge, base, chosen, best, deadline, slack)


def bring_back_batched(judge: Judge, base: Sequence[Action], chosen: list[Window],
                       current: Judged, candidates: list[Window], slack: float,
                       deadline: float) -> tuple[list[Window], Judged]:
    """Keep on the device as many `candidates` as possible (in order) while the plan fits and
    is no slower: try a whole batch, split it in halves when it fails (O(k log n) simulations
    for k windows that must stay offloaded)."""
    stack = [candidates]
    while stack and time.perf_counter() < deadline:
        batch = stack.pop()
        if not batch:
            continue
        drop_keys = {w.key for w in batch}
        trial = [c for c in chosen if c.key not in drop_keys]
        got = plan_for(judge, base, trial, slack)
        if got is not None and got.fits and got.makespan_ms <= current.makespan_ms + 1e-9:
            chosen, current = trial, got
        elif len(batch) > 1:
            half = len(batch) // 2
            stack.append(batch[half:])  # the first half is tried first
            stack.append(batch[:half])
    return chosen, current


def grow(judge: Judge, base: Sequence[Action], ranked: Sequence[Window],
         deadline: float) -> Judged | None:
    """Add windows in rank order, keeping each that lowers the peak, until the plan fits (then
    bring back and stretch leads as usual); the closest plan when none fits in time."""
    chosen: list[Window] = []
    current = judge(list(base))
    if current is None:
        return None
    best: Judged | None = current
    for w in ranked:
        if time.perf_counter() >= deadline:
            break
        slack = 1.0
        got = plan_for(judge, base, [*chosen, w], slack)
        if got is None or got.peak_bytes >= current.peak_bytes:
            slack = 0.0  # a reload right before its use holds the memory for less time
            got = plan_for(judge, base, [*chosen, w], slack)
        if got is None or got.peak_bytes >= current.peak_bytes:
            continue
        chosen.append(w)
        current = got
        best = better(best, got)
        if got.fits:
            return tune_leads(judge, base, chosen, best, deadline, slack)
    return best


def tune_leads(judge: Judge, base: Sequence[Action], chosen: Sequence[Window],
               best: Judged | None, deadline: float, used: float = 1.0) -> Judged | None:
    """Try longer prefetch leads than `used`: hides more transfer, holds more device memory."""
    if best is None or best.exposed_ms <= 0:
        return best
    for slack in sorted({*FALLBACK_SLACKS, *PREFETCH_SLACKS}):
        if slack <= used:
            continue
        if time.perf_counter() >= deadline:
            break
        got = plan_for(judge, base, chosen, slack)
        if got is not None and got.fits:
            best = better(best, got)
    return best


def judged_details(j: Judged) -> dict[str, Any]:
    """The simulator's figures of a plan, for MethodResult.details."""
    return {
        "makespan_ms": j.makespan_ms,
        "compute_ms": j.compute_ms,
        "transfer_ms": j.transfer_ms,
        "exposed_transfer_ms": j.exposed_ms,
        "peak_bytes": j.peak_bytes,
        "host_peak_bytes": j.host_peak_bytes,
    }


def judged_result(request: SolveRequest, judge: Judge, best: Judged | None, backend: str,
                  notes: list[str] | None = None,
                  details: dict[str, Any] | None = None) -> MethodResult:
    """A fitting plan as feasible; otherwise infeasible, naming what the closest plan needs."""
    notes = list(notes or [])
    details = dict(details or {})
    details["simulations"] = judge.simulations
    if best is not None and best.fits:
        details.update(judged_details(best))
        return MethodResult(actions=best.actions, status=PlanStatus.feasible, backend=backend,
                            objective=best.compute_ms, notes=notes, details=details)
    if best is None:
        notes.append("no plan with host copies could be built for this graph")
        return MethodResult(actions=None, status=PlanStatus.infeasible, backend=backend,
                            notes=notes, details=details)
    details.update(judged_details(best))
    smallest = None
    if not best.device_fits:
        smallest = best.peak_bytes
        notes.append(f"the best plan found peaks at {best.peak_bytes} bytes of device memory, "
                     f"over the budget of {request.budget_bytes}")
    if not best.host_fits:
        details["least_host_memory_bytes"] = best.host_peak_bytes
        notes.append(f"host memory too small: the plan parks {best.host_peak_bytes} bytes on the "
                     f"host at once, host_memory_bytes is {judge.capacity}; give at least "
                     f"{best.host_peak_bytes}")
    return MethodResult(actions=None, status=PlanStatus.infeasible, backend=backend,
                        smallest_feasible_bytes=smallest, notes=notes, details=details)
