"""The two dynamic programmes over (unit prefix, stages) that every partitioner uses: split a
chain of `length` units into `stages` non-empty contiguous ranges minimising the largest range
cost, or the sum of costs under a cap. A cost of None forbids a range (it does not fit).
O(length^2 x stages) each."""

from __future__ import annotations

import math
from collections.abc import Callable

Cost = Callable[[int, int, int], float | None]  # (first, end, stage) -> value; None: not allowed


def minmax_dp(length: int, stages: int, cost: Cost) -> tuple[float, list[tuple[int, int]]] | None:
    """Split [0, length) into `stages` non-empty ranges minimising the largest cost."""
    inf = math.inf
    best = [[inf] * (stages + 1) for _ in range(length + 1)]
    back = [[-1] * (stages + 1) for _ in range(length + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, length - (stages - s) + 1):
            for i in range(s - 1, j):
                if best[i][s - 1] == inf:
                    continue
                c = cost(i, j, s - 1)
                if c is None:
                    continue
                v = max(best[i][s - 1], c)
                if v < best[j][s]:
                    best[j][s], back[j][s] = v, i
    if best[length][stages] == inf:
        return None
    return best[length][stages], _walk(back, length, stages)


def minsum_dp(length: int, stages: int, cost: Cost, cap: float) -> list[tuple[int, int]] | None:
    """Split minimising the sum of costs with every stage's cost <= cap."""
    inf = math.inf
    best = [[inf] * (stages + 1) for _ in range(length + 1)]
    back = [[-1] * (stages + 1) for _ in range(length + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, length - (stages - s) + 1):
            for i in range(s - 1, j):
                if best[i][s - 1] == inf:
                    continue
                c = cost(i, j, s - 1)
                if c is None or c > cap:
                    continue
                v = best[i][s - 1] + c
                if v < best[j][s]:
                    best[j][s], back[j][s] = v, i
    if best[length][stages] == inf:
        return None
    return _walk(back, length, stages)


def _walk(back: list[list[int]], length: int, stages: int) -> list[tuple[int, int]]:
    out = []
    j = length
    for s in range(stages, 0, -1):
        i = back[j][s]
        out.append((i, j))
        j = i
    return out[::-1]
