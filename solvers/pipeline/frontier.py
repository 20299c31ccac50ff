"""The stage knapsack's frontier (planner.solvers.pipeline.stage_menu): its states, the Pareto
filter, the cut that bounds its size, and the screen that drops states no completion can fit.

A state is one choice for the modules decided so far, with additive figures: saved bytes per
micro-batch over the all-keep stage, host bytes, the largest non-keep transient, the added
time, and the W reruns under zero-bubble I/W. The filter keeps, per W-rerun figure, a
staircase over (saved delta, host bytes) for each largest-transient prefix, so a state is
checked in a few lookups. The screen (`FitScreen`) bounds what the modules still to decide can
free at most, so it drops a state only when every completion of it overflows the stage's
share of memory: it never loses a fitting plan, and the cut then keeps states that can fit.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable
from typing import NamedTuple

EVERYTHING_FITS = 1 << 62  # a saved delta past any real stage's bytes


class State(NamedTuple):  # a tuple, not a dataclass: the knapsack makes ~10^5 a stage
    delta_bytes: int  # saved bytes per micro-batch over the all-keep stage (upper bound)
    offload_bytes: int  # the host bytes
    largest_bytes: int  # the largest non-keep module's transient bound
    ms: float
    choice: tuple[str, ...]  # per module: a UnitPolicy or "op<k>" (its k-th op-level option)
    weight_rerun_bytes: int = 0  # the recomputed modules' W reruns, summed (upper bound)


ZERO = State(0, 0, 0, 0.0, ())  # nothing decided: the all-keep stage


# (ms, delta, offload, largest): the time order, ties by bytes
time_order: Callable[[State], tuple[float, int, int, int]] = operator.itemgetter(3, 0, 1, 2)


def pareto(states: list[State]) -> list[State]:
    """The states no other state matches or beats in all five figures, in time order: a state
    is kept unless a kept one has every byte figure at most its own."""
    out: list[State] = []
    by_rerun: dict[int, _Prefixes] = {}  # W-rerun figure -> its kept states
    for st in sorted(states, key=time_order):
        reruns = st.weight_rerun_bytes
        for w, p in by_rerun.items():  # a loop, not any(): this runs ~10^5 times a stage
            if w <= reruns and p.covers(st):
                break
        else:
            out.append(st)
            kept = by_rerun.get(reruns)
            if kept is None:
                kept = by_rerun[reruns] = _Prefixes()
            kept.add(st)
    return out


def cut(frontier: list[State], inflight: int, limit: int) -> list[State]:
    """`limit` states of a frontier in time order: the fastest half, and the rest least in
    device bytes (what the stage keeps in flight plus the largest transient), so both the
    fastest plans and those that fit tight memory survive the cut; and, with a host tier,
    every state that offloads nothing, up to `limit` of them (a host tier's frontier is cut
    sooner, and before copies were timed as the runtime makes them, a cut by time alone
    dropped the plans without a host tier: a host tier made GPT-48 plans slower than none)."""
    fast = frontier[:limit // 2]
    rest = sorted(frontier[limit // 2:],
                  key=lambda x: (inflight * x.delta_bytes + x.largest_bytes, x.offload_bytes))
    kept = fast + rest[:limit - len(fast)]
    local = [x for x in frontier if not x.offload_bytes]
    if local and len(local) < len(frontier):
        chosen = {id(x) for x in kept}
        kept += [x for x in (cut(local, inflight, limit) if len(local) > limit else local)
                 if id(x) not in chosen]
    return sorted(kept, key=time_order)


class FitScreen:
    """Drops states no completion can fit. `peak_of(delta, largest, reruns)`: a lower bound of
    the peak of any plan (or mix of plans) holding a state with these figures, non-decreasing
    in each; `rest_least_delta[n]`: the least saved delta modules n.. can add (each module's
    smallest option); `host_room`: the most host bytes one state may hold."""

    def __init__(self, peak_of: Callable[[int, int, int], int], cap: float,
                 rest_least_delta: list[int], host_room: float) -> None:
        self.peak_of = peak_of
        self.cap = cap
        self.rest = rest_least_delta
        self.host_room = host_room
        self.most: dict[tuple[int, int], int] = {}  # (largest, reruns) -> the most delta

    def keeps(self, st: State, decided: int) -> bool:
        """Some completion of `st` (its first `decided` modules chosen) may fit."""
        if st.offload_bytes > self.host_room:
            return False
        key = (st.largest_bytes, st.weight_rerun_bytes)
        most = self.most.get(key)
        if most is None:
            most = self.most[key] = self._most_delta(*key)
        return st.delta_bytes + self.rest[decided] <= most

    def _most_delta(self, largest: int, reruns: int) -> int:
        """The largest final saved delta whose peak fits (below the least reachable: none)."""
        def fits(delta: int) -> bool:
            return self.peak_of(delta, largest, reruns) <= self.cap

        lo = self.rest[0]  # no completion frees more
        if not fits(lo):
            return lo - 1
        hi = max(lo + 1, 0)
        step = 1 << 20
        while fits(hi):  # fits(lo), not fits(hi)
            if hi >= EVERYTHING_FITS:  # the peak does not grow with the delta
                return EVERYTHING_FITS
            lo, hi, step = hi, hi + step, step * 2
        halve = False
        while hi - lo > 1:
            # the peak is a few linear pieces in the delta: a step along the slope left of
            # `hi` lands on the boundary or just past it; else (or every other time) halve
            mid = (lo + hi) // 2
            if not halve:
                top = self.peak_of(hi, largest, reruns)
                over, slope = top - self.cap, top - self.peak_of(hi - 1, largest, reruns)
                if slope > 0:
                    mid = min(max(hi - math.ceil(over / slope), lo + 1), hi - 1)
            width = hi - lo
            if fits(mid):
                lo = mid
            else:
                hi = mid
            halve = not halve and 2 * (hi - lo) > width
        return lo


class _Prefixes:
    """For each largest-transient value seen, the staircase of the kept states whose largest
    transient is at most it (a check is one lookup; states are added far less often than
    checked)."""

    def __init__(self) -> None:
        self.largest: list[int] = []
        self.stairs: list[_Staircase] = []

    def covers(self, st: State) -> bool:
        k = bisect.bisect_right(self.largest, st.largest_bytes) - 1
        return k >= 0 and self.stairs[k].covers(st.delta_bytes, st.offload_bytes)

    def add(self, st: State) -> None:
        k = bisect.bisect_left(self.largest, st.largest_bytes)
        if k == len(self.largest) or self.largest[k] != st.largest_bytes:
            self.largest.insert(k, st.largest_bytes)
            self.stairs.insert(k, self.stairs[k - 1].copy() if k else _Staircase())
        for stair in self.stairs[k:]:
            if not stair.covers(st.delta_bytes, st.offload_bytes):
                stair.add(st.delta_bytes, st.offload_bytes)


class _Staircase:
    """Points (d, o) none of which dominates another: d increasing, o strictly decreasing."""

    def __init__(self) -> None:
        self.d: list[int] = []
        self.o: list[int] = []

    def covers(self, d: int, o: int) -> bool:
        """Some point has d' <= d and o' <= o."""
        i = bisect.bisect_right(self.d, d) - 1
        return i >= 0 and self.o[i] <= o

    def add(self, d: int, o: int) -> None:
        """A point no present one covers; drops the ones it covers."""
        i = bisect.bisect_left(self.d, d)
        j = i
        while j < len(self.d) and self.o[j] >= o:
            j += 1
        self.d[i:j] = [d]
        self.o[i:j] = [o]

    def copy(self) -> _Staircase:
        out = _Staircase()
        out.d, out.o = list(self.d), list(self.o)
        return out
