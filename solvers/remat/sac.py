"""Method `sac`: plan in the space torch.compile executes (planner.solvers.remat.sac_space).

Chooses the recomputed set R (forward values recomputed once in the backward, everything else
saved) minimising the compiled step's compute subject to the simulated peak of
`compiled_schedule(graph, R)` within the budget; the plan's actions are that schedule, so
`runtime.compile` runs it as planned (no projection). A greedy + local search heuristic first
(`sac_space.search`), then, where the graph allows, an exact CP-SAT model with a proven bound.

The exact model is a relaxation checked by the simulator: memory is constrained at every
checkpoint (the computation of each forward and backward node, which every R runs once, in
order), not inside the backward's recomputation bursts, and the bytes a recomputed view's
backward copy keeps alive are left out. So its optimum is a lower bound on the compiled step's
compute; an optimum whose simulated peak exceeds the budget is cut off (a no-good on R) and the
model solved again. The bound is the compiled space's: a plan outside it (a value recomputed
twice in the backward) may cost less.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.core.errors import InputError
from planner.core.plan import PlanStatus
from planner.solvers.remat.backends import objective_scale, scaled_cost
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option, read_options

if TYPE_CHECKING:  # the search loads when the method runs: listing the specs needs none of it
    from planner.solvers.remat.sac_space import SacRun, SacSpace

HEURISTIC_SHARE = 0.3  # of the time limit, for the heuristic when the exact model follows


@dataclass(frozen=True)
class SacOptions:
    exact: bool = option(True, "after the heuristic, solve the exact CP-SAT model (bound, gap)")
    exact_max_nodes: int = option(
        2000, "largest graph (nodes) given to the exact model; larger: heuristic only",
        minimum=1)


@dataclass(frozen=True)
class ExactAnswer:
    """The exact model's answer: its best fitting run (None: none), its bound on the extra
    compute of recomputation (ms, None: unknown), whether it proved either."""

    run: SacRun | None
    extra_bound_ms: float | None
    proven: bool  # the run is optimal, or (run None) no R fits
    cuts: int  # relaxation optima the simulator found over budget


@dataclass
class _Model:
    cp: Any  # cp_model.CpModel
    x: dict[int, Any]  # candidate v -> 1 when v is recomputed in the backward
    scale: float  # objective units per ms


def _build(space: SacSpace, budget_bytes: int) -> _Model | None:
    """The relaxation (module docstring); None when the fixed bytes alone exceed the budget at
    some checkpoint (no R fits)."""
    from ortools.sat.python import cp_model

    ledger = space.ledger
    root, own = ledger.storage_root, ledger.storage_bytes
    backward = [v for v in space.order if v in space.backward]
    pos = {**space.fpos, **{b: len(space.forward) + j for j, b in enumerate(backward)}}
    first_f, horizon = len(space.forward), len(space.forward) + len(backward)
    cand = space.candidate_set
    late_reads = {v: [pos[b] for b in space.succs[v] if b in space.backward]
                  for v in space.forward}
    cp = cp_model.CpModel()
    const = _constant_bytes(space, backward, pos)
    if max(const, default=0) > budget_bytes:
        return None
    x = {v: cp.new_bool_var(f"x_{v}") for v in space.candidates}
    # s[v]: the checkpoint before which v is recomputed (horizon: never): the first backward
    # reader's, or earlier when a recomputed reader is recomputed earlier.
    s = {v: cp.new_int_var(first_f, horizon, f"s_{v}") for v in space.candidates}
    readers = {v: [w for w in space.succs[v] if w in cand] for v in space.forward}
    for v in space.candidates:
        terms: list[Any] = [horizon] + ([min(late_reads[v])] if late_reads[v] else [])
        terms += [s[w] + horizon * (1 - x[w]) for w in readers[v]]
        cp.add_min_equality(s[v], terms)
        if v not in space.read_by_backward:
            # Recomputed only when something recomputed reads it (the canonical R).
            cp.add(x[v] <= sum(x[w] for w in readers[v]))
    demands, intervals = [], []
    for c, b in enumerate(const):
        if b:
            intervals.append(cp.new_fixed_size_interval_var(c, 1, f"c_{c}"))
            demands.append(b)
    # Forward storages: the forward copies of a root and its views form one interval from the
    # root's computation to the last read of any of them (a saved copy: to its last backward
    # reader or the last recomputation that reads it).
    group_end: dict[int, Any] = {}
    members: dict[int, list[int]] = defaultdict(list)
    for v in space.forward:
        members[root[v]].append(v)
    for r, vs in members.items():
        floor = max(space.last_forward_read[v] + 1 for v in vs)
        end: Any = cp.new_int_var(floor, horizon, f"a_{r}")
        group_end[r] = end
        for v in vs:
            kept: Any = 0 if v not in cand else x[v]  # 1: v's forward copy is not kept
            if late_reads[v]:
                cp.add(end >= max(late_reads[v]) + 1 - horizon * kept)
            for w in readers[v]:
                cp.add(end >= s[w] - horizon * (1 - x[w]) - horizon * kept)
        if own[r]:
            intervals.append(cp.new_interval_var(pos[r], end - pos[r], end, f"f_{r}"))
            demands.append(own[r])
    _backward_copies(space, cp, x, s, group_end, late_reads, readers, intervals, demands)
    unit = math.gcd(*demands, 1) if demands else 1
    cp.add_cumulative(intervals, [d // unit for d in demands], budget_bytes // unit)
    # Objective: the compute of recomputation (every node's once is a constant).
    ms = ledger.compute_ms
    scale = objective_scale([ms[v] for v in space.candidates] or [1.0])
    cp.minimize(sum(scaled_cost(ms[v], scale) * x[v] for v in space.candidates))
    return _Model(cp, x, scale)


def _constant_bytes(space: SacSpace, backward: list[int], pos: dict[int, int]) -> list[int]:
    """Memory that no R changes at each checkpoint: fixed and held bytes, the running node's
    workspace, and backward-owned storages (alive from their node to their last reader)."""
    ledger = space.ledger
    root, own, ws, held = (ledger.storage_root, ledger.storage_bytes, ledger.workspace_bytes,
                           ledger.held_bytes)
    const = [0] * (len(space.forward) + len(backward))
    held_so_far = ledger.fixed_bytes
    for c, v in enumerate([*space.forward, *backward]):
        held_so_far += held.get(v, 0)
        const[c] = held_so_far + ws[v]
    alive: dict[int, set[int]] = defaultdict(set)  # backward storage root -> checkpoints
    for b in backward:
        if root[b] in space.backward:
            last_read = max((pos[w] for w in space.succs[b]), default=pos[b])
            alive[root[b]].update(range(pos[b], last_read + 1))
    for r, cs in alive.items():
        for c in cs:
            const[c] += own[r]
    return const


def _backward_copies(space: SacSpace, cp: Any, x: dict[int, Any], s: dict[int, Any],
                     group_end: dict[int, Any], late_reads: dict[int, list[int]],
                     readers: dict[int, list[int]], intervals: list[Any],
                     demands: list[int]) -> None:
    """Backward copies of recomputed roots: from their recomputation (or the end of the
    forward copies' interval, whichever is later) to their last backward reader or recomputed
    reader (an interval present when the root is recomputed)."""
    root, own = space.ledger.storage_root, space.ledger.storage_bytes
    first_f = len(space.forward)
    horizon = first_f + sum(1 for v in space.order if v in space.backward)
    for v in space.candidates:
        if root[v] != v or not own[v]:
            continue
        last = cp.new_int_var(first_f, horizon, f"l_{v}")
        if late_reads[v]:
            cp.add(last >= max(late_reads[v]) + 1)
        for w in readers[v]:
            cp.add(last >= s[w] - horizon * (1 - x[w]))
        start = cp.new_int_var(0, horizon, f"ls_{v}")
        cp.add_max_equality(start, [s[v], group_end[v]])
        late_end = cp.new_int_var(0, horizon, f"le_{v}")
        cp.add(late_end >= last)
        size = cp.new_int_var(0, horizon, f"lz_{v}")
        cp.add(late_end == start + size)
        intervals.append(cp.new_optional_interval_var(start, size, late_end, x[v], f"b_{v}"))
        demands.append(own[v])


def solve_exact(space: SacSpace, budget_bytes: int, *, time_limit_s: float, threads: int = 2,
                seed: int = 0, hint: SacRun | None = None) -> ExactAnswer:
    """The relaxation solved, its optima checked by the simulator and cut off while over budget,
    within `time_limit_s`; the bound is the best the solver proved (valid for the compiled
    space: cuts remove only sets that do not fit)."""
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    model = _build(space, budget_bytes)
    if model is None:
        return ExactAnswer(None, None, True, 0)
    best, bound, cuts = hint, None, 0
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    while True:
        left_s = time_limit_s - (time.perf_counter() - started)
        if left_s <= 0.05:
            return ExactAnswer(best, bound, False, cuts)
        model.cp.clear_hints()
        if best is not None:
            for v, var in model.x.items():
                model.cp.add_hint(var, v in best.recomputed)
        solver.parameters.max_time_in_seconds = left_s
        code = solver.solve(model.cp)
        if code == cp_model.INFEASIBLE:  # the relaxation, hence the compiled space, has none
            return ExactAnswer(best, bound, best is None, cuts)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return ExactAnswer(best, bound, False, cuts)
        found = max(bound or 0.0, solver.best_objective_bound / model.scale)
        bound = found
        chosen = frozenset(v for v, var in model.x.items() if solver.value(var))
        run = space.run(chosen)
        if run.peak_bytes <= budget_bytes:
            if best is None or run.compute_ms < best.compute_ms:
                best = run
            return ExactAnswer(best, bound, code == cp_model.OPTIMAL, cuts)
        # Over budget in the simulator: no longer a candidate (a no-good on this R).
        cuts += 1
        model.cp.add(sum(1 - var if v in chosen else var for v, var in model.x.items()) >= 1)


def sac(request: SolveRequest) -> MethodResult:
    """Heuristic, then the exact model (options: exact, exact_max_nodes); the plan is the
    compiled schedule of the best recomputed set, its peak the compiled step's prediction."""
    from planner.solvers.remat.auto import final_margin_s
    from planner.solvers.remat.sac_space import SacSpace, compiled_schedule, search

    started = time.perf_counter()
    options = read_options(SacOptions, request.options)
    if not isinstance(options.exact_max_nodes, int) or options.exact_max_nodes < 1:
        raise InputError(f"option exact_max_nodes {options.exact_max_nodes!r}: must be an "
                         "integer ≥ 1")
    graph, budget = request.graph, request.budget_bytes
    limit_s = request.time_limit_s - final_margin_s(len(graph.nodes), request.time_limit_s)
    space = SacSpace(graph)
    exact = options.exact and len(graph.nodes) <= options.exact_max_nodes and space.candidates
    share = HEURISTIC_SHARE if exact else 1.0
    run = search(space, budget, started + share * limit_s)
    notes: list[str] = []
    base_ms = space.run(()).compute_ms
    total_ms = graph.total_compute_ms
    bound, proven = None, False
    if run is not None and request.progress is not None:
        request.progress(run.compute_ms, None)
    if exact:
        answer = solve_exact(space, budget, time_limit_s=limit_s - (time.perf_counter() - started),
                             threads=request.threads, seed=request.seed, hint=run)
        run, proven = answer.run, answer.proven
        bound = None if answer.extra_bound_ms is None else total_ms + answer.extra_bound_ms
        if answer.cuts:
            notes.append(f"exact model: {answer.cuts} relaxation optima over budget in the "
                         "simulator, cut off")
    details: dict[str, Any] = {"space": "compiled (selective activation checkpointing)"}
    if run is None:
        smallest = min(space.run(()).peak_bytes, space.run(space.candidates).peak_bytes)
        notes.append("no recomputed set fits: " + ("proven for the compiled space" if proven
                                                   else "none found in time"))
        return MethodResult(actions=None, status=PlanStatus.infeasible if proven
                            else PlanStatus.timeout, backend="sac", notes=notes,
                            smallest_feasible_bytes=smallest if smallest > budget else None,
                            details=details)
    cost = run.compute_ms
    if bound is not None:
        bound = min(bound, cost)
        proven = proven or bound >= cost - 1e-9 * max(1.0, cost)
        gap = (cost - bound) / cost if cost else 0.0
        notes.append(f"bound {bound:.6g} ms in the compiled space (gap {gap:.2%})")
        # The bound holds for compiled steps only: a plan outside the space (a value recomputed
        # twice in the backward) may cost less, so it is not the plan's claimed lower_bound,
        # which the engine's judge holds against every known plan.
        details.update(space_lower_bound_ms=bound, space_gap=round(gap, 6),
                       optimal_in_space=proven)
    details.update(recomputed=len(run.recomputed), predicted_peak_bytes=run.peak_bytes,
                   store_all_ms=base_ms)
    notes.append(f"compiled step: recomputes {len(run.recomputed)} values, predicted peak "
                 f"{run.peak_bytes} bytes")
    return MethodResult(
        actions=compiled_schedule(graph, run.recomputed),
        status=PlanStatus.feasible,
        backend="sac:exact" if exact else "sac:heuristic", objective=cost, notes=notes,
        details=details)


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="sac", run=sac, options=SacOptions, claims_bounds=False,
               summary="plans in the space torch.compile executes (save or recompute once in "
               "the backward): heuristic, then an exact CP-SAT model with a bound"),
)
