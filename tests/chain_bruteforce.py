"""Brute-force optimal chain operation sequences for tiny chains (test helper, not a test module).

Dijkstra over the states of `planner.solvers.chain.sequence.run_sequence` (resident a^i, which of
them
are checkpoints, resident ā^i, resident δ^i, finished backwards): every operation sequence is a
path, memory is a function of the state, so the least-cost path whose every step peaks within
the budget is the optimum over all sequences of F_all, F_ck, F_∅, B and D in Rotor's class:

- a checkpoint (the input a^{i-1} of an F_ck i) is never freed by F_∅;
- a resident a^j is discarded (D j) only after B_{j+1} has run: checkpoints persist until the
  backward pass is back to them (this implies that the input of a kept ā^{j+1} stays).

Without these two rules, sequences exist that beat Rotor's DP (it assumes both); see
`test_chain_rotor.py::test_rotor_class_rules_matter`. Independent of the DP's recursion.
"""

from __future__ import annotations

import heapq
import itertools

from planner.solvers.chain.model import Chain
from planner.solvers.chain.sequence import Op, OpKind, run_sequence

# (resident a^i, checkpoints among them, resident ā^i, resident δ^i, finished backwards)
State = tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int], frozenset[int]]


def _moves(chain: Chain, state: State, rotor_class: bool) -> list[Op]:
    acts, ckpts, saved, grads, done = state
    length = chain.length
    out: list[Op] = []
    for i in range(1, length + 1):
        if i - 1 in acts and i not in acts and i not in done:
            out += [Op(OpKind.f_all, i), Op(OpKind.f_ck, i)]
            if i - 1 not in saved and not (rotor_class and i - 1 in ckpts):
                out.append(Op(OpKind.f_none, i))
        if i in saved and i - 1 in acts and (i == length or i in grads) and i not in done:
            out.append(Op(OpKind.backward, i))
    for i in acts:
        if i > 0 and i not in saved and not (rotor_class and i + 1 not in done):
            out.append(Op(OpKind.discard, i))
    return out


def _step(chain: Chain, state: State, op: Op) -> tuple[State, int, float]:
    """Next state, peak during the step (without fixed memory), cost."""
    acts, ckpts, saved, grads, done = (set(s) for s in state)
    i = op.stage
    mem = _memory(chain, state)
    if op.kind in (OpKind.f_all, OpKind.f_ck, OpKind.f_none):
        st = chain.stage(i)
        peak = mem + (
            st.all_forward_peak_bytes
            if op.kind is OpKind.f_all
            else st.output_bytes + st.forward_tmp_bytes
        )
        acts.add(i)
        if op.kind is OpKind.f_all:
            saved.add(i)
        if op.kind is OpKind.f_ck:
            ckpts.add(i - 1)
        if op.kind is OpKind.f_none:
            acts.discard(i - 1)
        cost = st.forward_ms
    elif op.kind is OpKind.backward:
        st = chain.stage(i)
        peak = mem + st.grad_input_bytes + st.backward_tmp_bytes
        acts.discard(i)
        saved.discard(i)
        grads.discard(i)
        grads.add(i - 1)
        done.add(i)
        cost = st.backward_ms
    else:
        acts.discard(i)
        peak, cost = mem, 0.0
    ckpts &= acts
    nxt = (frozenset(acts), frozenset(ckpts), frozenset(saved), frozenset(grads), frozenset(done))
    return nxt, peak, cost


def _memory(chain: Chain, state: State) -> int:
    acts, _, saved, grads, _ = state
    total = sum(chain.x(i) for i in acts if i not in saved)
    total += sum(chain.stage(i).saved_bytes for i in saved)
    total += sum(chain.delta(i) for i in grads)
    return total


def brute_force(
    chain: Chain, budget_bytes: int, *, rotor_class: bool = True
) -> tuple[float, list[Op]] | None:
    """The least cost of any sequence peaking within the budget (fixed memory included)."""
    limit = budget_bytes - chain.fixed_bytes
    empty: frozenset[int] = frozenset()
    start: State = (frozenset({0}), empty, empty, empty, empty)
    if chain.input_bytes > limit:
        return None
    counter = itertools.count()
    best: dict[State, float] = {start: 0.0}
    heap: list[tuple[float, int, State, list[Op]]] = [(0.0, next(counter), start, [])]
    while heap:
        cost, _, state, ops = heapq.heappop(heap)
        if cost > best.get(state, float("inf")):
            continue
        if len(state[4]) == chain.length:
            assert run_sequence(chain, ops).complete
            return cost, ops
        for op in _moves(chain, state, rotor_class):
            nxt, peak, step_cost = _step(chain, state, op)
            if peak > limit:
                continue
            new_cost = cost + step_cost
            if new_cost < best.get(nxt, float("inf")) - 1e-12:
                best[nxt] = new_cost
                heapq.heappush(heap, (new_cost, next(counter), nxt, ops + [op]))
    return None
