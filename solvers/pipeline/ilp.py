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
provided the DP enumerated and CP-SAT solved each level to optimality (hinted by the level
below) with time for every level (MIN_LEVEL_S each; else only the top levels are solved).
Between two ladder levels g <= M' < M < g x LADDER_RATIO, CP-SAT's split at M' is not among M's
candidates, so a proxy/simulator disagreement can still make M slower than M' there; the
boundary moves on the simulated best close such cases (none left in 72 random 9-10-layer sweeps
of 12 memories each, where CP-SAT's split at M alone was non-monotone in 7).

Deterministic for a given request (issue 47): the DP and the boundary moves
run on counted work (planner.solvers.pipeline.enumerate.Work), CP-SAT on deterministic time
(`max_deterministic_time`, a fixed seed, one worker: `configure`), and the ladder's levels
and shares follow from those counts, never from measured time. The wall clock (WALL_SAFETY x
the limit) is only a safety net; a note says when it cut the search.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.solvers.pipeline.dp import dp_search, improve_by_moves, least_memory_split
from planner.solvers.pipeline.enumerate import WALL_SAFETY, Work, known_ranges
from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem, Split
from planner.solvers.pipeline.units import RangeCosts

TIME_SCALE_TARGET = 1_000_000  # integer time units for the whole proxy range
LADDER_RATIO = 1.05  # memory ladder: each level 5 % above the one below
LADDER_LEVELS = 32  # base .. base x 1.05^31 (4.5 x the least memory with full recomputation)
AT_M_SHARE = 0.7  # of the time left after the DP, for CP-SAT at the device memory itself
MIN_LEVEL_S = 0.1  # CP-SAT's least time at one level; fewer (top) levels when time is short
MOVES_SHARE = 0.1  # of the time limit, kept for boundary moves on the simulated best
DP_SHARE = 0.2  # of the time limit, for the DP (its enumeration); the ladder shares the rest
SEED = 0  # CP-SAT's random seed
INTERLEAVE_THREADS = False  # CP-SAT on `threads` interleaved workers (else one; `configure`)
CPSAT_SLACK_S = 1.0  # wall seconds on top of WALL_SAFETY x a level's share (loading, presolve)
BUILD_S_PER_OPTION = 3.5e-5  # estimated seconds to build the model, per range/recompute option

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
    problem: PipelineProblem, time_limit_s: float = DEFAULT_PIPELINE_TIME_LIMIT_S, threads: int = 2
) -> PartitionOutcome:
    """The fastest simulated candidate (module doc). Deterministic for a given request: the DP
    and the boundary moves run on counted work (planner.solvers.pipeline.enumerate.Work),
    CP-SAT on deterministic time with a fixed seed (`configure`), each level's share fixed by
    counts, never by the clock; the wall clock (WALL_SAFETY x the limit) is only a safety
    net."""
    start = time.perf_counter()
    work = Work.within(time_limit_s, start)
    dp_work = work.sub(time_limit_s * DP_SHARE)
    hint = dp_search(problem, dp_work)
    work.charge(dp_work.spent_s)
    work.wall_out |= dp_work.wall_out
    known = known_ranges(problem)
    ladder, previous = memory_ladder(problem)
    work.charge_ranges(problem, known)
    left_s = max(0.0, time_limit_s * (1 - MOVES_SHARE) - work.spent_s)
    at_m_s = max(MIN_LEVEL_S, left_s * (AT_M_SHARE if ladder else 1.0))
    top = _solve(problem, problem.memory_bytes, at_m_s, threads,
                 hint.best.split if hint.best is not None else previous, work)
    solves = [top]
    left_s = max(0.0, time_limit_s * (1 - MOVES_SHARE) - work.spent_s)
    # the ladder's top levels that get MIN_LEVEL_S each on top of building the model (all of
    # them on small problems), solved upwards, each hinted with the one below
    build_s = BUILD_S_PER_OPTION * top.options
    per_level_s = MIN_LEVEL_S + build_s
    ladder = ladder[len(ladder) - min(len(ladder), max(0, int(left_s / per_level_s))):]
    for level in ladder:
        if work.deadline is not None and time.perf_counter() >= work.deadline:
            work.wall_out = True  # the safety net: no more levels
            break
        solve = _solve(problem, level, max(MIN_LEVEL_S, left_s / len(ladder) - build_s),
                       threads, previous, work)
        solves.append(solve)
        previous = solve.split or previous
    found = [s.split for s in solves if s.split is not None]
    cands = found + ([hint.best.split] if hint.best is not None else [])
    before = len(problem._simulations)
    best = problem.best_simulated(cands)
    for _ in range(len(problem._simulations) - before):
        work.charge_simulation(problem)
    moves, picked = 0, best.split if best is not None else None
    if best is not None:  # the simulator, not the proxy, has the last word on boundaries
        # the moves get what is left of the limit (at least MOVES_SHARE of it)
        moves_work = Work(max(MOVES_SHARE * time_limit_s, work.left_s), work.deadline)
        best, moves = improve_by_moves(problem, best, math.inf, moves_work)
        work.wall_out |= moves_work.wall_out
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
    if work.wall_out:
        notes.append(f"the wall-clock safety net ({WALL_SAFETY:g} x the time limit) stopped "
                     "the search: the answer may differ from an unloaded run's")
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


