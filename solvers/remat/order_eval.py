"""Store-all stage totals of an order, updated move by move: the core of peak-directed reordering.

With every value kept, the bytes resident while step k runs are the fixed bytes, plus what the
steps before k left resident, plus step k's output and workspace (the simulator's accounting):
step k adds its node's output and held bytes and frees each value whose last reader it is (a
value nobody reads is freed at its own step). Moving one node x from step `src` to step `dst`
changes only the steps between the two: every other node keeps its relative order, so a value's
last reader changes only when it is an input of x, and then both the old and the new last reader
lie between `src` and `dst`; what is resident before the first step of that range and after its
last one is unchanged. `OrderState.try_move` re-evaluates that range alone (numpy on the slice)
and scores the move against prefix and suffix aggregates of the other steps, so a move costs
O(|dst − src|) instead of O(n + e); `commit` applies it and refreshes the aggregates (O(n) in
numpy, once per accepted move).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.remat.problem import RematProblem

Score = tuple[int, int]  # (peak bytes, bytes over the target summed over every step)


@dataclass(frozen=True)
class Move:
    """A judged move: node `node` from step `src` to step `dst` (a step of the new order)."""

    node: int
    src: int
    dst: int
    score: Score
    segment: np.ndarray  # positions at steps lo..hi after the move
    stages: np.ndarray  # bytes while each of those steps runs
    resident: np.ndarray  # bytes resident before each of those steps
    last_reader: dict[int, int]  # inputs of `node` whose last reader changes -> new reader
    gain: dict[int, int]  # positions whose net bytes added change -> new net bytes


class OrderState:
    """An order of the positions of `problem` (topological) with its store-all stage totals."""

    def __init__(self, problem: RematProblem, seq: list[int], target: int) -> None:
        n = problem.n
        self.problem = problem
        self.n = n
        self.target = target
        self.users = problem.users
        self.deps = [tuple(set(d)) for d in problem.deps]
        self.mem = np.array(problem.mem_bytes, dtype=np.int64)
        self.load = self.mem + np.array(problem.workspace_bytes, dtype=np.int64)
        self._mem = problem.mem_bytes
        self._added = [problem.mem_bytes[i] + problem.held(i) for i in range(n)]
        self.reset(seq)

    def reset(self, seq: list[int]) -> None:
        """Start over from the order `seq` (positions)."""
        n = self.n
        self.seq = np.array(seq, dtype=np.int64)
        self.at = np.empty(n, dtype=np.int64)
        self.at[self.seq] = np.arange(n, dtype=np.int64)
        at = self.at.tolist()
        # value -> its last reader (itself when nobody reads it)
        self.last_reader = [max(us, key=at.__getitem__) if us else v
                            for v, us in enumerate(self.users)]
        frees = [0] * n
        for v, w in enumerate(self.last_reader):
            frees[w] += self._mem[v]
        self.gain = np.array([self._added[v] - frees[v] for v in range(n)], dtype=np.int64)
        change = self.gain[self.seq]
        self.resident = np.concatenate(([0], np.cumsum(change)[:-1])).astype(np.int64)
        self.stages = self.problem.fixed_bytes + self.resident + self.load[self.seq]
        self._aggregate()

    def _aggregate(self) -> None:
        st = self.stages
        over = np.maximum(st - self.target, 0)
        self.prefix_max = np.concatenate(([-1], np.maximum.accumulate(st)))
        self.suffix_max = np.concatenate((np.maximum.accumulate(st[::-1])[::-1], [-1]))
        self.prefix_over = np.concatenate(([0], np.cumsum(over)))
        self.score: Score = (int(self.prefix_max[-1]), int(self.prefix_over[-1]))

    @property
    def order(self) -> list[int]:
        return self.seq.tolist()

    def last_step(self) -> list[int]:
        """Step of each value's last reader (its own step when nobody reads it)."""
        return self.at[np.array(self.last_reader, dtype=np.int64)].tolist()

    def try_move(self, src: int, dst: int) -> Move | None:
        """The order with the node at step `src` moved to step `dst`, judged; None when it
        is no move. The caller keeps moves within the node's window (topological)."""
        if src == dst or not (0 <= dst < self.n):
            return None
        seq, at = self.seq, self.at
        x = int(seq[src])
        later = src < dst
        lo, hi = (src, dst) if later else (dst, src)
        readers: dict[int, int] = {}
        gain: dict[int, int] = {}
        for u in self.deps[x]:
            old = self.last_reader[u]
            if old == x:
                # moved later it stays the last reader; moved earlier, the latest of the
                # others (each one step later inside lo..hi) may overtake it
                new = x if later else self._latest_reader(u, x, dst, lo, hi)
            else:
                k = int(at[old])
                if not later and lo <= k <= hi:
                    k += 1
                elif later and lo <= k <= hi:
                    k -= 1
                new = x if dst > k else old
            if new != old:
                readers[u] = new
                gain[old] = gain.get(old, int(self.gain[old])) + self._mem[u]
                gain[new] = gain.get(new, int(self.gain[new])) - self._mem[u]
        segment = np.empty(hi - lo + 1, dtype=np.int64)
        if later:
            segment[:-1] = seq[src + 1:dst + 1]
            segment[-1] = x
        else:
            segment[0] = x
            segment[1:] = seq[dst:src]
        change = self.gain[segment]
        for w, g in gain.items():
            if w == x:
                change[dst - lo] = g
            else:
                k = int(at[w])
                change[k - (1 if later else -1) - lo if lo <= k <= hi else k - lo] = g
        # bytes resident before each step: what was before lo, plus the changes before it
        resident = np.cumsum(change)
        resident -= change
        resident += int(self.resident[lo])
        stages = resident + self.load[segment]
        stages += self.problem.fixed_bytes
        peak = max(int(self.prefix_max[lo]), int(stages.max()), int(self.suffix_max[hi + 1]))
        excess = stages - self.target
        over = (int(self.prefix_over[lo]) + int(excess[excess > 0].sum())
                + int(self.prefix_over[-1] - self.prefix_over[hi + 1]))
        return Move(x, src, dst, (peak, over), segment, stages, resident, readers, gain)

    def _latest_reader(self, u: int, x: int, dst: int, lo: int, hi: int) -> int:
        """The last reader of `u` once `x` (its last reader now) moves earlier to `dst`."""
        at = self.at
        best, best_step = x, dst
        for w in self.users[u]:
            if w != x:
                k = int(at[w])
                if lo <= k <= hi:
                    k += 1
                if k > best_step:
                    best, best_step = w, k
        return best

    def commit(self, move: Move) -> None:
        lo, hi = min(move.src, move.dst), max(move.src, move.dst)
        self.seq[lo:hi + 1] = move.segment
        self.at[move.segment] = np.arange(lo, hi + 1, dtype=np.int64)
        self.stages[lo:hi + 1] = move.stages
        self.resident[lo:hi + 1] = move.resident
        for u, w in move.last_reader.items():
            self.last_reader[u] = w
        for w, g in move.gain.items():
            self.gain[w] = g
        self._aggregate()

