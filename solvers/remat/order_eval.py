"""Store-all stage totals of an order, updated move by move: the core of peak-directed reordering.

With every value kept, the bytes resident while step k runs are the fixed bytes, plus what the
steps before k left resident, plus step k's output and workspace (the simulator's accounting,
`RematProblem.stage_bytes`): step k adds its node's output and held bytes and frees each value
whose last reader it is (a value nobody reads is freed at its own step). Moving one node x from
step `src` to step `dst` changes only the steps between the two: every other node keeps its
relative order, so a value's last reader changes only when it is an input of x, and then both
the old and the new last reader lie between `src` and `dst`; what is resident before the first
step of that range and after its last one is unchanged. `OrderState.try_move` re-evaluates that
range alone (numpy on the slice) and scores the move against prefix and suffix aggregates of the
other steps, so a move costs O(|dst − src|) instead of O(n + e); `commit` applies it and
refreshes the aggregates (O(n) in numpy, once per accepted move).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.solvers.remat.problem import RematProblem

Score = tuple[int, int]  # (peak bytes, bytes over the target summed over every step)
SHORT_SPAN = 48  # moves over fewer steps are judged in plain Python, longer ones in numpy


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
        self.bytes = problem.stage_bytes  # the stage arithmetic (the problem's ledger's rules)
        self._mem = problem.mem_bytes
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
        # position -> net bytes its step adds: first computation less the values it frees
        self.gain = self.bytes.first_np - self.bytes.freed_at(
            np.array(self.last_reader, dtype=np.int64))
        # list mirrors of seq, at and gain: short spans are judged in plain Python (numpy's
        # per-call cost dominates below SHORT_SPAN steps; half of the moves are within 26)
        self._seq, self._at, self._gain = self.seq.tolist(), at, self.gain.tolist()
        self.stages, self.resident = self.bytes.run(self.seq, self.gain[self.seq], 0)
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
        seq, at = self._seq, self._at
        x = seq[src]
        later = src < dst
        lo, hi = (src, dst) if later else (dst, src)
        shift = -1 if later else 1  # steps of the other nodes in lo..hi move by this
        readers: dict[int, int] = {}
        gain: dict[int, int] = {}
        for u in self.deps[x]:
            old = self.last_reader[u]
            if old == x:
                # moved later it stays the last reader; moved earlier, the latest of the
                # others (each one step later inside lo..hi) may overtake it
                new = x if later else self._latest_reader(u, x, dst, lo, hi)
            else:
                k = at[old]
                new = x if dst > (k + shift if lo <= k <= hi else k) else old
            if new != old:
                readers[u] = new
                gain[old] = gain.get(old, self._gain[old]) + self._mem[u]
                gain[new] = gain.get(new, self._gain[new]) - self._mem[u]
        # offsets in the span of the steps whose net bytes change, with their new values
        updates = [((dst if w == x else at[w] + shift if lo <= at[w] <= hi else at[w]) - lo, g)
                   for w, g in gain.items()]
        # the positions at steps lo..hi after the move
        if hi - lo < SHORT_SPAN:
            steps = seq[src + 1:dst + 1] + [x] if later else [x] + seq[dst:src]
            seg_peak, seg_over, stages, resident = self._span_short(steps, updates, lo)
            segment = np.array(steps, dtype=np.int64)
        else:
            arr = self.seq
            segment = (np.concatenate((arr[src + 1:dst + 1], [x])) if later
                       else np.concatenate(([x], arr[dst:src])))
            seg_peak, seg_over, stages, resident = self._span_numpy(segment, updates, lo)
        peak = max(int(self.prefix_max[lo]), seg_peak, int(self.suffix_max[hi + 1]))
        over = (int(self.prefix_over[lo]) + seg_over
                + int(self.prefix_over[-1] - self.prefix_over[hi + 1]))
        return Move(x, src, dst, (peak, over), segment, stages, resident, readers, gain)

    def _span_numpy(self, segment: np.ndarray, updates: list[tuple[int, int]], lo: int
                    ) -> tuple[int, int, np.ndarray, np.ndarray]:
        """(peak, bytes over the target, stage bytes, resident bytes) over the span."""
        change = self.gain[segment]
        for k, g in updates:
            change[k] = g
        # bytes resident before each step: what was before lo, plus the changes before it
        stages, resident = self.bytes.run(segment, change, int(self.resident[lo]))
        above = stages - self.target
        return int(stages.max()), int(above[above > 0].sum()), stages, resident

    def _span_short(self, segment: list[int], updates: list[tuple[int, int]], lo: int
                    ) -> tuple[int, int, np.ndarray, np.ndarray]:
        """`_span_numpy` in plain Python on the list mirrors: numpy's per-call cost dominates
        on short spans."""
        gains = self._gain
        change = [gains[w] for w in segment]
        for k, g in updates:
            change[k] = g
        top, excess, stages, resident = self.bytes.run_short(
            segment, change, int(self.resident[lo]), self.target)
        return (top, excess, np.array(stages, dtype=np.int64),
                np.array(resident, dtype=np.int64))

    def _latest_reader(self, u: int, x: int, dst: int, lo: int, hi: int) -> int:
        """The last reader of `u` once `x` (its last reader now) moves earlier to `dst`."""
        at = self._at
        best, best_step = x, dst
        for w in self.users[u]:
            if w != x:
                k = at[w]
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
            self._gain[w] = g
        segment = move.segment.tolist()
        self._seq[lo:hi + 1] = segment
        for k, w in enumerate(segment, start=lo):
            self._at[w] = k
        self._aggregate()

