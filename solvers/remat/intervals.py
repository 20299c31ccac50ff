"""A CP-SAT interval model in the spirit of Moccasin (Bartan et al. 2023).

Time is a sequence of steps, one computation per step. Node v may be computed up to C_v times;
computation c of v has a presence literal, a start step s (when it runs) and an end step e (the
step after whose computation it is freed): its retention interval [s, e] holds mem(v) bytes.
While a step runs, memory holds every retention interval covering it plus the workspace of the
node it runs: a cumulative constraint. Each input of a computation is covered by a retention
interval of one of its producer's computations that started earlier. First computations follow
the graph's topological order (as in Checkmate's frontier form); recomputations are free to go
anywhere, so this model's optimum is never worse than the frontier-advancing MILP's once every
C_v is large enough. O(C·n) intervals instead of the MILP's O(n²) binaries. Bytes held from a
node's first computation to the end of the step (gradient buffers) are one more interval each,
from that computation's step to the horizon.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from planner.core.plan import Action, ActionOp, compute, free
from planner.solvers.remat.backends import objective_scale, scaled_cost
from planner.solvers.remat.exact import RematResult
from planner.solvers.remat.problem import RematProblem
from planner.solvers.remat.stop import Progress, SearchStop, solve_unless_stopped


def plan_peak_and_cost(problem: RematProblem, actions: list[Action]) -> tuple[int, float]:
    """Peak bytes (the simulator's accounting, views charged as in the problem) and cost:
    the problem's memory ledger."""
    figures = problem.replay(actions)
    return figures.peak_bytes, figures.compute_cost


def _peak(problem: RematProblem, actions: list[Action]) -> int:
    return plan_peak_and_cost(problem, actions)[0]


@dataclass
class _Model:
    """The CP-SAT model: (v, c) -> computation c of node v is present (P) / runs at step S /
    is freed after step E."""

    m: Any
    count: list[int]  # C_v: computations of each node the model allows
    horizon: int
    P: dict[tuple[int, int], Any] = field(default_factory=dict)
    S: dict[tuple[int, int], Any] = field(default_factory=dict)
    E: dict[tuple[int, int], Any] = field(default_factory=dict)


def solve_intervals(
    problem: RematProblem,
    *,
    max_computations: int | None = None,
    free_order: bool = False,
    time_limit_s: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    hint: list[Action] | None = None,
    stop: SearchStop | None = None,
    progress: Progress | None = None,
) -> RematResult:
    """Solve; max_computations caps C_v (default: every stage it could appear in); free_order:
    first computations in any order the edges allow, not the problem's (a search for plans in
    other orders; its bound, when uncapped, covers every schedule); `stop` ends
    the search early from another thread; `progress(objective, bound)` hears of the hint (when
    it fits) and of every improvement (the bound only when it is one: uncapped)."""
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    capacity = problem.budget_units - problem.fixed_bytes // problem.memory_unit
    if capacity < 0:
        return RematResult("infeasible", "cpsat-intervals", bound=None,
                           wall_seconds=time.perf_counter() - started)
    model = _build_model(problem, _computation_counts(problem, max_computations, hint),
                         capacity, free_order)
    if hint is not None:
        _add_hint(model.m, problem, hint, model.count, model.P, model.S, model.E)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter() - started))
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    report = progress
    if progress is not None and max_computations is not None:
        report = lambda objective, _bound: progress(objective, None)  # noqa: E731 (no proof)
    if report is not None and hint is not None:
        hint_peak, hint_cost = plan_peak_and_cost(problem, hint)
        if hint_peak <= problem.budget_bytes:
            report(hint_cost, None)
    terms = [(model.P[k], problem.cost[k[0]]) for k in model.P]

    def objective(cb) -> float:  # the true cost of the solution (CP-SAT's is rounded)
        return sum(c * cb.value(p) for p, c in terms)
    code = solve_unless_stopped(solver, model.m, stop, report, objective, _scale(problem))
    return _result(problem, model, solver, code, hint, started)


def _computation_counts(
    problem: RematProblem, max_computations: int | None, hint: list[Action] | None
) -> list[int]:
    """C_v: every stage a node could appear in (capped), and room for the hint's computations."""
    n = problem.n
    count = [
        1 if not problem.recomputable[v] or not problem.users[v]
        else min(n - v, max_computations or n) for v in range(n)
    ]
    if hint is not None:  # room for every computation the hint makes
        pos = {v: i for i, v in enumerate(problem.node_ids)}
        made = [0] * n
        for a in hint:
            if a.op is ActionOp.compute:
                made[pos[a.node]] += 1
        count = [max(c, k) for c, k in zip(count, made, strict=True)]
    return count


