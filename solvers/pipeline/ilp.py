"""CP-SAT model of contiguous partitioning with per-stage recomputation (Beaumont et al. 2021).

For a fixed schedule (in-flight micro-batches k_s per stage), choose for every stage s one unit
range [i, j) and how many of its k_s in-flight micro-batches keep their activations: k_s (none
recomputed), 0 (all recomputed: only the stage input is kept, the backward reruns the forward),
or the most that fits on its own in between (micro-batches mb with mb mod k_s >= stored are
recomputed, so the choice is per micro-batch). Minimise the 1F1B step-time proxy
(m - 1) * T + (sum of stage times) / v, T >= each rank's summed stage time; stage time is compute
plus boundary transfers plus the recomputed forwards averaged over the m micro-batches.
Memory per rank: the sum over its stages of the one-stage peak bound (exact without
recomputation and with one stage a rank). Hinted with the DP's split; the gap is CP-SAT's proven
bound on this proxy. The solution (and the DP's, when it simulates faster) is then simulated:
the plan's step time is the simulator's.
"""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from planner.solvers.pipeline.dp import dp_partition, least_memory_split
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem, Split
from planner.solvers.pipeline.units import RangeCosts

TIME_SCALE_TARGET = 1_000_000  # integer time units for the whole proxy range


def ilp_partition(
    problem: PipelineProblem, time_limit_s: float = 10.0, threads: int = 2
) -> PartitionOutcome:
    start = time.perf_counter()
    L, S, m = problem.length, problem.stage_count, problem.microbatches
    v = S // problem.ranks
    cap = problem.memory_bytes
    hint = dp_partition(problem)
    total_ms = sum(u.forward_ms * 2 + u.backward_ms for u in problem.chain.units) + 1e-9
    scale = TIME_SCALE_TARGET / (total_ms * m)

    # option (i, j, s, stored): stage s runs units [i, j) keeping `stored` micro-batches in full
    options: dict[tuple[int, int, int, int], tuple[int, int]] = {}  # -> (memory, scaled time)
    for s in range(S):
        k = problem.inflight[s]
        for i in range(s, L - (S - s) + 1):
            for j in range(i + 1, L - (S - s - 1) + 1):
                c = problem.costs(i, j, s)
                for q in _levels(problem, c, s, k):
                    mem = problem.stage_memory(c, s, q)
                    if cap is not None and mem > cap:
                        continue
                    options[(i, j, s, q)] = (mem, round(problem.stage_time(c, s, q) * scale))
    model = cp_model.CpModel()
    # x[i, j, s, q] = 1: stage s is units [i, j) with q micro-batches stored in full
    x = {key: model.new_bool_var(f"x{key}") for key in options}
    by_stage: dict[int, list[tuple[int, int, int, int]]] = {s: [] for s in range(S)}
    for key in options:
        by_stage[key[2]].append(key)
    if any(not keys for keys in by_stage.values()):
        return _infeasible(problem, hint, start, "a stage has no range that fits on its own")
    # one range and level per stage
    for s in range(S):
        model.add_exactly_one(x[k] for k in by_stage[s])
    # the first stage starts at unit 0, the last ends at unit L
    model.add(sum(x[k] for k in by_stage[0] if k[0] == 0) == 1)
    model.add(sum(x[k] for k in by_stage[S - 1] if k[1] == L) == 1)
    # contiguity: stage s ends where stage s + 1 starts
    for s in range(S - 1):
        for b in range(1, L):
            ends = [x[k] for k in by_stage[s] if k[1] == b]
            starts = [x[k] for k in by_stage[s + 1] if k[0] == b]
            if ends or starts:
                model.add(sum(ends) == sum(starts))
    bottleneck = model.new_int_var(0, 10**12, "T")
    for r in range(problem.ranks):
        keys = [k for s in range(r, S, problem.ranks) for k in by_stage[s]]
        # each rank's memory: the sum of its stages' one-stage bounds
        if cap is not None and v > 1:
            model.add(sum(options[k][0] * x[k] for k in keys) <= cap)
        # the bottleneck covers each rank's summed stage time
        model.add(bottleneck >= sum(options[k][1] * x[k] for k in keys))
    stage_sum = sum(options[k][1] * x[k] for k in options)
    model.minimize((m - 1) * v * bottleneck + stage_sum)
    chosen = set()
    if hint.best is not None:
        for s, (i, j) in enumerate(hint.best.split.bounds):
            chosen.add((i, j, s, problem.inflight[s]))
    else:  # nothing fits without recomputation: start from the least memory with all of it
        least, split = least_memory_split(problem, recompute=True)
        if cap is None or least <= cap:
            chosen = {(i, j, s, 0) for s, (i, j) in enumerate(split.bounds)}
    if chosen and all(key in x for key in chosen):
        for key, var in x.items():
            model.add_hint(var, 1 if key in chosen else 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return _infeasible(problem, hint, start, "CP-SAT proved no split and recomputation fits "
                           "(memory bounded per stage as above)")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return PartitionOutcome("ilp", hint.best, "timeout" if hint.best is None else "feasible",
                                wall_seconds=time.perf_counter() - start, backend="cp-sat",
                                notes=["CP-SAT found no solution in time; the DP's split"])
    bounds: list[tuple[int, int]] = []
    stored: list[int | None] = []
    for s in range(S):
        pick = next(k for k in by_stage[s] if solver.value(x[k]))
        bounds.append((pick[0], pick[1]))
        stored.append(None if pick[3] >= problem.inflight[s] else pick[3])
    split = Split(tuple(bounds), tuple(stored) if any(q is not None for q in stored) else ())
    objective = solver.objective_value / scale / v
    bound = solver.best_objective_bound / scale / v
    cands = [split] + ([hint.best.split] if hint.best is not None else [])
    best = problem.best_simulated(cands)
    notes = [f"proxy step time {objective:.4g} ms, bound {bound:.4g} ms "
             f"({len(options)} range/recompute options)"]
    if best is not None and hint.best is not None and best.split == hint.best.split \
            and best.split != split:
        notes.append("the DP's split simulates faster than the ILP's: kept")
    recomputing = sum(1 for q in best.split.stored if q is not None) if best else 0
    if recomputing:
        notes.append(f"{recomputing} stage(s) recompute some micro-batches")
    optimal = status == cp_model.OPTIMAL
    return PartitionOutcome(
        "ilp", best, "optimal" if optimal else "feasible", objective=objective,
        lower_bound=bound, wall_seconds=time.perf_counter() - start, notes=notes,
        backend="cp-sat",
    )


def _levels(problem: PipelineProblem, c: RangeCosts, s: int, k: int) -> list[int]:
    """Stored-in-full counts worth trying: all, none, and the most that fits alone."""
    levels = {k, 0}
    cap = problem.memory_bytes
    if cap is not None and k > 1:
        fitting = [q for q in range(1, k) if problem.stage_memory(c, s, q) <= cap]
        if fitting:
            levels.add(max(fitting))
    return sorted(levels, reverse=True)


def _infeasible(
    problem: PipelineProblem, hint: PartitionOutcome, start: float, why: str
) -> PartitionOutcome:
    return PartitionOutcome("ilp", None, "infeasible", wall_seconds=time.perf_counter() - start,
                            notes=[why], backend="cp-sat")
