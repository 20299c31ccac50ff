"""The offload MILP on CP-SAT: its continuous variables put on integer grids.

CP-SAT solves integer programs only. Each continuous variable x gets a grid x = y / s (y an
integer: reload fractions in 1/100ths, stage times in microseconds); each row is multiplied by
the product of the grids it uses, and a coefficient that is still fractional is rounded in the
direction that keeps the row at least as tight (a `≥` row rounds down, a `≤` row up; every
variable is non-negative), so an integral solution is a solution of the original model. The
integral model is a restriction: its bound is not a bound of the MILP (offload-milp claims no
bound on plans anyway; the model's figures stay in the plan's details).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from planner.solvers.remat.linear import INF, LinearModel

EXACT = 1e-9  # a scaled coefficient this close to an integer is that integer


def integral_model(model: LinearModel, grid: Mapping[int, int]) -> LinearModel:
    """`model` with variable v (continuous, ≥ 0) replaced by y_v / grid[v]; every other
    continuous variable must already take integer values (its rows integral)."""
    out = LinearModel()
    upper = _finite_upper(model)
    for v in range(model.num_vars):
        s = grid.get(v, 1)
        if model.lower[v] < 0:
            raise ValueError(f"variable {model.names[v]}: negative values cannot be gridded")
        var_lo = math.ceil(model.lower[v] * s - EXACT)
        var_hi = (math.floor(upper[v] * s + EXACT) if model.upper[v] != INF
                  else math.ceil(upper[v] * s - EXACT))  # a derived bound: round outward
        out.var(model.names[v], var_lo, max(var_lo, var_hi), True)
    for idx, coef, lo, hi in model.rows:
        scale = math.prod({grid.get(v, 1) for v in idx})
        scaled = [c * scale / grid.get(v, 1) for v, c in zip(idx, coef, strict=True)]
        rounded: list[float] = []
        for v, c in zip(idx, scaled, strict=True):
            near = round(c)
            if abs(c - near) <= EXACT:
                rounded.append(float(near))
            elif hi == INF:  # lo ≤ Σ: smaller coefficients only make the row harder
                rounded.append(float(math.floor(c)))
            elif lo == -INF:  # Σ ≤ hi: larger coefficients only make the row harder
                rounded.append(float(math.ceil(c)))
            else:
                raise ValueError(f"row with {model.names[v]}: a two-sided row needs an exact grid")
        out.row(list(idx), rounded,
                -INF if lo == -INF else math.ceil(lo * scale - EXACT),
                INF if hi == INF else math.floor(hi * scale + EXACT))
    out.objective = {v: c / grid.get(v, 1) for v, c in model.objective.items()}
    return out


def _finite_upper(model: LinearModel) -> list[float]:
    """CP-SAT needs finite domains. A variable without an upper bound (a stage time) is only
    pushed up by `≥` rows in which it is the one unbounded variable; with the objective
    minimising it, the largest value those rows can demand bounds it without loss."""
    upper = list(model.upper)
    for idx, coef, lo, hi in model.rows:
        free = [(v, c) for v, c in zip(idx, coef, strict=True) if model.upper[v] == INF]
        if not free:
            continue
        if len(free) > 1 or hi != INF or free[0][1] <= 0 or lo == -INF:
            raise ValueError(f"row with {model.names[free[0][0]]}: unbounded variable that only "
                             "a single ≥ row may bound")
        v, c = free[0]
        rest = sum(abs(cu) * model.upper[u] for u, cu in zip(idx, coef, strict=True) if u != v)
        need = (lo + rest) / c
        upper[v] = need if upper[v] == INF else max(upper[v], need)
    for v, hi in enumerate(upper):
        if hi == INF:
            upper[v] = model.lower[v]  # no row asks more of it: its least value
    return upper


def original_values(values: list[float], grid: Mapping[int, int]) -> list[float]:
    """Values of the original variables from the integral model's."""
    return [x / grid.get(v, 1) for v, x in enumerate(values)]
