"""Revolve: Griewank's binomial checkpointing for homogeneous chains (Griewank & Walther 2000).

With c checkpoint slots (the one holding a^0 included) and l steps, the least number of forward
recomputations is t(l, c) = r·l − β(c+1, r−1), where β(c, r) = C(c+r, c) and r is the integer
with β(c, r−1) < l ≤ β(c, r) (`griewank_recomputations`). The schedule comes from the recursion

    T(l, 1) = l(l−1)/2,   T(1, c) = 0,   T(l, c) = min_{1≤j<l} j + T(l−j, c−1) + T(j, c)

(advance j steps, store a checkpoint there, reverse the right part with one slot less, then the
left part with all slots), written as chain operations: advancing is F_ck then F_∅, reversing
one step is F_all then B. Memory in the chain model: a^0, the stored checkpoints, the advancing
value and one ā.

`revolve_ops` treats any chain as homogeneous (the schedule ignores sizes and costs);
`solve_revolve` picks the most slots whose schedule fits the budget by exact accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from planner.solvers.chain.model import Chain
from planner.solvers.chain.sequence import Op, OpKind, run_sequence


def griewank_recomputations(steps: int, slots: int) -> int:
    """Closed-form least forward recomputations to reverse `steps` steps with `slots` slots."""
    if steps <= 1:
        return 0
    if slots < 1:
        raise ValueError("Revolve needs at least one checkpoint slot (the input's)")
    r = 0
    while comb(slots + r, slots) < steps:
        r += 1
    return r * steps - comb(slots + r, slots + 1) if r > 0 else 0


_TABLE: dict[tuple[int, int], tuple[int, int]] = {}


def _table(steps: int, slots: int) -> tuple[int, int]:
    """(T(steps, slots), best first advance j) of the recursion in the module doc, memoised;
    evaluated with an explicit stack (chains of thousands of stages exceed Python's recursion
    limit)."""
    stack = [(steps, slots)]
    while stack:
        n, c = stack[-1]
        if (n, c) in _TABLE:
            stack.pop()
            continue
        if n <= 1:
            _TABLE[n, c] = (0, 0)
            stack.pop()
            continue
        if c == 1:
            _TABLE[n, c] = (n * (n - 1) // 2, n - 1)
            stack.pop()
            continue
        missing = [key for j in range(1, n) for key in ((n - j, c - 1), (j, c))
                   if key not in _TABLE]
        if missing:
            stack.extend(missing)
            continue
        best, best_j = None, 0
        for j in range(1, n):
            value = j + _TABLE[n - j, c - 1][0] + _TABLE[j, c][0]
            if best is None or value < best:
                best, best_j = value, j
        assert best is not None
        _TABLE[n, c] = (best, best_j)
        stack.pop()
    return _TABLE[steps, slots]


def revolve_recomputations(steps: int, slots: int) -> int:
    return _table(steps, slots)[0]


def revolve_ops(length: int, slots: int) -> list[Op]:
    """The binomial schedule for a chain of `length` stages with `slots` slots (≥ 1)."""
    ops: list[Op] = []
    stack: list[tuple[str, int, int, int]] = [("rev", 1, length, slots)]
    while stack:
        kind, s, t, c = stack.pop()
        if kind == "discard":
            ops.append(Op(OpKind.discard, s))
            continue
        if s == t:
            ops += [Op(OpKind.f_all, s), Op(OpKind.backward, s)]
            continue
        j = _table(t - s + 1, min(c, t - s + 1))[1]
        split = s + j  # a^{split-1} becomes the right part's stored input
        ops.append(Op(OpKind.f_ck, s))
        ops.extend(Op(OpKind.f_none, k) for k in range(s + 1, split))
        right_slots = c - 1 if c > 1 else 1
        stack += [
            ("rev", s, split - 1, c),
            ("discard", split - 1, 0, 0),
            ("rev", split, t, right_slots),
        ]
    return ops


@dataclass(frozen=True)
class RevolveSolution:
    ops: tuple[Op, ...] | None
    slots: int | None
    cost: float | None
    peak_bytes: int | None
    smallest_feasible_bytes: int | None  # peak of the one-slot schedule


def solve_revolve(chain: Chain, budget_bytes: int) -> RevolveSolution:
    """Most slots whose schedule fits (fewer slots never cost less, rarely peak higher)."""
    length = chain.length
    least = None
    for slots in range(length, 0, -1):
        ops = revolve_ops(length, slots)
        run = run_sequence(chain, ops)
        least = run.peak_bytes if least is None else min(least, run.peak_bytes)
        if run.peak_bytes <= budget_bytes:
            return RevolveSolution(tuple(ops), slots, run.cost, run.peak_bytes, None)
    return RevolveSolution(None, None, None, None, least)
