"""Peak-directed reordering: local search on the order of first computations for store-all.

A list scheduler (`orders.greedy_order`) decides node by node and cannot see that computing a
value early keeps it resident for a long time: on wide graphs (random layered DAGs) many values
are read only by the sink, and each one computed early sits in memory to the end. This search
starts from an order and moves nodes across the stage where the store-all peak is reached:
- a value resident across the peak is computed later (as late as its first reader allows, or
  just past the peak), so that it no longer occupies the peak;
- a node after the peak that is the last reader of values resident at the peak is computed
  earlier (as early as its inputs allow, or just before the peak), so that they are freed.
Each move is judged exactly by the store-all stage totals (the simulator's accounting,
`CheckpointPlan`'s stage peaks with every value kept), lexicographically on the peak and then on
the bytes over the target summed over all stages, so moves on a plateau of equal peaks still
count; moves at the other steps over the target are tried when none at the peak helps. A move
is judged on the steps between its old and new place alone (`order_eval.OrderState`), in
O(span) rather than O(n + e). Local optima are escaped by iterated local search (random moves
within each node's window, then descent again; kept when lower); `Reorderer` keeps one search
for repeated kicks (auto's improvement phase, `improve_large`).
An order whose store-all peak fits the budget is optimal (every node computed once);
otherwise the lower-peak order leaves far less for checkpoint eviction to do: on
`random_layered_dag(1000, seed=0)` at 0.8 of store-all, greedy eviction gets stuck in every
list-scheduled order but fits in a lowered one (the peak goes from 0.915 to about 0.82).
"""

from __future__ import annotations

import random
import time

import numpy as np

from planner.core.graph import Graph
from planner.solvers.remat.order_eval import Move, OrderState
from planner.solvers.remat.problem import RematProblem, problem_from_graph

MAX_MOVES_PER_STEP = 200  # candidate moves judged per step (largest values first)
LARGE_NODES = 2000  # above: first-improvement descent over every candidate move
KICK_MOVES = 12  # random moves between two local searches (iterated local search)
MAX_PEAK_STEPS = 24  # steps over the target whose moves are tried when the peak's do not help


