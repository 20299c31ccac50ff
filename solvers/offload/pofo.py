"""POFO-style DP: Rotor's optimal chain checkpointing extended with offloading (after Beaumont,
Eyraud-Dubois, Shilova, Zhao, NeurIPS 2021). Our model and code.

Rotor's subproblem (s, t, m) (a^{s-1} and δ^t resident, m bytes free above them, produce
δ^{s-1}; see planner.solvers.chain.rotor) gains one operation and a flag:

- F_off s: run F_all s, copy the part of ā^s beyond a^s (e_s bytes, `offload_bytes[s]`) to the
  host while the next forward operation runs, free it after that operation, copy it back while
  B_{s+1} runs, then B s. The child (s+1, t) runs with m - x_s (a^s stays: it is the child's
  input) and flag 1.
- flag h of (s, t, m, h): 0 none; 1: e_{s-1} (the parent's offloaded bytes) is still on the
  device during this subproblem's first forward operation (the copy out) and during its last
  operation, B s (the copy back); 2: during B s only (the F_ck branch's second child, which
  recomputes from a^{s-1} after the copy out is over).
- F_all s may also copy its input a^{s-1} out while it runs (s ≥ 2), free it after, and copy it
  back while B_{s+1} runs: the child gets x_{s-1} more memory, and flag g (x_{(s+1)-2} on the
  device during its last operation, B_{s+1}). Nothing in the child reads a^{s-1}.
- Time: compute plus, per F_all with copies, the reloads not hidden by B_{s+1}:
  max(0, reload ms - b_{s+1}) (both reloads share the h2d link). The copy out costs no time
  (the plan's free of the device copy is placed after the copy's end by
  planner.sim.free_placement, so the compute stream does not wait), and is assumed over within
  that first operation.

`replay` accounts a sequence in this model exactly (bytes); `solve_pofo` returns the least-cost
sequence within a budget (slots as in Rotor: exact when every size is a multiple of the gcd and
the budget is at most `slots` of them, else sizes are rounded up). The DP contains every Rotor
sequence (flag 0, no F_off), so its model cost never exceeds Rotor's. The simulator judges the
plan it translates to (planner.solvers.offload.pofo_method); where the assumptions above fail (a
copy
out longer than the next operation) the plan may need more memory, and the method re-solves at
a smaller budget.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.solvers.chain.model import Chain
from planner.solvers.chain.rotor import discretise
from planner.solvers.chain.sequence import ChainLiveBytes, Op, OpKind

# choice codes: F_all with bits (1: offload e_s, 2: offload the input a^{s-1}), or _SPLIT + s'
# for the F_ck branch with split point s'
_INFEASIBLE, _F_ALL, _SPLIT = -1, 0, 4
TABLE_ENTRIES = 20_000_000
PER_CELL_S = 6e-5  # one (s, t, flags) cell's numpy calls, measured ~4·10⁻⁵ s
DP_STEPS_PER_S = 5e7  # measured ~7·10⁷ on one core of the benchmark machine; kept conservative


@dataclass(frozen=True)
class Mark:
    """A host-copy step of the sequence: O (copy out e_s), F (free it), P (copy it back); Oi, Fi,
    Pi the same for a^stage (the input of stage + 1)."""

    kind: str  # "O", "F", "P", "Oi", "Fi" or "Pi"
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}e{self.stage}"


Item = Op | Mark


@dataclass(frozen=True)
class OffloadChain:
    chain: Chain
    offload_bytes: tuple[int, ...]  # per stage (0-based list of stages 1..L): e_s ≤ x̄_s - x_s
    reload_ms: tuple[float, ...]  # per stage: time to copy e_s back
    input_reload_ms: tuple[float, ...]  # per stage s: time to copy a^s (x_s bytes) back

    def e(self, s: int) -> int:
        return self.offload_bytes[s - 1] if 1 <= s <= self.chain.length else 0


@dataclass(frozen=True)
class Replay:
    peak_bytes: int  # fixed memory included
    cost_ms: float  # compute + exposed reloads
    offloaded_bytes: int  # bytes copied out (each F_off once)


def replay(problem: OffloadChain, items: Sequence[Item]) -> Replay:
    """Exact peak and cost of a sequence in the model (no validity checks beyond Rotor's): the
    chain's live bytes (`ChainLiveBytes`, run_sequence's rules) plus the host copies' marks."""
    from planner.solvers.chain.sequence import run_sequence

    chain = problem.chain
    live = ChainLiveBytes(chain)
    cost = 0.0
    moved = 0
    pending = 0.0  # reload time issued before the next operation
    for it in items:
        if isinstance(it, Mark):
            nbytes = problem.e(it.stage) if it.kind in ("O", "F", "P") else chain.x(it.stage)
            if it.kind in ("F", "Fi"):
                live.release(nbytes)
            elif it.kind in ("P", "Pi"):
                live.add(nbytes)
                pending += (problem.reload_ms[it.stage - 1] if it.kind == "P"
                            else problem.input_reload_ms[it.stage - 1])
            else:
                moved += nbytes
            continue
        i = it.stage
        if pending:
            cost += max(0.0, pending - chain.stage(i).backward_ms)  # the reloads overlap B i
            pending = 0.0
        if it.kind in (OpKind.f_all, OpKind.f_ck, OpKind.f_none):
            live.forward(it.kind, i)
        elif it.kind is OpKind.backward:
            live.backward(i)
        else:
            live.discard(i)
    ops = [it for it in items if isinstance(it, Op)]
    cost += run_sequence(chain, ops).cost
    return Replay(live.step_peak_bytes, cost, moved)


