"""Rotor: the optimal checkpointing DP for heterogeneous chains (Beaumont et al. 2019).

Subproblem (s, t, m): a^{s-1} and δ^t are resident, the memory above what else is resident
(δ^t counted, a^{s-1} not) is m; produce δ^{s-1} at the least compute. C(s, t, m) is its cost:

- s = t: F_all s, B s.
  Needs m ≥ δ_t + max(x_s + ftmp_s, x̄_s + atmp_s) (atmp: the forward's temporaries under
  full saving) and m ≥ x̄_s + δ_s + δ_{s-1} + btmp_s.
- F_all s, then (s+1, t, m - x̄_s), then B s. Same two conditions.
- F_ck s, F_∅ s+1 .. s'-1 (s < s' ≤ t), then (s', t, m - x_{s'-1}), discard a^{s'-1}, then
  (s, s'-1, m). Needs m ≥ δ_t + max(x_s + ftmp_s, max_{s<k<s'} x_{k-1} + x_k + ftmp_k).

These conditions are exactly the peaks of `planner.solvers.chain.sequence.run_sequence`, so the
sequence the DP returns peaks at most at the budget (and its exact peak is reported).

Saving options (`options`: other chains of the same stages, forwards and checkpoints, whose
stages keep less under F_all and recompute the rest in their backward,
`planner.solvers.chain.saving`):
the F_all branch takes the cheapest option that fits, per stage, so the DP chooses how much
each F_all keeps (the block-level choice of Rockmate, Zhao et al. 2023, over a few levels).

Optimality holds within Rotor's class of sequences: a checkpoint stays resident until the
backward pass is back to it (F_∅ never consumes one). Brute force over that class agrees with
the DP (tests/solvers/test_chain_rotor.py); outside it, freeing a checkpoint early and recomputing
it later can be cheaper on some chains (`test_rotor_class_rules_matter`).

Memory is counted in slots: when the whole budget above fixed memory and a^0 is at most
`slots` multiples of the gcd of all sizes, that gcd is the slot and the DP is exact; otherwise
the budget is cut into `slots` equal slots and every size is rounded up to whole slots, so a
plan feasible for the DP never exceeds the budget. The inner loops run over memory (and over
the split point s') as NumPy arrays: O(L³·M) work in O(L²) NumPy calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import reduce

import numpy as np

from planner.solvers.chain.model import Chain
from planner.solvers.chain.sequence import Op, OpKind, run_sequence, store_all_ops

DEFAULT_SLOTS = 500
# choice codes: -1 infeasible; 0 F_all (option 0); -(o + 1) F_all with option o ≥ 1; a value
# s' ≥ 2 is the F_ck split point
_INFEASIBLE, _F_ALL = -1, 0


def _f_all_code(option: int) -> int:
    return _F_ALL if option == 0 else -(option + 1)


@dataclass(frozen=True)
class Discretisation:
    slot_bytes: float  # bytes per slot
    available_slots: int  # slots in the budget (above fixed memory and a^0)
    exact: bool  # sizes are whole multiples of the slot: no rounding loss

    def slots(self, size_bytes: int, budget_bytes: int) -> int:
        if self.exact:  # rounded up: saving options' sizes need not be whole slots
            return -(-size_bytes // int(self.slot_bytes))
        # ceil(size * M / budget) in integers: rounding up keeps every plan within the budget
        return -(-size_bytes * self.available_slots // budget_bytes)


@dataclass(frozen=True)
class RotorSolution:
    ops: tuple[Op, ...] | None  # None: no sequence fits
    cost: float | None  # exact compute of `ops`
    peak_bytes: int | None  # exact peak of `ops`, fixed memory included
    dp_cost: float | None  # the DP's value (equals `cost` up to float rounding)
    discretisation: Discretisation | None
    solve_seconds: float
    smallest_feasible_bytes: int | None  # exact peak of the DP's least-memory sequence
    stage_options: tuple[int, ...] = ()  # per stage: its option (0: `chain`); () without options


def discretise(chain: Chain, memory_bytes: int, slots: int) -> Discretisation:
    sizes = [chain.input_bytes]
    for s in chain.stages:
        sizes += [
            s.output_bytes,
            s.saved_bytes,
            s.forward_tmp_bytes,
            s.all_tmp_bytes,
            s.backward_tmp_bytes,
            s.grad_input_bytes,
        ]
    unit = reduce(math.gcd, (v for v in sizes if v > 0), 0) or 1
    if memory_bytes // unit <= slots:
        return Discretisation(float(unit), memory_bytes // unit, True)
    return Discretisation(memory_bytes / slots, slots, False)


class RotorTimeout(TimeoutError):
    """The DP's tables were not finished by the deadline."""


