"""Checkmate's MILP (Jain et al. 2020) with the frontier-advancing restriction.

Stage t computes node t (topological position) for the first time and nothing after it, so
R[t,t] = 1 and R[t,i>t], S[t,i≥t] do not exist. Memory is in units of the problem's gcd, which
keeps every memory row integral (exact in CP-SAT, exact up to tolerances elsewhere). The
accounting matches `problem.staged_actions`, i.e. the simulator: while node k runs, memory holds
fixed + retained + what the stage computed so far and has not freed + workspace of k, plus the
bytes held from each node's first computation on (gradient buffers: node i is first computed in
stage i, so they are constants of each memory row).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.solvers.remat.linear import INF, LinearModel
from planner.solvers.remat.problem import RematProblem, StagedSchedule


@dataclass
class CheckmateMilp:
    problem: RematProblem
    model: LinearModel
    unit: int  # bytes per memory unit
    R: dict[tuple[int, int], int]  # (t, i): node i is computed in stage t
    S: dict[tuple[int, int], int]  # (t, i): node i is resident when stage t begins
    FREE: dict[tuple[int, int, int], int]  # (t, i, k): i is freed right after k runs in stage t
    U: dict[tuple[int, int], int]  # (t, k): memory units right after k runs in stage t

    def schedule(self, values: Mapping[int, float] | list[float]) -> StagedSchedule:
        """Round a (near-)integral solution to a staged schedule."""
        n = self.problem.n
        computed = [{t} for t in range(n)]
        retained: list[set[int]] = [set() for _ in range(n)]
        for (t, i), v in self.R.items():
            if values[v] > 0.5:
                computed[t].add(i)
        for (t, i), v in self.S.items():
            if values[v] > 0.5:
                retained[t].add(i)
        return StagedSchedule(
            tuple(frozenset(c) for c in computed), tuple(frozenset(r) for r in retained)
        )

    def hint(self, sched: StagedSchedule) -> dict[int, float]:
        """Variable values of a staged schedule (FREE and U by the canonical frees)."""
        p = self.problem
        values: dict[int, float] = {}
        for (t, i), v in self.R.items():
            values[v] = 1.0 if i in sched.computed[t] else 0.0
        for (t, i), v in self.S.items():
            values[v] = 1.0 if i in sched.retained[t] else 0.0
        mem = [b // self.unit for b in p.mem_bytes]
        floor = [b // self.unit for b in p.stage_floor_bytes()]
        for t in range(p.n):
            stage = sched.computed[t]
            keep_next = sched.retained[t + 1] if t + 1 < p.n else frozenset()
            used = floor[t] + sum(mem[i] for i in sched.retained[t])
            for k in range(t + 1):
                if k in stage:
                    used += mem[k]
                if k == t:
                    used += p.held(t) // self.unit
                if (t, k) in self.U:
                    values[self.U[(t, k)]] = float(used)
                for i in (*p.deps[k], k):
                    key = (t, i, k)
                    if key not in self.FREE:
                        continue
                    later = any(k < j <= t and j in stage for j in p.users[i])
                    f = k in stage and i not in keep_next and not later
                    values[self.FREE[key]] = 1.0 if f else 0.0
                    if f:
                        used -= mem[i]
        return values


def build_checkmate(
    problem: RematProblem, *, relax: bool = False, minimise_peak: bool = False
) -> CheckmateMilp:
    """The MILP (or with relax=True its LP relaxation) for `problem`.

    minimise_peak: the budget becomes a variable (the last one) and the objective: the least
    peak of any frontier-advancing schedule, with the problem's budget as its upper bound.
    """
    n = problem.n
    unit = problem.memory_unit
    m = LinearModel()
    R, S, FREE, U = _checkmate_variables(problem, m, integer=not relax)
    peak_var = m.var("PEAK", 0.0, float(problem.budget_units), False) if minimise_peak else None
    if peak_var is not None:
        m.objective.clear()
        m.objective[peak_var] = 1.0
    sizes = _Sizes([b // unit for b in problem.mem_bytes],
                   [b // unit for b in problem.workspace_bytes],
                   [b // unit for b in problem.stage_floor_bytes()])
    for t in range(n):
        _schedule_rows(problem, m, t, R, S, FREE)
        _memory_rows(problem, m, t, R, S, FREE, U, peak_var, sizes)
    return CheckmateMilp(problem, m, unit, R, S, FREE, U)


@dataclass(frozen=True)
class _Sizes:
    """Per node, in memory units: its output and workspace; per stage, the fixed and earlier
    held bytes (the ledger's rules in stage form), constants."""

    mem: list[int]
    ws: list[int]
    floor: list[int]


def _checkmate_variables(problem: RematProblem, m: LinearModel, integer: bool) -> tuple[
        dict[tuple[int, int], int], dict[tuple[int, int], int],
        dict[tuple[int, int, int], int], dict[tuple[int, int], int]]:
    """The model's variables (indices into `m`), the objective on R."""
    n = problem.n
    mem = [b // problem.memory_unit for b in problem.mem_bytes]
    R: dict[tuple[int, int], int] = {}  # (t, i): node i is computed in stage t
    S: dict[tuple[int, int], int] = {}  # (t, i): node i's value is resident at stage t's start
    FREE: dict[tuple[int, int, int], int] = {}  # (t, i, k): i's value is freed after k, stage t
    U: dict[tuple[int, int], int] = {}  # (t, k): memory units in use after node k, stage t
    reach = [-1] * n  # position -> last position among its descendants
    for i in reversed(range(n)):
        for j in problem.users[i]:
            reach[i] = max(reach[i], j, reach[j])
    for t in range(n):
        for i in range(t + 1):
            # Frontier advancing: node t runs in stage t; non-recomputable nodes only there.
            fixed_value = 1.0 if i == t else None
            if i < t and (not problem.recomputable[i] or not problem.users[i]):
                fixed_value = 0.0  # never run twice; recomputing a sink is useless
            lo, hi = (fixed_value, fixed_value) if fixed_value is not None else (0.0, 1.0)
            R[(t, i)] = m.var(f"R_{t}_{i}", lo, hi, integer)
            m.objective[R[(t, i)]] = problem.cost[i]
        for i in range(t):
            # Retaining a value with no descendant from t on only costs memory: fixed to 0.
            useful = reach[i] >= t
            S[(t, i)] = m.var(f"S_{t}_{i}", 0.0, 1.0 if useful else 0.0, integer)
    for t in range(n):
        for k in range(t + 1):
            for i in (*problem.deps[k], k):
                if mem[i] > 0:
                    FREE[(t, i, k)] = m.var(f"FREE_{t}_{i}_{k}", 0.0, 1.0, integer)
            U[(t, k)] = m.var(f"U_{t}_{k}", 0.0, float(problem.budget_units), False)
    return R, S, FREE, U


def _schedule_rows(problem: RematProblem, m: LinearModel, t: int,
                   R: dict[tuple[int, int], int], S: dict[tuple[int, int], int],
                   FREE: dict[tuple[int, int, int], int]) -> None:
    """Stage t's dependency, residency and freeing rows."""
    n = problem.n
    for k in range(t + 1):
        # Inputs of a computed node are resident: computed earlier in the stage or retained.
        for i in problem.deps[k]:
            m.row([R[(t, k)], R[(t, i)], S[(t, i)]], [1.0, -1.0, -1.0], -INF, 0.0)
    for i in range(t):
        # The simulator refuses to compute a resident value.
        m.row([R[(t, i)], S[(t, i)]], [1.0, 1.0], -INF, 1.0)
    if t + 1 < n:
        for i in range(t + 1):
            # A value retained into stage t+1 was resident or computed in stage t.
            idx = [S[(t + 1, i)], R[(t, i)]] + ([S[(t, i)]] if i < t else [])
            m.row(idx, [1.0, -1.0] + ([-1.0] if i < t else []), -INF, 0.0)
    for k in range(t + 1):
        for i in (*problem.deps[k], k):
            if (t, i, k) not in FREE:
                continue
            f = FREE[(t, i, k)]
            # Freed after k only if k ran, it is not retained, and no later user runs.
            m.row([f, R[(t, k)]], [1.0, -1.0], -INF, 0.0)
            if t + 1 < n:
                m.row([f, S[(t + 1, i)]], [1.0, 1.0], -INF, 1.0)
            for j in problem.users[i]:
                if k < j <= t:
                    m.row([f, R[(t, j)]], [1.0, 1.0], -INF, 1.0)


def _memory_rows(problem: RematProblem, m: LinearModel, t: int,
                 R: dict[tuple[int, int], int], S: dict[tuple[int, int], int],
                 FREE: dict[tuple[int, int, int], int], U: dict[tuple[int, int], int],
                 peak_var: int | None, sizes: _Sizes) -> None:
    """Stage t's memory: U[t,0] = fixed + retained + output of 0; U[t,k] = U[t,k-1] - freed +
    output k; with the workspace of k, below the budget (or the peak variable)."""
    unit = problem.memory_unit
    mem, ws, budget = sizes.mem, sizes.ws, problem.budget_units
    for k in range(t + 1):
        idx = [U[(t, k)], R[(t, k)]]
        coef = [1.0, -float(mem[k])]
        # Held bytes: nodes before t were first computed in earlier stages; t's start now.
        const = float(problem.held(t) // unit) if k == t else 0.0
        if k == 0:
            const += float(sizes.floor[t])
            for i in range(t):
                if mem[i]:
                    idx.append(S[(t, i)])
                    coef.append(-float(mem[i]))
        else:
            idx.append(U[(t, k - 1)])
            coef.append(-1.0)
            for i in (*problem.deps[k - 1], k - 1):
                if (t, i, k - 1) in FREE:
                    idx.append(FREE[(t, i, k - 1)])
                    coef.append(float(mem[i]))
        m.row(idx, coef, const, const)
        if peak_var is not None:
            # Peak: memory while k runs (workspace included) stays below the peak variable.
            m.row([U[(t, k)], R[(t, k)], peak_var], [1.0, float(ws[k]), -1.0], -INF, 0.0)
        elif ws[k]:
            # Workspace is held only while k runs.
            m.row([U[(t, k)], R[(t, k)]], [1.0, float(ws[k])], -INF, float(budget))
