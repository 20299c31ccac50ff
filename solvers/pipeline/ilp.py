"""CP-SAT model of contiguous partitioning with per-stage recomputation (Beaumont et al. 2021).

For a fixed schedule (in-flight micro-batches k_s per stage), choose for every stage s one unit
range [i, j) and how many of its k_s in-flight micro-batches keep their activations: k_s (none
recomputed), 0 (all recomputed: only the stage input is kept, the backward reruns the forward),
or the most that fits on its own in between (micro-batches mb with mb mod k_s >= stored are
recomputed, so the choice is per micro-batch). Minimise the 1F1B step-time *proxy*
(m - 1) * T + (sum of stage times) / v, T >= each rank's summed stage time; stage time is compute
plus boundary transfers plus the recomputed forwards averaged over the m micro-batches.
Memory per rank: the sum over its stages of the one-stage peak bound (exact without
recomputation and with one stage a rank).

The proxy is not the simulated step, so CP-SAT's proof on it proves nothing about the plan: the
outcome is "feasible" at best, its objective the simulated step, the proxy value and bound in
`proxy_objective` / `proxy_bound` and the notes. Every candidate is simulated, the fastest
fitting one wins and is then improved by the DP's boundary moves (planner.solvers.pipeline.dp,
each stage keeping its stored count) while the simulated step improves.

Monotone in memory (a plan that fits at less memory fits at more). The candidates at device
memory M: (1) the DP's answer at M (planner.solvers.pipeline.dp: the exact fastest split without
recomputation when its enumeration finishes, which only gets faster as M grows), (2) CP-SAT's
split at M, and (3) CP-SAT's split at each level below M of a memory ladder that does not depend
on M: base x LADDER_RATIO^k for k < LADDER_LEVELS, base the least memory with every micro-batch
recomputed (least_memory_split). The rule this gives: the answer at M is never slower than the
answer at any ladder level below M, nor than the exact no-recomputation answer at any M' <= M,
provided the DP enumerated and CP-SAT solved each level to optimality (deterministic: hinted by
the level below, one seed, one thread) with time for every level (MIN_LEVEL_S each; else only
the top levels are solved). Between two ladder levels g <= M' < M < g x LADDER_RATIO, CP-SAT's
split at M' is not among M's candidates, so a proxy/simulator disagreement can still make M
slower than M' there; the boundary moves on the simulated best close such cases (none left in 72
random 9-10-layer sweeps of 12 memories each, where CP-SAT's split at M alone was non-monotone
in 7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.solvers.pipeline.dp import dp_partition, improve_by_moves, least_memory_split
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem, Split
from planner.solvers.pipeline.units import RangeCosts

TIME_SCALE_TARGET = 1_000_000  # integer time units for the whole proxy range
LADDER_RATIO = 1.05  # memory ladder: each level 5 % above the one below
LADDER_LEVELS = 32  # base .. base x 1.05^31 (4.5 x the least memory with full recomputation)
AT_M_SHARE = 0.7  # of the time left after the DP, for CP-SAT at the device memory itself
MIN_LEVEL_S = 0.1  # CP-SAT's least time at one level; fewer (top) levels when time is short
MOVES_SHARE = 0.1  # of the time limit, kept for boundary moves on the simulated best
DP_SHARE = 0.2  # of the time limit, for the DP (its enumeration); the ladder shares the rest

Key = tuple[int, int, int, int]  # (first unit, end unit, stage, micro-batches stored in full)


@dataclass(frozen=True)
class ProxySolve:
    """CP-SAT's answer at one memory level, on the proxy."""

    level_bytes: int | None
    split: Split | None
    status: str  # optimal / feasible / infeasible / timeout (on the proxy)
    objective_ms: float | None = None
    bound_ms: float | None = None
    options: int = 0
    why: str = ""  # infeasible: why
    build_s: float = 0.0  # seconds to build the model (before CP-SAT runs)


