"""Two stage plans mixed over the micro-batches in flight (PipelineStage.variants).

A stage holding k micro-batches at once pays its plan's bytes k times. The one-plan knapsack
(planner.solvers.pipeline.stage_menu) picks whole options, so where the cap falls between two
frontier plans it pays the slower one in every micro-batch. Running the slower ("heavy") plan
in q of every k consecutive micro-batches and the faster ("light") one in the others keeps
(k - q) light and q heavy micro-batches in any window (planner.sim.rank_memory.
mixed_stage_peak_bytes) and pays the heavy plan's time only in those: the ILP's
per-micro-batch recomputation, per module. With q a whole number the best pair need not lie on
the frontier's convex hull, so for every q and spread plans of the (bytes per micro-batch,
time) staircase the fastest heavier plan the additive bounds let in is found by bisection, then
for every plan near the fastest few mixes' light plans; the fastest few mixes are then checked
by the simulator's own rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.sim.rank_memory import mixed_stage_peak_bytes
from planner.sim.stage_costs import StageCosts
from planner.solvers.pipeline.frontier import State
from planner.solvers.pipeline.problem import PipelineProblem
from planner.solvers.pipeline.stage_menu import StageChoice, StageMix, variant_microbatches

MIX_CHECKS = 4  # screened mixes, fastest first, whose bytes the simulator's rule checks
STAIR_POINTS = 48  # frontier plans a mix is made of, at most


def _staircase(points: Sequence[tuple[State, StageCosts]]) -> list[tuple[State, StageCosts]]:
    """The points no other beats in both saved bytes and ms: saved increasing, ms decreasing."""
    stair: list[tuple[State, StageCosts]] = []
    for p in sorted(points, key=lambda x: (x[1].saved_bytes, x[0].ms)):
        if not stair or p[0].ms < stair[-1][0].ms:
            stair.append(p)
    return stair


def _spread(n: int) -> list[int]:
    """At most STAIR_POINTS indices of 0..n-1, evenly spread (the first search's light plans)."""
    if n <= STAIR_POINTS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (STAIR_POINTS - 1)) for i in range(STAIR_POINTS)})


def best_mix(
    problem: PipelineProblem,
    inflight: int,
    cap: float,
    host_cap: int,
    uniform: StageChoice,
    frontier: Sequence[tuple[State, StageCosts]],
    exact_of: Callable[[State], StageChoice],
) -> StageMix | None:
    """The fastest mix of two frontier plans (each with its bound costs) that fits `cap` and
    `host_cap` and beats `uniform` (the fastest one plan) on the mean added time; None if
    none does. `exact_of`: a state's plan under the simulator's rule. With a host tier, the
    plans that offload nothing are mixed on their own too, so a host tier's staircase never
    hides the mixes found without one (when copies were timed as hidden, offloading plans
    filled it and failed the rule's check: GPT-24 on 2 ranks, 0.9x, 58.54 ms with a host
    tier against 58.02 without one)."""
    if inflight < 2 or problem.microbatches < 2:
        return None
    local = [x for x in frontier if not x[0].offload_bytes]
    found = [_mix_of(problem, inflight, cap, host_cap, uniform, _staircase(points), exact_of)
             for points in ([frontier, local] if len(local) < len(frontier) else [frontier])]
    mixes = [x for x in found if x is not None]
    return min(mixes, key=lambda x: (x.added_ms, x.peak_bytes)) if mixes else None


def _mix_of(problem: PipelineProblem, k: int, cap: float, host_cap: int, uniform: StageChoice,
            stair: list[tuple[State, StageCosts]],
            exact_of: Callable[[State], StageChoice]) -> StageMix | None:
    """`best_mix` over one staircase: light plans first at its spread points, then every one
    between the neighbours of the fastest few mixes' light plans."""
    m = problem.microbatches
    split = problem.plan_schedule.split_backward

    def screen(a: int, q: int) -> tuple[float, int, int, int] | None:
        """(mean ms, light, heavy, slots) of light plan `a`'s best mix with q heavy slots."""
        heavy_n = len(variant_microbatches(m, k, q))
        if a == 0 or (m - heavy_n) * stair[a][0].ms >= m * uniform.added_ms:
            return None  # the light plan alone costs more than the one plan
        b = _fastest_heavy(stair, a, k, q, m, cap, split)
        if b is None:
            return None
        fast, slow = stair[a][0], stair[b][0]
        mean = ((m - heavy_n) * fast.ms + heavy_n * slow.ms) / m
        if mean >= uniform.added_ms or (
                (k - q) * fast.offload_bytes + q * slow.offload_bytes > host_cap):
            return None
        return (mean, a, b, q)

    picks = _spread(len(stair))
    screened = {x for q in range(1, k) for a in picks if (x := screen(a, q)) is not None}
    for _, a, _, q in sorted(screened)[:MIX_CHECKS]:  # between the neighbouring spread points
        at = picks.index(a)
        lo, hi = picks[max(at - 1, 0)], picks[min(at + 1, len(picks) - 1)]
        screened |= {x for near in range(lo + 1, hi) if (x := screen(near, q)) is not None}
    best: StageMix | None = None
    exact: dict[int, StageChoice] = {}
    for _, a, b, q in sorted(screened)[:MIX_CHECKS]:
        light = exact.setdefault(a, exact_of(stair[a][0]))
        heavy = exact.setdefault(b, exact_of(stair[b][0]))
        heavy_n = len(variant_microbatches(m, k, q))
        mean = ((m - heavy_n) * light.added_ms + heavy_n * heavy.added_ms) / m
        peak = mixed_stage_peak_bytes(light.costs, heavy.costs, k, q, m, split)
        mix = StageMix(light, heavy, q, k, mean, peak)
        if peak > cap or mix.window_host_bytes > host_cap or mean >= uniform.added_ms:
            continue
        if best is None or (mean, peak) < (best.added_ms, best.peak_bytes):
            best = mix
    return best


def _fastest_heavy(stair: Sequence[tuple[State, StageCosts]], a: int, k: int, q: int, m: int,
                   cap: float, split: bool) -> int | None:
    """The largest index below `a` (the fastest heavier plan) whose mix with `a` fits `cap`
    by the bounds: a bisection (fewer bytes fit more easily, transients aside)."""
    def fits(b: int) -> bool:
        return mixed_stage_peak_bytes(stair[a][1], stair[b][1], k, q, m, split) <= cap

    lo, hi = 0, a - 1
    if not fits(lo):
        return None
    while lo < hi:  # fits(lo) holds
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
