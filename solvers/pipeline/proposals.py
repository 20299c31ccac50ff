"""Split proposals for the whole-job search (planner.solvers.pipeline.whole_job) when there are
too many contiguous splits to enumerate.

The chain DPs (planner.solvers.pipeline.chain_dp) ask for every range's stage cost: with a
stage knapsack each (module figures, frontier, the simulator's rule) a 48-block GPT over 4 ranks
took 9.6 s of costs before the first proposal. The cost here is a proxy made from each unit's
whole-module figures once: the units' recompute figures in a window of their neighbours (the
figures of a unit inside a stage seldom depend on where the stage starts or ends), and per
range the fewest of its modules, cheapest ms per freed byte first, whose recomputation brings
the stage's peak bound within its share (or the whole stage rerun, as the ILP does, when that
is cheaper). Only a proxy: every proposal is then judged by its knapsacks and the simulator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from planner.sim.stage_costs import one_stage_peak_bytes
from planner.sim.stage_policies import StageFacts
from planner.solvers.pipeline.chain_dp import minmax_dp, minsum_dp
from planner.solvers.pipeline.frontier import ZERO, State
from planner.solvers.pipeline.problem import Candidate, PipelineProblem, Split
from planner.solvers.pipeline.stage_items import Item, items
from planner.solvers.pipeline.stage_menu import bound_costs, whole_stage

Bounds = tuple[tuple[int, int], ...]  # (first unit, end unit) per stage
Offer = Callable[[Bounds, str], None]  # judge a split's best-policy plan (and its source)
Current = Callable[[], Candidate | None]  # the best plan so far
Deadline = Callable[[], float]  # perf_counter time past which no new split is begun

PROPOSAL_SPAN = 2.0  # DP proposals consider ranges up to this many times the mean stage length
NEAR_SUM = 1.05  # the second proposal: least total cost with no stage above this x the first's
WINDOW = 1  # units on each side of a unit when its figures are made


class ProxyCosts:
    """Range stage costs for the chain DPs: the stage's time per micro-batch plus the added
    time of the recomputation that fits it (None: nothing fits)."""

    def __init__(self, problem: PipelineProblem, cap: float,
                 facts_of: Callable[[int, int], StageFacts]) -> None:
        self.p = problem
        self.cap = cap
        self.facts_of = facts_of
        self.unit_items: dict[bool, list[list[Item]]] = {}  # W reruns -> per unit its items
        self.known: dict[tuple[int, int, int], float | None] = {}  # (i, j, s) -> added ms

    def _units(self, reruns: bool) -> list[list[Item]]:
        """Each unit's modules' whole-module figures, made in a window of its neighbours."""
        if reruns not in self.unit_items:
            chain = self.p.chain
            out = []
            for u in range(chain.length):
                lo, hi = max(0, u - WINDOW), min(chain.length, u + WINDOW + 1)
                mine = set(chain.groups[u])
                made = items(self.p, self.facts_of(lo, hi), reruns, op_level=False,
                             offload=False)
                out.append([it for it in made if it.name in mine])
            self.unit_items[reruns] = out
        return self.unit_items[reruns]

    def added_ms(self, i: int, j: int, s: int) -> float | None:
        """Units [i, j) as stage s: the proxy's added time per micro-batch (0: all-keep fits)."""
        if (i, j, s) not in self.known:
            self.known[(i, j, s)] = self._added_ms(i, j, s)
        return self.known[(i, j, s)]

    def stage_ms(self, i: int, j: int, s: int) -> float | None:
        """The stage's time per micro-batch with the proxy's added time (None: none fits)."""
        added = self.added_ms(i, j, s)
        return None if added is None else self.p.stage_time(self.p.costs(i, j, s), s) + added

    def split_key(self, bounds: Bounds) -> tuple[float, float]:
        """The split's slowest and total proxy stage times (inf where a stage cannot fit)."""
        times = [self.stage_ms(i, j, s) for s, (i, j) in enumerate(bounds)]
        if any(t is None for t in times):
            return (math.inf, math.inf)
        return (max(t for t in times if t is not None), sum(t for t in times if t is not None))

    def _added_ms(self, i: int, j: int, s: int) -> float | None:
        p = self.p
        base = p.costs(i, j, s)
        k, m = p.inflight[s], p.microbatches
        split = p.plan_schedule.split_backward

        def fits(st: State) -> bool:
            return one_stage_peak_bytes(bound_costs(base, 0, st), k, microbatches=m,
                                        split_backward=split) <= self.cap

        if fits(ZERO) or split and one_stage_peak_bytes(
                base, k, microbatches=m, split_backward=False) <= self.cap:
            return 0.0  # (zero-bubble: full backwards fit, WholeJob.fused_for_memory)
        units = self._units(split and not base.first_stage)
        order = sorted((it for u in range(i, j) for it in units[u]
                        if it.exclusive_bytes > it.inputs_bytes),
                       key=lambda it: it.recompute_ms / (it.exclusive_bytes - it.inputs_bytes))
        prefix = [ZERO]  # prefix[n]: the first n of `order` recomputed
        for it in order:
            st = prefix[-1]
            prefix.append(State(st.delta_bytes + it.inputs_bytes - it.exclusive_bytes, 0,
                                max(st.largest_bytes, it.recompute_transient_bytes),
                                st.ms + it.recompute_ms, (),
                                st.weight_rerun_bytes + it.weight_rerun_bytes))
        rerun = whole_stage(p, base, k, self.cap)
        best = rerun.added_ms if rerun is not None else None
        if fits(prefix[-1]):
            lo, hi = 0, len(prefix) - 1  # not fits(prefix[lo]), fits(prefix[hi])
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(prefix[mid]):
                    hi = mid
                else:
                    lo = mid
            if best is None or prefix[hi].ms < best:
                best = prefix[hi].ms
        return best


def propose(problem: PipelineProblem, proxy: ProxyCosts, try_bounds: Offer, current: Current,
            deadline: Deadline, fitting: Callable[[], dict[Bounds, float]]) -> None:
    """DP proposals on the proxy's stage costs, then boundary moves: from the fastest split
    not yet moved from (`fitting`: every split with a fitting plan, its step), its moves the
    proxy finds most promising first, on to the first one faster than the best; once no move
    of the best is faster, from the next fastest split (out of a local optimum)."""
    from planner.solvers.pipeline.dp import neighbours

    p = problem
    L, S = p.length, p.stage_count
    span = max(2, math.ceil(PROPOSAL_SPAN * L / S))

    def cost(i: int, j: int, s: int) -> float | None:
        if j - i > span or time.perf_counter() > deadline():
            return None
        return proxy.stage_ms(i, j, s)

    found = minmax_dp(L, S, cost)
    if found is not None and time.perf_counter() < deadline():
        try_bounds(tuple(found[1]), "DP proposal")
        more = minsum_dp(L, S, cost, found[0] * NEAR_SUM)
        if more is not None and time.perf_counter() < deadline():
            try_bounds(tuple(more), "DP proposal")
    moved: set[Bounds] = set()
    while time.perf_counter() < deadline():
        left = [(step, bounds) for bounds, step in fitting().items() if bounds not in moved]
        if not left:
            return
        _, start = min(left)
        moved.add(start)
        best = current()
        # today's DP's moves, sliding runs too
        for near in sorted(neighbours(Split(start)), key=lambda n: proxy.split_key(n.bounds)):
            if time.perf_counter() >= deadline():
                return
            try_bounds(near.bounds, "local move")
            if current() is not best:
                break