def memory_ladder(problem: PipelineProblem) -> tuple[list[int], Split]:
    """The ladder's levels below the device memory (module doc; none when memory is unbounded)
    and the least-memory split with every micro-batch recomputed (the lowest level's hint)."""
    cap = problem.memory_bytes
    base, split = least_memory_split(problem, recompute=True)
    if cap is None:
        return [], split
    levels = {int(base * LADDER_RATIO**k) for k in range(LADDER_LEVELS)}
    return sorted(g for g in levels if g < cap), split


def ilp_partition(
    problem: PipelineProblem, time_limit_s: float = 10.0, threads: int = 2
) -> PartitionOutcome:
    start = time.perf_counter()
    hint = dp_partition(problem, time_limit_s=time_limit_s * DP_SHARE)
    ladder, previous = memory_ladder(problem)
    left_s = time_limit_s * (1 - MOVES_SHARE) - (time.perf_counter() - start)
    at_m_s = max(MIN_LEVEL_S, left_s * (AT_M_SHARE if ladder else 1.0))
    top = _solve(problem, problem.memory_bytes, at_m_s, threads,
                 hint.best.split if hint.best is not None else previous)
    solves = [top]
    left_s = time_limit_s * (1 - MOVES_SHARE) - (time.perf_counter() - start)
    # the ladder's top levels that get MIN_LEVEL_S each on top of building the model (all of
    # them on small problems), solved upwards, each hinted with the one below
    per_level_s = MIN_LEVEL_S + top.build_s
    ladder = ladder[len(ladder) - min(len(ladder), max(0, int(left_s / per_level_s))):]
    for level in ladder:
        solve = _solve(problem, level, max(MIN_LEVEL_S, left_s / len(ladder) - top.build_s),
                       threads, previous)
        solves.append(solve)
        previous = solve.split or previous
    found = [s.split for s in solves if s.split is not None]
    cands = found + ([hint.best.split] if hint.best is not None else [])
    best = problem.best_simulated(cands)
    moves, picked = 0, best.split if best is not None else None
    if best is not None:  # the simulator, not the proxy, has the last word on boundaries
        best, moves = improve_by_moves(problem, best, start + time_limit_s)
    wall = time.perf_counter() - start
    if best is None:
        status = "timeout" if any(s.status == "timeout" for s in solves) else "infeasible"
        why = top.why or "CP-SAT found no solution in time"
        return PartitionOutcome("ilp", None, status, wall_seconds=wall, backend="cp-sat",
                                notes=[why] + hint.notes)
    notes = _proxy_notes(top, len(ladder))
    if picked != top.split and picked in found:
        notes.append("a split CP-SAT found at a lower memory level simulates fastest: kept")
    if hint.best is not None and picked == hint.best.split and picked not in found:
        proven = " (proven fastest without recomputation)" if hint.status == "optimal" else ""
        notes.append(f"the DP's split{proven} simulates fastest: kept")
    if moves:
        notes.append(f"{moves} boundary move(s) made the simulated step faster")
    recomputing = sum(1 for q in best.split.stored if q is not None)
    if recomputing:
        notes.append(f"{recomputing} stage(s) recompute some micro-batches")
    assert best.simulation is not None
    return PartitionOutcome(
        "ilp", best, "feasible", objective=best.simulation.makespan_ms, wall_seconds=wall,
        notes=notes, backend="cp-sat", proxy_objective=top.objective_ms,
        proxy_bound=top.bound_ms,
    )


def _proxy_notes(top: ProxySolve, levels: int) -> list[str]:
    """CP-SAT's proxy at the device memory, labelled as such; and the ladder levels solved."""
    if top.objective_ms is None or top.bound_ms is None:
        return [f"CP-SAT {top.status} on its proxy at the device memory; {levels} lower "
                "memory level(s) solved"]
    gap = (top.objective_ms - top.bound_ms) / top.objective_ms if top.objective_ms else 0.0
    at = "unbounded memory" if top.level_bytes is None else f"{top.level_bytes:,} B"
    return [f"proxy step time {top.objective_ms:.4g} ms, proxy bound {top.bound_ms:.4g} ms "
            f"(proxy gap {100 * gap:.2f} %, {top.status} on the proxy at {at}; not a bound on "
            f"the simulated step), {top.options} range/recompute options; {levels} lower "
            "memory level(s) solved"]