def configure(solver: cp_model.CpSolver, time_limit_s: float, threads: int,
              deadline: float | None = None) -> None:
    """CP-SAT searching the same way every run: `time_limit_s` of deterministic time (its
    own work count, roughly seconds on an idle core), a fixed seed, and the wall clock at
    WALL_SAFETY x the limit plus CPSAT_SLACK_S (within `deadline`, a perf_counter time) as
    the safety net. One worker whatever `threads`: CP-SAT's parallel portfolio is
    deterministic only interleaved (INTERLEAVE_THREADS), and interleaved it shares the
    deterministic time among its subsolvers: on GPT-48 over 4 ranks it proved its proxy
    optimal at 0.34 and 1.13 deterministic seconds on one worker, at 0.84 and not within 1.9
    interleaved on two (a 24 % slower plan at 190,798,578 B)."""
    params = solver.parameters
    params.max_deterministic_time = max(MIN_LEVEL_S, time_limit_s)
    wall_s = WALL_SAFETY * max(MIN_LEVEL_S, time_limit_s) + CPSAT_SLACK_S
    if deadline is not None:
        wall_s = max(MIN_LEVEL_S, min(wall_s, deadline - time.perf_counter()))
    params.max_time_in_seconds = wall_s
    params.random_seed = SEED
    workers = max(1, threads) if INTERLEAVE_THREADS else 1
    params.num_workers = workers
    if workers > 1:
        params.interleave_search = True  # deterministic with several workers


def _solve(problem: PipelineProblem, cap: int | None, time_limit_s: float, threads: int,
           hint: Split | None, work: Work | None = None) -> ProxySolve:
    """CP-SAT on the proxy with device memory `cap`, hinted with `hint`, `time_limit_s` of
    deterministic time (`configure`); charges `work` its model and CP-SAT's deterministic
    time."""
    work = work if work is not None else Work.within(time_limit_s)
    built = time.perf_counter()
    known = known_ranges(problem)
    L, S, m = problem.length, problem.stage_count, problem.microbatches
    v = S // problem.ranks
    total_ms = sum(u.forward_ms * 2 + u.backward_ms for u in problem.chain.units) + 1e-9
    scale = TIME_SCALE_TARGET / (total_ms * m)
    options = _options(problem, cap, scale)
    work.charge(BUILD_S_PER_OPTION * len(options))  # the model below included
    work.charge_ranges(problem, known)
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
    configure(solver, time_limit_s, threads, work.deadline)
    status = solver.solve(model)
    # CP-SAT's deterministic time where it proved its answer (the same every run); its limit
    # where it stopped on it (it overshoots by a varying amount with several workers)
    proven = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    limit_s = solver.parameters.max_deterministic_time
    work.charge(min(solver.response_proto.deterministic_time, limit_s) if proven else limit_s)
    if (status not in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
            and solver.wall_time >= 0.99 * solver.parameters.max_time_in_seconds):
        work.wall_out = True  # CP-SAT stopped on the wall clock, not on deterministic time
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