@dataclass(frozen=True)
class PofoSolution:
    items: tuple[Item, ...] | None
    dp_cost_ms: float | None
    replay: Replay | None
    exact_slots: bool


def pofo_floor_s(length: int) -> float:
    """Seconds the DP takes at the fewest slots: its Python loop over (s, t, flags)."""
    return 3.0 * length * length * PER_CELL_S


def slots_for_time(length: int, time_s: float, slots: int) -> int:
    """Fewer slots when the DP (about L²·(L + 8)·slots steps) would outlast `time_s`."""
    fit = int(max(0.0, time_s) * DP_STEPS_PER_S / max(1, length * length * (length + 8)))
    return max(16, min(slots, fit))


def solve_pofo(problem: OffloadChain, budget_bytes: int, slots: int = 200) -> PofoSolution:
    chain = problem.chain
    memory = budget_bytes - chain.fixed_bytes - chain.input_bytes
    if memory < 0:
        return PofoSolution(None, None, None, True)
    # the tables hold 6·(L+2)²·(slots+1) entries: fewer slots on long chains (≤ ~2·10⁷)
    slots = max(16, min(slots, TABLE_ENTRIES // (6 * (chain.length + 2) ** 2)))
    disc = discretise(chain, memory, slots)
    unit = max(1, int(disc.slot_bytes))
    avail = disc.available_slots

    def sl(v: int) -> int:
        """Slots of v bytes, rounded up (exact when v is a multiple of the slot)."""
        if disc.exact:
            return -(-v // unit)
        return -(-v * avail // max(1, memory))

    length = chain.length
    x = np.array([sl(chain.x(i)) for i in range(length + 1)], dtype=np.int64)
    xbar = np.zeros(length + 2, dtype=np.int64)
    ftmp = np.zeros(length + 2, dtype=np.int64)
    all_need = np.zeros(length + 2, dtype=np.int64)
    btmp = np.zeros(length + 2, dtype=np.int64)
    e = np.zeros(length + 2, dtype=np.int64)
    fwd = np.zeros(length + 2)
    bwd = np.zeros(length + 2)
    for i, st in enumerate(chain.stages, start=1):
        xbar[i], ftmp[i], btmp[i] = sl(st.saved_bytes), sl(st.forward_tmp_bytes), \
            sl(st.backward_tmp_bytes)
        all_need[i] = max(x[i] + ftmp[i], xbar[i] + sl(st.all_tmp_bytes))
        e[i] = sl(problem.e(i))
        fwd[i], bwd[i] = st.forward_ms, st.backward_ms
    delta = np.array([sl(chain.delta(i)) for i in range(length + 1)], dtype=np.int64)
    prefix = np.concatenate([[0.0], np.cumsum(fwd[1 : length + 1])])
    step_need = np.zeros(length + 2, dtype=np.int64)
    step_need[2 : length + 1] = x[1:-1] + x[2:] + ftmp[2 : length + 1]

    inf = np.inf
    m_range = np.arange(avail + 1)

    def child_row(row: np.ndarray, d: int) -> np.ndarray:
        """out[m] = row[m - d] (m - d above the table: its last entry, a valid underuse)."""
        src = np.minimum(m_range - d, avail)
        out = np.full(avail + 1, inf)
        ok = src >= 0
        out[ok] = row[src[ok]]
        return out

    # table[k, s, t, m], k = 2h + g: least model cost of (s, t, m) with flags h (the parent's
    # e_{s-1} on the device: 1 in the first forward and in B s, 2 in B s only) and g (x_{s-2},
    # the grandparent's input, on the device in B s); choice: its first operation
    table = np.full((6, length + 2, length + 2, avail + 1), inf)
    choice = np.full((6, length + 2, length + 2, avail + 1), _INFEASIBLE, dtype=np.int32)
    for t in range(1, length + 1):
        # shifted[s', m] = C(s', t, m - x_{s'-1}, 0, 0) + Σ_{i<s'} f_i: the F_ck first child
        shifted = np.full((length + 2, avail + 1), inf)
        for s in range(t, 0, -1):
            # F_all s (with or without copies): the same candidates for every flag; the flags
            # only raise the memory threshold below which they are not allowed
            all_row = np.full(avail + 1, fwd[s] + bwd[s]) if s == t else np.full(avail + 1, inf)
            all_pick = np.full(avail + 1, _F_ALL, dtype=np.int32)
            if s < t:
                for off_e in (0, 1) if e[s] > 0 else (0,):
                    for off_in in (0, 1) if s >= 2 and x[s - 1] > 0 else (0,):
                        d = int(x[s] if off_e else xbar[s]) - (int(x[s - 1]) if off_in else 0)
                        reload = (problem.reload_ms[s - 1] if off_e else 0.0) + (
                            problem.input_reload_ms[s - 2] if off_in else 0.0)
                        expo = max(0.0, reload - bwd[s + 1])
                        cand = fwd[s] + bwd[s] + expo + child_row(
                            table[2 * off_e + off_in, s + 1, t], d)
                        better = cand < all_row - 1e-12
                        all_row[better] = cand[better]
                        all_pick[better] = _F_ALL + off_e + 2 * off_in
            for h in (0, 1, 2):
                for g in (0, 1):
                    if (h and s < 2) or (g and s < 3):
                        continue
                    extra = int(e[s - 1]) if h else 0
                    first = extra if h == 1 else 0
                    last_x = int(x[s - 2]) if g else 0
                    need_fwd = int(delta[t] + all_need[s]) + first
                    need_bwd = int(xbar[s] + delta[s] + delta[s - 1] + btmp[s]) + extra + last_x
                    lo = max(need_fwd, need_bwd, int(xbar[s]))
                    row = all_row.copy()
                    pick = all_pick.copy()
                    row[: min(lo, avail + 1)] = inf
                    pick[: min(lo, avail + 1)] = _INFEASIBLE
                    if s < t:
                        h2 = 2 if h else 0
                        need = delta[t] + np.maximum.accumulate(
                            np.concatenate([[x[s] + ftmp[s] + first], step_need[s + 1 : t]]))
                        total = shifted[s + 1 : t + 1] + table[2 * h2 + g, s, s:t]
                        total[m_range[None, :] < need[:, None]] = inf
                        k_best = np.argmin(total, axis=0)
                        ck = total[k_best, m_range] - prefix[s - 1]
                        better = ck < row - 1e-12
                        row[better] = ck[better]
                        pick[better] = _SPLIT + k_best[better] + s + 1
                    table[2 * h + g, s, t] = row
                    choice[2 * h + g, s, t] = pick
            shift = int(x[s - 1])
            if s > 1 and shift <= avail:
                shifted[s, shift:] = table[0, s, t, : avail + 1 - shift] + prefix[s - 1]
    best = table[0, 1, length, avail]
    if not np.isfinite(best):
        return PofoSolution(None, None, None, disc.exact)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * length + 100))
    try:
        items = _rebuild(choice, x, xbar, avail, 1, length, avail, 0, 0)
    finally:
        sys.setrecursionlimit(limit)
    return PofoSolution(tuple(items), float(best), replay(problem, items), disc.exact)


def _rebuild(choice: np.ndarray, x: np.ndarray, xbar: np.ndarray, avail: int, s: int, t: int,
             m: int, h: int, g: int) -> list[Item]:
    c = int(choice[2 * h + g, s, t, m])
    if c == _INFEASIBLE:
        raise AssertionError(f"no choice recorded for ({s}, {t}, {m}, {h}, {g})")
    if c < _SPLIT:
        bits = c - _F_ALL
        off_e, off_in = bits & 1, bits >> 1
        if s == t:
            return [Op(OpKind.f_all, s), Op(OpKind.backward, s)]
        d = int(x[s] if off_e else xbar[s]) - (int(x[s - 1]) if off_in else 0)
        child = _rebuild(choice, x, xbar, avail, s + 1, t, min(m - d, avail), off_e, off_in)
        return [
            *([Mark("Oi", s - 1)] if off_in else []), Op(OpKind.f_all, s),
            *([Mark("O", s)] if off_e else []), *([Mark("Fi", s - 1)] if off_in else []),
            child[0], *([Mark("F", s)] if off_e else []), *child[1:-1],
            *([Mark("P", s)] if off_e else []), *([Mark("Pi", s - 1)] if off_in else []),
            child[-1], Op(OpKind.backward, s),
        ]
    split = c - _SPLIT
    h2 = 2 if h else 0
    return [
        Op(OpKind.f_ck, s),
        *(Op(OpKind.f_none, k) for k in range(s + 1, split)),
        *_rebuild(choice, x, xbar, avail, split, t, m - int(x[split - 1]), 0, 0),
        Op(OpKind.discard, split - 1),
        *_rebuild(choice, x, xbar, avail, s, split - 1, m, h2, g),
    ]


def items_text(items: Sequence[Item]) -> str:
    return " ".join(str(i) for i in items)