def _options(problem: PipelineProblem, cap: int | None, scale: float) -> dict[Key, tuple[int, int]]:
    """Per (first, end, stage, stored): (one-stage memory bound, scaled proxy stage time), the
    ones within `cap`."""
    L, S = problem.length, problem.stage_count
    options: dict[Key, tuple[int, int]] = {}
    for s in range(S):
        k = problem.inflight[s]
        for i in range(s, L - (S - s) + 1):
            for j in range(i + 1, L - (S - s - 1) + 1):
                c = problem.costs(i, j, s)
                for q in _levels(problem, c, s, k, cap):
                    mem = problem.stage_memory(c, s, q)
                    if cap is not None and mem > cap:
                        continue
                    options[(i, j, s, q)] = (mem, round(problem.stage_time(c, s, q) * scale))
    return options


def _solve(problem: PipelineProblem, cap: int | None, time_limit_s: float, threads: int,
           hint: Split | None) -> ProxySolve:
    """CP-SAT on the proxy with device memory `cap`, hinted with `hint`."""
    built = time.perf_counter()
    L, S, m = problem.length, problem.stage_count, problem.microbatches
    v = S // problem.ranks
    total_ms = sum(u.forward_ms * 2 + u.backward_ms for u in problem.chain.units) + 1e-9
    scale = TIME_SCALE_TARGET / (total_ms * m)
    options = _options(problem, cap, scale)
    model = cp_model.CpModel()
    # x[i, j, s, q] = 1: stage s is units [i, j) with q micro-batches stored in full
    x = {key: model.new_bool_var(f"x{key}") for key in options}
    by_stage: dict[int, list[Key]] = {s: [] for s in range(S)}
    for key in options:
        by_stage[key[2]].append(key)
    if any(not keys for keys in by_stage.values()):
        return ProxySolve(cap, None, "infeasible", why="a stage has no range that fits on its own")
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
    _add_hint(problem, model, x, hint)
    build_s = time.perf_counter() - built
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return ProxySolve(cap, None, "infeasible", options=len(options), build_s=build_s,
                          why="CP-SAT proved no split and recomputation fits (memory bounded "
                          "per stage as above)")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ProxySolve(cap, None, "timeout", options=len(options), build_s=build_s,
                          why="CP-SAT found no solution in time")
    bounds: list[tuple[int, int]] = []
    stored: list[int | None] = []
    for s in range(S):
        pick = next(k for k in by_stage[s] if solver.value(x[k]))
        bounds.append((pick[0], pick[1]))
        stored.append(None if pick[3] >= problem.inflight[s] else pick[3])
    split = Split(tuple(bounds), tuple(stored) if any(q is not None for q in stored) else ())
    return ProxySolve(cap, split, "optimal" if status == cp_model.OPTIMAL else "feasible",
                      solver.objective_value / scale / v, solver.best_objective_bound / scale / v,
                      len(options), build_s=build_s)


def _add_hint(problem: PipelineProblem, model: cp_model.CpModel,
              x: dict[Key, cp_model.IntVar], hint: Split | None) -> None:
    if hint is None:
        return
    chosen = set()
    for s, (i, j) in enumerate(hint.bounds):
        q = hint.stored_of(s)
        chosen.add((i, j, s, problem.inflight[s] if q is None else q))
    if all(key in x for key in chosen):
        for key, var in x.items():
            model.add_hint(var, 1 if key in chosen else 0)


def _levels(problem: PipelineProblem, c: RangeCosts, s: int, k: int, cap: int | None) -> list[int]:
    """Stored-in-full counts worth trying: all, none, and the most that fits alone."""
    levels = {k, 0}
    if cap is not None and k > 1:
        fitting = [q for q in range(1, k) if problem.stage_memory(c, s, q) <= cap]
        if fitting:
            levels.add(max(fitting))
    return sorted(levels, reverse=True)
