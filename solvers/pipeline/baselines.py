"""The partitions users get today, for comparison: none of them looks at activation memory.

- layer-balanced: the same number of units (layers) per stage, the first stages taking one more
  (DeepSpeed `partition_method="uniform"`);
- param-balanced: contiguous stages minimising the largest parameter count (DeepSpeed
  `partition_method="parameters"`);
- compute-balanced: contiguous stages minimising the largest forward+backward time (torch's and
  GPipe's balance by measured time).

Each returns its split whatever memory it needs; the engine reports whether it fits.
"""

from __future__ import annotations

import time

from planner.solvers.pipeline.chain_dp import minmax_dp
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem, Split

BASELINES = ("param-balanced", "layer-balanced", "compute-balanced")


def layer_balanced(length: int, stages: int) -> list[tuple[int, int]]:
    base, extra = divmod(length, stages)
    out = []
    i = 0
    for s in range(stages):
        j = i + base + (1 if s < extra else 0)
        out.append((i, j))
        i = j
    return out


def baseline_split(problem: PipelineProblem, method: str) -> Split:
    L, S = problem.length, problem.stage_count
    if method == "layer-balanced":
        return Split(tuple(layer_balanced(L, S)))
    prefix = [0.0]
    for u in problem.chain.units:
        w = float(u.parameter_bytes) if method == "param-balanced" else (
            u.forward_ms + u.backward_ms)
        prefix.append(prefix[-1] + w)
    found = minmax_dp(L, S, lambda i, j, s: prefix[j] - prefix[i])
    assert found is not None
    return Split(tuple(found[1]))


def baseline_partition(problem: PipelineProblem, method: str) -> PartitionOutcome:
    start = time.perf_counter()
    cand = problem.candidate(baseline_split(problem, method))
    notes = [] if cand.fits else [_overflow(problem, cand.peaks)]
    return PartitionOutcome(method, cand, "feasible" if cand.fits else "infeasible",
                            wall_seconds=time.perf_counter() - start, notes=notes)


def _overflow(problem: PipelineProblem, peaks: list[int]) -> str:
    limit = problem.memory_bytes or 0
    worst = max(range(len(peaks)), key=lambda r: peaks[r] - limit)
    over = peaks[worst] - limit
    return (f"rank {worst} needs {peaks[worst] / 2**30:.2f} GiB, {over / 2**30:.2f} GiB over "
            "the device memory")