def _build_model(
    problem: RematProblem, count: list[int], capacity: int, free_order: bool
) -> _Model:
    """Variables, the one-computation-per-step and memory constraints, the order of first
    computations, input coverage and the objective (in this order: CP-SAT's search depends
    on it)."""
    from ortools.sat.python import cp_model

    n, unit = problem.n, problem.memory_unit
    mem = [b // unit for b in problem.mem_bytes]
    ws = [b // unit for b in problem.workspace_bytes]
    model = _Model(cp_model.CpModel(), count, sum(count))
    m, P, S, E, horizon = model.m, model.P, model.S, model.E, model.horizon
    # Earliest step of a node's first computation: its position, or with free_order the
    # number of its ancestors (each computed before it at least once).
    first = list(range(n)) if not free_order else _ancestor_counts(problem)
    run_intervals, keep_intervals, keep_demands, ws_intervals, ws_demands = [], [], [], [], []
    for v in range(n):
        for c in range(count[v]):
            p = m.new_constant(1) if c == 0 else m.new_bool_var(f"p{v}_{c}")
            s = m.new_int_var(first[v] if c == 0 else first[v] + 1, horizon - 1, f"s{v}_{c}")
            e = m.new_int_var(first[v] if c == 0 else first[v] + 1, horizon - 1, f"e{v}_{c}")
            P[(v, c)], S[(v, c)], E[(v, c)] = p, s, e
            m.add(e >= s)
            # One computation per step.
            run_intervals.append(m.new_optional_fixed_size_interval_var(s, 1, p, f"r{v}_{c}"))
            if mem[v]:
                size = m.new_int_var(1, horizon, f"len{v}_{c}")
                m.add(size == e - s + 1)
                keep_intervals.append(
                    m.new_optional_interval_var(s, size, e + 1, p, f"k{v}_{c}"))
                keep_demands.append(mem[v])
            if ws[v]:
                ws_intervals.append(run_intervals[-1])
                ws_demands.append(ws[v])
            if c == 0 and problem.held(v):
                # Held from the first computation to the end of the step.
                # (the interval itself ties start + length to the horizon)
                held_len = m.new_int_var(1, horizon, f"held_len{v}")
                keep_intervals.append(m.new_interval_var(s, held_len, horizon, f"h{v}"))
                keep_demands.append(problem.held(v) // unit)
            if c > 0:
                # Computations of a node come in order, present ones first, and never overlap
                # (the simulator refuses to compute a resident value).
                m.add_implication(p, P[(v, c - 1)])
                m.add(s > E[(v, c - 1)]).only_enforce_if(p)
            if not problem.users[v]:
                m.add(e == s)  # outputs nobody reads are freed at once
    m.add_no_overlap(run_intervals)
    # Memory: retention intervals plus the running node's workspace within the budget.
    m.add_cumulative(keep_intervals + ws_intervals, keep_demands + ws_demands, capacity)
    # First computations follow the topological order (unless free_order: then the inputs'
    # coverage below orders them).
    for v in range(1, n if not free_order else 0):
        m.add(S[(v, 0)] > S[(v - 1, 0)])
    _add_coverage(problem, model)
    m.minimize(sum(scaled_cost(problem.cost[v], _scale(problem)) * P[(v, c)]
                   for v in range(n) for c in range(count[v])))
    return model


def _add_coverage(problem: RematProblem, model: _Model) -> None:
    """Inputs: each computation of v is covered by a retention interval of every producer u."""
    m, P, S, E, count = model.m, model.P, model.S, model.E, model.count
    for v in range(problem.n):
        for c in range(count[v]):
            for u in problem.deps[v]:
                covers = []
                for d in range(count[u]):
                    z = m.new_bool_var(f"z{u}_{d}_{v}_{c}")
                    m.add_implication(z, P[(u, d)])
                    m.add(S[(u, d)] < S[(v, c)]).only_enforce_if(z)
                    m.add(E[(u, d)] >= S[(v, c)]).only_enforce_if(z)
                    covers.append(z)
                m.add_bool_or(covers).only_enforce_if(P[(v, c)])


def _result(
    problem: RematProblem, model: _Model, solver: Any, code: int | None,
    hint: list[Action] | None, started: float,
) -> RematResult:
    """The solver's answer as a result: its plan, or the hint when that is better or all."""
    from ortools.sat.python import cp_model

    if code is None:
        return _hint_result(problem, hint, None, time.perf_counter() - started) or RematResult(
            "unknown", "cpsat-intervals", wall_seconds=time.perf_counter() - started)
    wall = time.perf_counter() - started
    if code == cp_model.INFEASIBLE:
        return RematResult("infeasible", "cpsat-intervals", wall_seconds=wall)
    bound = None
    if code != cp_model.MODEL_INVALID:
        bound = solver.best_objective_bound / _scale(problem)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        fallback = _hint_result(problem, hint, bound, wall)
        return fallback or RematResult("unknown", "cpsat-intervals", bound=bound,
                                       wall_seconds=wall)
    present = sorted(
        (solver.value(model.S[k]), k[0], solver.value(model.E[k]))
        for k in model.P if solver.value(model.P[k])
    )
    actions = _solution_actions(problem, present, model.horizon)
    cost = sum(problem.cost[v] for _, v, _ in present)
    status = "optimal" if code == cp_model.OPTIMAL and _integral_costs(problem) else "feasible"
    if bound is not None and bound >= cost - 1e-9 * max(1.0, cost):
        status = "optimal"
    fallback = _hint_result(problem, hint, bound, wall)
    if fallback is not None and fallback.cost is not None and fallback.cost < cost:
        return fallback
    return RematResult(status, "cpsat-intervals", actions, None, cost, _peak(problem, actions),
                       min(bound, cost) if bound is not None else None, wall)


def _solution_actions(
    problem: RematProblem, present: list[tuple[int, int, int]], horizon: int
) -> list[Action]:
    """Compute and free actions of the present computations (start step, position, end step),
    sorted by start: each value freed before the first step after its end."""
    actions: list[Action] = []
    pending: list[tuple[int, int]] = []  # (end step, node position)
    for idx, (_, v, end) in enumerate(present):
        actions.append(compute(problem.node_ids[v]))
        pending.append((end, v))
        nxt = present[idx + 1][0] if idx + 1 < len(present) else horizon
        for end_step, u in sorted(pending):
            if end_step < nxt:
                actions.append(free(problem.node_ids[u]))
        pending = [(e, u) for e, u in pending if e >= nxt]
    return actions


def _hint_result(
    problem: RematProblem, hint: list[Action] | None, bound: float | None, wall: float,
) -> RematResult | None:
    """The hint as a result when it fits the budget: the solver may miss it (its hint is
    partial), yet it stays the best plan known."""
    if hint is None:
        return None
    peak, cost = plan_peak_and_cost(problem, hint)
    if peak > problem.budget_bytes:
        return None
    return RematResult("feasible", "cpsat-intervals", list(hint), None, cost, peak,
                       min(bound, cost) if bound is not None else None, wall,
                       ("the solver found nothing better in time; returning the hint",))


def _ancestor_counts(problem: RematProblem) -> list[int]:
    ancestors: list[set[int]] = []
    for v in range(problem.n):  # positions are topological: inputs come first
        mine: set[int] = set()
        for u in problem.deps[v]:
            mine.add(u)
            mine |= ancestors[u]
        ancestors.append(mine)
    return [len(a) for a in ancestors]


def _scale(problem: RematProblem) -> float:
    return objective_scale(list(problem.cost))


def _integral_costs(problem: RematProblem) -> bool:
    s = _scale(problem)
    return all(abs(c * s - round(c * s)) < 1e-6 for c in problem.cost)


def _add_hint(m, problem, hint, count, P, S, E) -> None:
    pos = {v: i for i, v in enumerate(problem.node_ids)}
    comps: dict[int, list[list[int]]] = {}
    step = -1
    open_: dict[int, list[int]] = {}
    for a in hint:
        v = pos[a.node]
        if a.op is ActionOp.compute:
            step += 1
            rec = [step, step]
            comps.setdefault(v, []).append(rec)
            open_[v] = rec
        else:
            rec = open_.pop(v)
            rec[1] = step
    for rec in open_.values():
        rec[1] = sum(count) - 1
    if any(len(cs) > count[v] for v, cs in comps.items()):
        return
    for v, cs in comps.items():
        for c in range(count[v]):
            if c < len(cs):
                if c > 0:
                    m.add_hint(P[(v, c)], 1)
                m.add_hint(S[(v, c)], cs[c][0])
                m.add_hint(E[(v, c)], cs[c][1])
            elif c > 0:
                m.add_hint(P[(v, c)], 0)
