"""Backend adapters: one LinearModel, solved by CP-SAT, SCIP/HiGHS/CBC (pywraplp) or PuLP CBC.

Every adapter honours a time limit, threads, a seed and a hint where the solver supports them,
and reports status, objective, best bound and wall time in one typed result.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from planner.solvers.remat.linear import LinearModel
from planner.solvers.remat.stop import Progress, SearchStop, solve_unless_stopped

MIP_BACKENDS = ("cpsat", "scip", "highs", "cbc", "pulp-cbc")
CBC_OBJECTIVE_SCALE = 1e3  # CBC's largest objective coefficient (see _pywraplp)
LP_BACKENDS = ("glop", "highs-lp", "pdlp")
_PYWRAPLP_ID = {"scip": "SCIP", "highs": "HIGHS", "cbc": "CBC", "glop": "GLOP",
                "highs-lp": "HIGHS_LP", "pdlp": "PDLP"}


@dataclass(frozen=True)
class BackendResult:
    backend: str
    status: str  # optimal | feasible | infeasible | unknown
    values: list[float] | None  # one per model variable when a solution exists
    objective: float | None  # Σ objective·values, recomputed from the values
    bound: float | None  # best proven lower bound on the objective
    wall_seconds: float


def solve_linear(
    model: LinearModel,
    backend: str = "cpsat",
    *,
    time_limit_s: float = 60.0,
    threads: int = 2,
    seed: int = 0,
    hint: Mapping[int, float] | None = None,
    stop: SearchStop | None = None,
    progress: Progress | None = None,
    linearization: int | None = None,
) -> BackendResult:
    """`stop` ends a CP-SAT search early (other backends run to their limit). `progress` gets
    (objective, bound) from CP-SAT as they improve; the other backends have no callbacks here
    (pywraplp, PuLP), so they report once, when they finish.

    `linearization`: CP-SAT's linearization_level (default 1). Level 2 puts the whole LP
    relaxation and its cuts into every worker's search: slower to find plans, but with a good
    hint it proves the Checkmate MILP's optimum where level 1 never moves the bound (vgg19 at
    0.8, one worker: proven in 12 s from a hint; level 1 had the trivial bound after 60 s)."""
    started = time.perf_counter()
    if backend == "cpsat":
        status, values, bound = _cpsat(model, time_limit_s, threads, seed, hint, stop, progress,
                                       linearization)
    elif backend in _PYWRAPLP_ID:
        status, values, bound = _pywraplp(model, backend, time_limit_s, threads, seed, hint)
    elif backend == "pulp-cbc":
        status, values, bound = _pulp(model, time_limit_s, threads, seed, hint)
    else:
        known = ", ".join((*MIP_BACKENDS, *LP_BACKENDS))
        raise ValueError(f"unknown backend {backend!r}; choose one of: {known}")
    objective = None
    if values is not None:
        objective = math.fsum(c * values[v] for v, c in model.objective.items())
        if status == "optimal":
            bound = objective if bound is None else min(bound, objective)
            if bound < objective - 1e-7 * max(1.0, abs(objective)):
                # Within the solver's gap tolerance (HiGHS: 1e-4 relative), not closed.
                status = "feasible"
    if progress is not None and backend != "cpsat" and (objective, bound) != (None, None):
        progress(objective, bound)
    return BackendResult(backend, status, values, objective, bound, time.perf_counter() - started)


def _cpsat(model, time_limit_s, threads, seed, hint, stop, progress=None, linearization=None):
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    cp = cp_model.CpModel()
    proto = cp.proto  # filled directly: the expression API is too slow for 10⁵ rows
    for lo, hi in zip(model.lower, model.upper, strict=True):
        # Continuous variables are integral here: every row of our models has integer data.
        proto.variables.add().domain.extend([math.ceil(lo - 1e-9), math.floor(hi + 1e-9)])
    for idx, coef, lo, hi in model.rows:
        icoef = [int(round(c)) for c in coef]
        if any(abs(c - ic) > 1e-9 for c, ic in zip(coef, icoef, strict=True)):
            raise ValueError("CP-SAT needs integer row coefficients")
        lin = proto.constraints.add().linear
        lin.vars.extend(idx)
        lin.coeffs.extend(icoef)
        lin.domain.extend([
            math.ceil(lo - 1e-9) if lo > -math.inf else -(2**62),
            math.floor(hi + 1e-9) if hi < math.inf else 2**62,
        ])
    # Costs scaled and rounded down: the scaled optimum bounds the true one from below (and
    # exactly when every cost is an integer: then the bound closes on the optimum).
    scale = objective_scale(list(model.objective.values()))
    for v, c in model.objective.items():
        proto.objective.vars.append(v)
        proto.objective.coeffs.append(scaled_cost(c, scale))
    xs = [cp.get_int_var_from_proto_index(i) for i in range(model.num_vars)]
    if hint:
        for v, val in hint.items():
            cp.add_hint(xs[v], int(round(val)))
    solver = cp_model.CpSolver()
    # Building the model counts against the limit.
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s - (time.perf_counter() - t0))
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.random_seed = seed
    if linearization is not None:
        solver.parameters.linearization_level = linearization
    objective = None
    if progress is not None:
        terms = [(xs[v], c) for v, c in model.objective.items()]

        def objective(cb) -> float:  # the true cost; CP-SAT's objective is floor-scaled
            return math.fsum(c * cb.value(x) for x, c in terms)
    code = solve_unless_stopped(solver, cp, stop, progress, objective, scale)
    if code is None:
        return "unknown", None, None
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
              cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
    values = None
    bound = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = [float(solver.value(x)) for x in xs]
    if code != cp_model.INFEASIBLE and code != cp_model.MODEL_INVALID:
        bound = solver.best_objective_bound / scale
    if status == "optimal" and values is not None:
        # Optimal for the rounded costs only: keep the proven bound, not the objective.
        objective = _obj(model, values)
        closed = bound is not None and bound >= objective - 1e-9 * max(1.0, abs(objective))
        status = "optimal" if closed else "feasible"
    return status, values, bound


def objective_scale(costs: list[float]) -> float:
    """The factor that turns costs into CP-SAT's integer objective: 1 / gcd when every cost is
    an integer (exact; the corpus's costs are), else 1e9 / the largest (rounded down by
    `scaled_cost`, so bounds stay valid but may fall short of the optimum by the rounding)."""
    top = max((abs(c) for c in costs), default=1.0) or 1.0
    if all(float(c).is_integer() for c in costs) and top * max(1, len(costs)) < 2.0**53:
        return 1.0 / (math.gcd(*(int(c) for c in costs)) or 1)
    return 1e9 / top


def scaled_cost(cost: float, scale: float) -> int:
    """`cost` in the integer units of `objective_scale`: exact for integer costs (whose scaled
    value is an integer up to float error), rounded down otherwise."""
    x = cost * scale
    return round(x) if float(cost).is_integer() and abs(x - round(x)) < 1e-6 else math.floor(x)


def _obj(model: LinearModel, values: list[float]) -> float:
    return math.fsum(c * values[v] for v, c in model.objective.items())


def _pywraplp(model, backend, time_limit_s, threads, seed, hint):
    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver(_PYWRAPLP_ID[backend])
    if solver is None:
        raise RuntimeError(f"OR-Tools has no {backend} solver here")
    inf = solver.infinity()
    xs = []
    for lo, hi, integral in zip(model.lower, model.upper, model.integer, strict=True):
        xs.append(solver.IntVar(lo, hi, "") if integral else solver.NumVar(lo, hi, ""))
    lp_only = not any(model.integer)
    # LPs are equilibrated (rows scaled to unit max coefficient) for the simplex's sake, and so
    # are SCIP's MIPs: with unscaled memory rows (coefficients ~1e7) SCIP proved wrong optima
    # (+6.1 % beside +4.1 % on a 29-node graph). HiGHS and CBC keep the integer data (scaled,
    # CBC proved more wrong optima); any overshoot a tolerance admits is caught when the
    # schedule is rebuilt and checked exactly.
    equilibrate = lp_only or backend == "scip"
    for idx, coef, lo, hi in model.rows:
        k = 1.0 / max(abs(c) for c in coef) if equilibrate else 1.0
        ct = solver.RowConstraint(lo * k if lo > -math.inf else -inf,
                                  hi * k if hi < math.inf else inf, "")
        for v, c in zip(idx, coef, strict=True):
            ct.SetCoefficient(xs[v], c * k)
    obj = solver.Objective()
    top = max((abs(c) for c in model.objective.values()), default=1.0) or 1.0
    if backend == "cbc":
        # CBC (2.10 in OR-Tools) proved wrong optima when the largest cost was 1 (3 of 18
        # corpus-like cases, up to 0.5 % above HiGHS's proven optimum); with the largest cost
        # 1e3 (or 1e6) it proved the right ones in all 18: some absolute tolerance of its
        # search. (Scaling CBC's rows instead made it worse: 4 of 9 wrong.)
        top /= CBC_OBJECTIVE_SCALE
    for v, c in model.objective.items():
        obj.SetCoefficient(xs[v], c / top)
    obj.SetMinimization()
    solver.SetTimeLimit(max(1, int((time_limit_s - (time.perf_counter() - t0)) * 1000)))
    solver.SuppressOutput()
    if backend in ("scip", "highs"):
        solver.SetNumThreads(max(1, threads))
    if backend == "highs":
        # HiGHS's MIP presolve (OR-Tools 9.15) cut off better solutions of these models and
        # claimed wrong optima (vgg_unet at 0.9: "optimal" +1.967 % beside a valid +1.129 %
        # plan; with presolve off it proves +1.129 %), so it stays off for MIPs.
        presolve = "" if lp_only else "presolve = off\n"
        solver.SetSolverSpecificParametersAsString(
            f"output_flag = false\nlog_to_console = false\n{presolve}")
    if backend == "scip":
        # SCIP hands its incumbent's objective to the LP solver as an objective limit. On these
        # models (memory rows with coefficients ~1e7) SoPlex stopped the root LP at that limit
        # after numerical trouble, SCIP pruned the root, and the hint came back "optimal" with
        # its own cost as the bound (fcn8 at 0.8: +21.55 % "proven" beside CBC's +0.136 %).
        # Without the cutoff in the LP the search and its bound stay honest.
        solver.SetSolverSpecificParametersAsString(
            f"randomization/randomseedshift = {seed}\nlp/disablecutoff = 1\n")
    if hint and backend != "highs":  # pywraplp's HiGHS crashes on hints (OR-Tools 9.15)
        keys = list(hint)
        solver.SetHint([xs[v] for v in keys], [float(hint[v]) for v in keys])
    # HiGHS's LP path prints a banner whatever the options (its MIP path does not). Silencing
    # file descriptor 1 silences the whole process, so it is done only for LPs and only on the
    # main thread: auto races the HiGHS MIP in a thread, and a redirect there swallowed the
    # output of the rest of the program (rows of a benchmark, a CLI's JSON).
    # The engine runs methods in a thread named "planner-method" (planner/engine/deadline.py).
    quiet = (backend.startswith("highs") and lp_only
             and (threading.current_thread() is threading.main_thread()
                  or threading.current_thread().name == "planner-method"))
    with _quiet_stdout(quiet):
        code = solver.Solve()
    status = {pywraplp.Solver.OPTIMAL: "optimal", pywraplp.Solver.FEASIBLE: "feasible",
              pywraplp.Solver.INFEASIBLE: "infeasible"}.get(code, "unknown")
    values = None
    bound = None
    if code in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        values = [x.solution_value() for x in xs]
        if not lp_only:
            bound = obj.BestBound() * top
        elif code == pywraplp.Solver.OPTIMAL:
            bound = obj.Value() * top
    return status, values, bound


def _pulp(model, time_limit_s, threads, seed, hint):
    import pulp

    prob = pulp.LpProblem("remat", pulp.LpMinimize)
    xs = [
        prob.add_variable(f"x{i}", lo, hi, pulp.LpInteger if integral else pulp.LpContinuous)
        for i, (lo, hi, integral) in enumerate(
            zip(model.lower, model.upper, model.integer, strict=True)
        )
    ]
    prob += pulp.LpAffineExpression([(xs[v], c) for v, c in model.objective.items()])
    for r, (idx, coef, lo, hi) in enumerate(model.rows):
        expr = pulp.LpAffineExpression(list(zip((xs[v] for v in idx), coef, strict=True)))
        if lo == hi:
            prob += pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{r}", lo)
        else:
            if lo > -math.inf:
                prob += pulp.LpConstraint(expr, pulp.LpConstraintGE, f"r{r}l", lo)
            if hi < math.inf:
                prob += pulp.LpConstraint(expr, pulp.LpConstraintLE, f"r{r}u", hi)
    if hint:
        for v, val in hint.items():
            xs[v].setInitialValue(val)
    with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled-CBC entry point
        warnings.simplefilter("ignore", DeprecationWarning)
        cmd = _pulp_cbc(
            msg=False,
            timeLimit=max(1, time_limit_s),
            threads=max(1, threads),
            warmStart=bool(hint),
            options=[f"randomSeed {seed + 1}"],
        )
        prob.solve(cmd)
    code = pulp.LpStatus[prob.status]
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    values = [float(x.value() or 0.0) for x in xs] if has_solution else None
    if code == "Infeasible":
        status = "infeasible"
    elif prob.sol_status == pulp.LpSolutionOptimal:
        status = "optimal"
    elif has_solution:
        status = "feasible"
    else:
        status = "unknown"
    return status, values, None


def _pulp_cbc(**kwargs):
    import pulp

    return pulp.PULP_CBC_CMD(**kwargs)


@contextlib.contextmanager
def _quiet_stdout(enabled: bool) -> Iterator[None]:
    """Silence native code writing to file descriptor 1 (not Python's sys.stdout object)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