def solve_rotor(
    chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS, *, refine: int = 0,
    deadline: float | None = None, options: Sequence[Chain] = (),
    refine_deadline: float | None = None,
) -> RotorSolution:
    """The least-compute operation sequence whose exact peak (fixed memory included) fits.

    refine > 0: rounding sizes up to slots loses up to a few slots of budget; try that many
    DP runs at inflated budgets (binary search up to 8 slots more) and keep the cheapest
    sequence whose exact peak still fits. The store-all sequence is always a candidate, so the
    result is never worse than store-all where it fits. `deadline` (a time.perf_counter()
    value): the first DP raises RotorTimeout past it; refinements past it (or past
    `refine_deadline`, when earlier) are skipped.
    `options`: saving options (see the module's doc); the solution's `stage_options` says
    which each stage takes and `combined(chain, options, ...)` is the chain it runs on.
    """
    started = time.perf_counter()
    chains = (chain, *options)
    memory = budget_bytes - chain.fixed_bytes - chain.input_bytes
    if memory < 0 or slots < 1:
        return RotorSolution(None, None, None, None, None, time.perf_counter() - started, None)
    disc, ops, dp_cost, picks = _solve_once(chains, memory, slots, deadline)
    no_options = (0,) * chain.length
    best: tuple[float, list[Op], float | None, tuple[int, ...]] | None = None
    if ops is not None:
        best = (run_sequence(combined(chain, options, picks), ops).cost, ops, dp_cost, picks)
    candidates = [(store_all_ops(chain.length), no_options)]
    until = deadline if refine_deadline is None else min(refine_deadline, deadline or math.inf)
    if refine > 0 and not disc.exact:
        lo, hi = memory, memory + int(8 * disc.slot_bytes) + 1
        for _ in range(refine):
            mid = (lo + hi) // 2
            try:
                _, extra, _, extra_picks = _solve_once(chains, mid, slots, until)
            except RotorTimeout:
                break
            if extra is not None and run_sequence(
                    combined(chain, options, extra_picks), extra).peak_bytes <= budget_bytes:
                candidates.append((extra, extra_picks))
                lo = mid
            else:
                hi = mid
    for cand, cand_picks in candidates:
        run = run_sequence(combined(chain, options, cand_picks), cand)
        if run.peak_bytes <= budget_bytes and (best is None or run.cost < best[0] - 1e-12):
            best = (run.cost, cand, None, cand_picks)
    if best is None:  # rounding may hide a sequence that fits: try the least-memory one
        least = _least_memory_ops(chain, slots, deadline)
        run = run_sequence(chain, least)
        if run.peak_bytes > budget_bytes:
            elapsed = time.perf_counter() - started
            return RotorSolution(None, None, None, None, disc, elapsed, run.peak_bytes)
        best = (run.cost, least, None, no_options)
    run = run_sequence(combined(chain, options, best[3]), best[1])
    return RotorSolution(
        ops=tuple(best[1]),
        cost=run.cost,
        peak_bytes=run.peak_bytes,
        dp_cost=best[2],
        discretisation=disc,
        solve_seconds=time.perf_counter() - started,
        smallest_feasible_bytes=None,
        stage_options=best[3] if options else (),
    )


def combined(chain: Chain, options: Sequence[Chain], picks: Sequence[int]) -> Chain:
    """`chain` with each stage i taken from option picks[i - 1] (0: `chain` itself)."""
    if not options or not any(picks):
        return chain
    chains = (chain, *options)
    return replace(chain, stages=tuple(chains[o].stages[i] for i, o in enumerate(picks)))