class OrderSearch:
    """The store-all stage totals of an order of positions (of `problem`, whose positions
    follow a topological order), and peak-lowering moves on it."""

    def __init__(self, graph: Graph, problem: RematProblem) -> None:
        self.problem = problem
        index = graph.index
        pos = {v: i for i, v in enumerate(problem.node_ids)}
        n = problem.n
        # position -> positions that must come before it (data inputs and ordering rule)
        self.before: list[tuple[int, ...]] = [
            tuple(sorted({*problem.deps[i], *(pos[u] for u in index.order_predecessors[v])}))
            for i, v in enumerate(problem.node_ids)]
        after: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for u in self.before[i]:
                after[u].append(i)
        self.after = [tuple(a) for a in after]  # position -> positions that must come after it
        self.max_moves = MAX_MOVES_PER_STEP  # candidate moves judged per step
        self.bytes = problem.stage_bytes  # the stage arithmetic (the problem's ledger's rules)
        # arrays for `score`: the readers of each value with readers, flat (CSR)
        self._read = np.array([i for i in range(n) if problem.users[i]], dtype=np.int64)
        self._readers = np.array([w for i in range(n) for w in problem.users[i]], dtype=np.int64)
        starts = np.cumsum([0] + [len(problem.users[i]) for i in range(n) if problem.users[i]])
        self._starts = starts[:-1].astype(np.int64)

    def stage_bytes(self, seq: list[int]) -> tuple[list[int], list[int], list[int]]:
        """(bytes while each step of `seq` runs, step of each position, last step each
        position's value is read); store-all: a value is freed after its last reader."""
        stages, at, last = self._stages(np.array(seq, dtype=np.int64))
        return stages.tolist(), at.tolist(), last.tolist()

    def _stages(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(seq)
        at = np.empty(n, dtype=np.int64)
        at[seq] = np.arange(n, dtype=np.int64)
        last = at.copy()
        if len(self._read):
            last[self._read] = np.maximum.reduceat(at[self._readers], self._starts)
        # step -> net bytes it adds: its first computation less the values it frees
        change = self.bytes.first_np[seq] - self.bytes.freed_at(last)
        return self.bytes.run(seq, change, 0)[0], at, last

    def score(self, seq: list[int], target: int) -> tuple[int, int]:
        stages = self._stages(np.array(seq, dtype=np.int64))[0]
        over = stages - target
        return int(stages.max()), int(over[over > 0].sum())

    def _moves(self, seq: list[int], k: int, at: list[int], last: list[int]
               ) -> list[tuple[int, int]]:
        """Candidate (position, new step) moves across peak step k."""
        mem = self.problem.mem_bytes
        moves: list[tuple[int, int]] = []
        later = [u for u in seq[:k] if last[u] > k]
        later.sort(key=lambda u: -mem[u])
        for u in later[:self.max_moves // 2]:
            latest = min((at[w] for w in self.after[u]), default=len(seq)) - 1
            moves.append((u, latest))
            if latest > k:
                moves.append((u, k))
        resident = set(seq[:k])
        earlier = {w for u in later for w in self.problem.users[u] if at[w] > k}
        ranked = sorted(earlier, key=lambda w: -sum(
            mem[u] for u in self.problem.deps[w] if u in resident and last[u] == at[w]))
        for w in ranked[:self.max_moves // 2]:
            earliest = max((at[u] for u in self.before[w]), default=-1) + 1
            moves.append((w, earliest))
            if earliest < k:
                moves.append((w, k))
        return moves

    def improve(self, seq: list[int], target: int, deadline: float,
                first_improvement: bool = False) -> list[int]:
        """Moves that lower (peak, bytes over target), until none does, the peak reaches
        `target` or `deadline` passes. Moves across the peak step first; when none helps
        there, across the other steps over the target, highest first. Each move is judged
        on the steps it changes alone (`order_eval.OrderState`)."""
        state = OrderState(self.problem, seq, target)
        while state.score[0] > target and time.perf_counter() < deadline:
            stages = state.stages
            over = np.flatnonzero(stages > target)
            over = over[np.argsort(-stages[over], kind="stable")][:MAX_PEAK_STEPS].tolist()
            order, at, last = state.order, state.at.tolist(), state.last_step()
            found: Move | None = None
            tried: set[tuple[int, int]] = set()
            for k in over:
                for v, step in self._moves(order, k, at, last):
                    if (v, step) in tried or time.perf_counter() > deadline:
                        continue
                    tried.add((v, step))
                    move = state.try_move(at[v], step)
                    if move is None or move.score >= state.score:
                        continue
                    if found is None or move.score < found.score:
                        found = move
                        if first_improvement:
                            break
                if found is not None:
                    break
            if found is None:
                break
            state.commit(found)
        return state.order


def kicked(search: OrderSearch, seq: list[int], rng: random.Random, moves: int) -> list[int]:
    """`seq` after `moves` random moves, each within the node's window (after its last
    predecessor, before its first successor)."""
    out = list(seq)
    at = [0] * len(out)
    for k, v in enumerate(out):
        at[v] = k
    for _ in range(moves):
        v = rng.choice(out)
        low = max((at[u] for u in search.before[v]), default=-1) + 1
        high = min((at[w] for w in search.after[v]), default=len(out)) - 1
        src = at[v]
        dst = rng.randint(low, high)  # a step of the list without v: both ends are valid
        if dst == src:
            continue
        del out[src]
        out.insert(dst, v)
        for k in range(min(src, dst), max(src, dst) + 1):
            at[out[k]] = k
    return out


class Reorderer:
    """Peak-lowering on orders of node ids of one graph, its search built once: a local
    search from an order, optionally after random moves (a kick)."""

    def __init__(self, graph: Graph, budget_bytes: int) -> None:
        self.problem = problem_from_graph(graph, budget_bytes)
        self.search = OrderSearch(graph, self.problem)
        self.budget_bytes = budget_bytes
        self.pos = {v: i for i, v in enumerate(self.problem.node_ids)}
        self.large = self.problem.n > LARGE_NODES
        if self.large:  # the first improving move among all candidates: seconds at 5,000
            self.search.max_moves = self.problem.n

    def lower(self, order: list[int], deadline: float, rng: random.Random | None = None,
              kick: int = 0, first_improvement: bool | None = None) -> tuple[list[int], int]:
        """(order after `kick` random moves and a local search, its store-all peak)."""
        seq = [self.pos[v] for v in order]
        if rng is not None and kick > 0:
            seq = kicked(self.search, seq, rng, kick)
        first = self.large if first_improvement is None else first_improvement
        seq = self.search.improve(seq, self.budget_bytes, deadline, first_improvement=first)
        return self.ids(seq), self.search.score(seq, self.budget_bytes)[0]

    def ids(self, seq: list[int]) -> list[int]:
        return [self.problem.node_ids[i] for i in seq]


def lowered_order(graph: Graph, order: list[int], budget_bytes: int, deadline: float,
                  seed: int = 0, *, iterate: bool = True, kick: int = KICK_MOVES,
                  max_kicks: int | None = None, stop_below: int | None = None
                  ) -> tuple[list[int], int]:
    """`order` (node ids, topological) after peak-lowering moves: (order, store-all peak).

    A local search with the best move at each step (on graphs over LARGE_NODES: the first
    improving one, among all moves), then (with `iterate`), until the peak fits the budget or
    the deadline passes, iterated local search: `kick` random moves from the best order so far, a
    first-improvement search from there, kept when its peak is lower (at most `max_kicks` times:
    the same result on a slower machine, unless the deadline comes first), or until the peak
    is below `stop_below` (the caller has a use for such an order at once)."""
    reorder = Reorderer(graph, budget_bytes)
    rng = random.Random(seed)
    best, peak = reorder.lower(order, deadline)
    best_score = reorder.search.score([reorder.pos[v] for v in best], budget_bytes)
    kicks = 0
    while (iterate and best_score[0] > budget_bytes and time.perf_counter() < deadline
           and (max_kicks is None or kicks < max_kicks)
           and (stop_below is None or best_score[0] >= stop_below)):
        kicks += 1
        trial, _ = reorder.lower(best, deadline, rng, kick, first_improvement=True)
        score = reorder.search.score([reorder.pos[v] for v in trial], budget_bytes)
        if score < best_score:
            best, best_score = trial, score
    return best, best_score[0]