def _solve_once(
    chains: Sequence[Chain], memory: int, slots: int, deadline: float | None = None
) -> tuple[Discretisation, list[Op] | None, float | None, tuple[int, ...]]:
    chain = chains[0]
    disc = discretise(chain, memory, slots)  # the plain chain's: options never round it worse
    table, choice, sizes = _tables(chains, disc, memory, deadline)
    length, avail = chain.length, disc.available_slots
    best = table[1, length, avail]
    if not np.isfinite(best):
        return disc, None, None, (0,) * length
    ops, picks = _rebuild(choice, sizes, 1, length, avail)
    return disc, ops, float(best), picks


def _least_memory_ops(chain: Chain, slots: int, deadline: float | None = None) -> list[Op]:
    """The DP's least-memory sequence (discretised at the store-all budget)."""
    full_ops = store_all_ops(chain.length)
    full = run_sequence(chain, full_ops).peak_bytes
    memory = full - chain.fixed_bytes - chain.input_bytes
    disc = discretise(chain, memory, slots)
    table, choice, sizes = _tables((chain,), disc, memory, deadline)
    feasible = np.flatnonzero(np.isfinite(table[1, chain.length, :]))
    if not feasible.size:  # store-all always fits its own peak; defensive only
        return full_ops
    ops, _ = _rebuild(choice, sizes, 1, chain.length, int(feasible[0]))
    return ops if run_sequence(chain, ops).peak_bytes <= full else full_ops


@dataclass(frozen=True)
class _Sizes:
    x: np.ndarray  # x[i]: slots of a^i, i = 0..L
    xbar: np.ndarray  # xbar[o, i]: slots of ā^i under option o, i = 1..L
    delta: np.ndarray  # delta[i]: slots of δ^i, i = 0..L (δ^L = 0)


def _tables(
    chains: Sequence[Chain], disc: Discretisation, memory: int, deadline: float | None = None
) -> tuple[np.ndarray, np.ndarray, _Sizes]:
    """table[s, t, m] = C(s, t, m) in slots; choice[s, t, m] = its first operation. `chains`:
    the chain, then its saving options (same forwards and checkpoints)."""
    chain = chains[0]
    length, avail = chain.length, disc.available_slots

    def sl(v: int) -> int:
        return disc.slots(v, memory)

    x = np.array([sl(chain.x(i)) for i in range(length + 1)], dtype=np.int64)
    ftmp = np.zeros(length + 1, dtype=np.int64)
    fwd_ms = np.zeros(length + 1)
    for i, st in enumerate(chain.stages, start=1):
        ftmp[i], fwd_ms[i] = sl(st.forward_tmp_bytes), st.forward_ms
    # per option o: xbar[o, i] (ā^i), all_need[o, i] (F_all's forward peak above the
    # resident), btmp[o, i] and bwd_ms[o, i] (its backward's temporaries and compute)
    shape = (len(chains), length + 1)
    xbar, all_need, btmp = (np.zeros(shape, dtype=np.int64) for _ in range(3))
    bwd_ms = np.zeros(shape)
    for o, option in enumerate(chains):
        for i, st in enumerate(option.stages, start=1):
            xbar[o, i], btmp[o, i] = sl(st.saved_bytes), sl(st.backward_tmp_bytes)
            bwd_ms[o, i] = st.backward_ms
            all_need[o, i] = max(x[i] + ftmp[i], xbar[o, i] + sl(st.all_tmp_bytes))
    delta = np.array([sl(chain.delta(i)) for i in range(length + 1)], dtype=np.int64)
    prefix_fwd = np.concatenate([[0.0], np.cumsum(fwd_ms[1:])])  # prefix_fwd[k] = Σ_{i≤k} f_i
    # a forward step k run by F_∅ holds a^{k-1}, a^k and its temporaries
    step_need = np.zeros(length + 1, dtype=np.int64)
    step_need[2:] = x[1:-1] + x[2:] + ftmp[2:]

    inf = np.inf
    m_range = np.arange(avail + 1)
    # table[s, t, m]: C(s, t, m); choice[s, t, m]: the first operation of the best sequence
    table = np.full((length + 2, length + 2, avail + 1), inf)
    choice = np.full((length + 2, length + 2, avail + 1), _INFEASIBLE, dtype=np.int16)
    for t in range(1, length + 1):
        if deadline is not None and time.perf_counter() > deadline:
            raise RotorTimeout(f"chain DP: {t - 1} of {length} table columns by the deadline")
        # shifted[s', m] = C(s', t, m - x_{s'-1}) + Σ_{i<s'} f_i: the F_ck option's first part
        shifted = np.full((length + 2, avail + 1), inf)
        for s in range(t, 0, -1):
            row = np.full(avail + 1, inf)
            pick = np.full(avail + 1, _INFEASIBLE, dtype=np.int16)
            for o in range(len(chains)):
                # F_all s keeping option o's ā^s, then (s+1, t, m - x̄_s) unless s = t, then B s
                need_all = max(delta[t] + all_need[o, s],
                               xbar[o, s] + delta[s] + delta[s - 1] + btmp[o, s])
                lo = max(need_all, xbar[o, s])
                if lo > avail:
                    continue
                cand = np.full(avail + 1, inf)
                cand[lo:] = fwd_ms[s] + bwd_ms[o, s]
                if s < t:
                    cand[lo:] += table[s + 1, t, lo - xbar[o, s]: avail + 1 - xbar[o, s]]
                better = cand < row
                row[better] = cand[better]
                pick[better] = _f_all_code(o)
            if s < t:  # F_ck s, F_∅ up to s'-1, for every split s' = s+1..t at once
                need = delta[t] + np.maximum.accumulate(
                    np.concatenate([[x[s] + ftmp[s]], step_need[s + 1 : t]])
                )  # need[k]: forward peak for s' = s+1+k
                total = shifted[s + 1 : t + 1] + table[s, s:t]
                total[m_range[None, :] < need[:, None]] = inf
                k_best = np.argmin(total, axis=0)
                ck = total[k_best, m_range] - prefix_fwd[s - 1]
                better = ck < row
                row[better] = ck[better]
                pick[better] = (k_best[better] + s + 1).astype(np.int16)
            table[s, t] = row
            choice[s, t] = pick
            shift = x[s - 1]
            if s > 1 and shift <= avail:
                shifted[s, shift:] = row[: avail + 1 - shift] + prefix_fwd[s - 1]
    return table, choice, _Sizes(x=x, xbar=xbar, delta=delta)


def _rebuild(choice: np.ndarray, sizes: _Sizes, s: int, t: int, m: int
             ) -> tuple[list[Op], tuple[int, ...]]:
    """The sequence of subproblem (s, t, m) and each stage's saving option."""
    ops: list[Op] = []
    picks = [0] * (choice.shape[0] - 2)
    # explicit stack: ("solve", s, t, m) expands; ("op", Op) emits
    stack: list[tuple] = [("solve", s, t, m)]
    while stack:
        item = stack.pop()
        if item[0] == "op":
            ops.append(item[1])
            continue
        _, s, t, m = item
        c = int(choice[s, t, m])
        if c == _INFEASIBLE:
            raise AssertionError(f"no choice recorded for ({s}, {t}, {m})")
        if c <= _F_ALL:
            option = 0 if c == _F_ALL else -c - 1
            picks[s - 1] = option
            ops.append(Op(OpKind.f_all, s))
            later: list[tuple] = []
            if s < t:
                later.append(("solve", s + 1, t, m - int(sizes.xbar[option, s])))
            later.append(("op", Op(OpKind.backward, s)))
        else:
            split = c
            ops.append(Op(OpKind.f_ck, s))
            ops.extend(Op(OpKind.f_none, k) for k in range(s + 1, split))
            later = [
                ("solve", split, t, m - int(sizes.x[split - 1])),
                ("op", Op(OpKind.discard, split - 1)),
                ("solve", s, split - 1, m),
            ]
        stack.extend(reversed(later))
    return ops, tuple(picks)
