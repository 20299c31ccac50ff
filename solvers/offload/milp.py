"""`offload-milp`: offloading and recomputation together on Checkmate's stage grid (a MILP).

Stages are the computes of the store-all plan in the graph's order (stage t runs the t-th
node). Each window w of that plan (planner.solvers.offload.schedule: node v idle between its last
use
before the gap, stage a_w, and its next use, stage b_w) is kept, offloaded or recomputed:

- KEEP[w], OFF[w], RC[w] ∈ {0,1}: exactly one. RC[w] recomputes v right before stage b_w (cost
  c_v), allowed when v may run twice and every input of v is resident at b_w in store-all
  (RC[w] ≤ KEEP[u] for an input u whose own window covers b_w).
- PRE[w,q] ∈ {0,1}: the reload of an offloaded w starts before stage q, q among the last
  `PREFETCH_CHOICES` stages of the gap and not before the device copy is released (free_w: the
  first stage after a_w by which the compute since v's production covers its copy out).
- MOVE[w,t] ∈ [0,1]: the fraction of w's reload carried during stage t (t from its start to
  b_w - 1).
- TIME[t] ≥ compute of stage t (+ recomputations), ≥ Σ_w reload_ms_w·MOVE[w,t] (the h2d link).
- Memory during stage t: store-all's live bytes − Σ_{w: a_w < t < b_w} bytes_w·(1 − occupied),
  occupied = KEEP + OFF·[t < free_w] + Σ_{q ≤ t} PRE[w,q]; ≤ budget.
Objective: Σ TIME[t] (the makespan with overlap, in this model) + a tiny per-byte term.

The model's space: store-all's order, up to 4 windows per residency, a few reload positions,
copies out that never queue (the d2h link is not modelled) and no recomputation chains. Its
bound is valid for that space only, never for every plan; the simulator judges the plan it
translates to, and the best heuristic plan (its hint) is returned instead when faster.
Options: backend (scip, highs, cbc, or cpsat: the same model with stage times in microseconds
and reload fractions in hundredths, planner.solvers.offload.integral; default scip), max_nodes
(default
400).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from planner.core.errors import InputError
from planner.core.plan import Action, ActionOp, compute, free
from planner.solvers.baselines import store_all
from planner.solvers.offload.heuristics import beaumont
from planner.solvers.offload.integral import integral_model, original_values
from planner.solvers.offload.options import MILP_BACKENDS, MILP_MAX_NODES, OffloadMilpOptions
from planner.solvers.offload.schedule import (
    MAX_WINDOWS_PER_INTERVAL,
    Window,
    WindowKey,
    base_timeline,
    find_windows,
    with_offloads,
)
from planner.solvers.offload.search import (
    Judge,
    Judged,
    better,
    judged_result,
    require_host_tier,
)
from planner.solvers.remat.backends import solve_linear
from planner.solvers.remat.linear import INF, LinearModel
from planner.solvers.request import MethodResult, SolveRequest

PREFETCH_CHOICES = 6
MAX_NODES = MILP_MAX_NODES
BACKENDS = MILP_BACKENDS
TIME_GRID, MOVE_GRID = 1000, 100  # CP-SAT: stage times in µs, reload fractions in 1/100
BYTE_WEIGHT = 1e-12  # ms per byte moved: breaks ties toward fewer copies


@dataclass
class OffloadMilp:
    model: LinearModel
    windows: list[Window]
    stage_of: dict[int, int]  # action index of a compute -> its stage
    KEEP: dict[int, int]  # w: window w stays on the device
    OFF: dict[int, int]  # w: window w is offloaded
    RC: dict[int, int]  # w: window w's node is recomputed before its use
    PRE: dict[tuple[int, int], int]  # (w, q): w's reload starts before stage q
    TIME: dict[int, int]  # t: duration of stage t


@dataclass
class _Grid:
    """The model being built: the store-all plan's stages and the variables so far."""

    judge: Judge
    base: list[Action]
    windows: list[Window]
    computes: list[int]  # stage -> its compute's action index
    stage_of: dict[int, int]  # action index of a compute -> its stage
    m: LinearModel
    KEEP: dict[int, int]  # w: window w stays on the device
    OFF: dict[int, int]  # w: window w is offloaded
    RC: dict[int, int]  # w: window w's node is recomputed before its use
    PRE: dict[tuple[int, int], int]  # (w, q): w's reload starts before stage q
    MOVE: dict[tuple[int, int], int]  # (w, t): the fraction of w's reload carried in stage t
    TIME: dict[int, int]  # t: duration of stage t
    covering: dict[int, list[tuple[int, int]]]  # stage -> (window, free stage)
    pre_of: dict[int, list[tuple[int, int]]]  # window -> (q, PRE variable)

    def compute_ms(self, t: int) -> float:
        return self.judge.graph.index.node(self.base[self.computes[t]].node).compute_ms


def build(judge: Judge, base: list[Action], windows: list[Window]) -> OffloadMilp:
    graph = judge.graph
    sim = judge(base)
    assert sim is not None
    computes = [i for i, a in enumerate(base) if a.op is ActionOp.compute]
    m = LinearModel()
    g = _Grid(judge, base, windows, computes, {i: t for t, i in enumerate(computes)}, m,
              {}, {}, {}, {}, {}, {}, {}, {})
    for t in range(len(computes)):
        g.TIME[t] = m.var(f"TIME_{t}", g.compute_ms(t), INF, False)
        m.objective[g.TIME[t]] = 1.0
    timeline = base_timeline(graph, base)
    freed_at = {a.node: i for i, a in enumerate(base) if a.op is ActionOp.free}
    for w, win in enumerate(windows):
        _window_rows(g, w, win, timeline.start_ms, freed_at)
    _input_rows(g)
    _stage_rows(g)
    return OffloadMilp(m, windows, g.stage_of, g.KEEP, g.OFF, g.RC, g.PRE, g.TIME)


def _window_rows(g: _Grid, w: int, win: Window, start_ms: tuple[float, ...],
                 freed_at: dict[int, int]) -> None:
    """Window w's variables and its own rows."""
    index, r, m = g.judge.graph.index, g.judge.resources, g.m
    assert r.d2h is not None
    a, b = g.stage_of[win.gap_start], g.stage_of[win.gap_end]
    out_ms = r.d2h.transfer_ms(win.nbytes)
    free_at = a + 1
    while free_at < b and start_ms[g.computes[free_at]] < win.produced_ms + out_ms:
        free_at += 1
    KEEP, OFF, RC, PRE, MOVE = g.KEEP, g.OFF, g.RC, g.PRE, g.MOVE
    KEEP[w] = m.var(f"KEEP_{w}", 0, 1, True)
    OFF[w] = m.var(f"OFF_{w}", 0, 1, True)
    rc_ok = index.node(win.node).recomputable and all(
        freed_at.get(u, len(g.base)) > win.gap_end for u in index.predecessors[win.node])
    RC[w] = m.var(f"RC_{w}", 0, 1 if rc_ok else 0, True)
    # one decision per window
    m.row([KEEP[w], OFF[w], RC[w]], [1.0, 1.0, 1.0], 1, 1)
    m.objective[OFF[w]] = 2 * win.nbytes * BYTE_WEIGHT
    first_q = max(free_at, b - PREFETCH_CHOICES + 1, a + 1)
    qs = list(range(first_q, b + 1))
    for q in qs:
        PRE[(w, q)] = m.var(f"PRE_{w}_{q}", 0, 1, True)
        g.pre_of.setdefault(w, []).append((q, PRE[(w, q)]))
    # an offloaded window is reloaded exactly once
    m.row([PRE[(w, q)] for q in qs] + [OFF[w]], [1.0] * len(qs) + [-1.0], 0, 0)
    for t in range(first_q, b):
        MOVE[(w, t)] = m.var(f"MOVE_{w}_{t}", 0, 1, False)
        # a reload moves only once started
        m.row([MOVE[(w, t)]] + [PRE[(w, q)] for q in qs if q <= t],
              [1.0] + [-1.0] * sum(1 for q in qs if q <= t), -INF, 0)
    # the whole reload happens before the use
    m.row([MOVE[(w, t)] for t in range(first_q, b)] + [OFF[w]],
          [1.0] * (b - first_q) + [-1.0], 0, 0)
    for t in range(a + 1, b):
        g.covering.setdefault(t, []).append((w, free_at))


def _input_rows(g: _Grid) -> None:
    """Recomputing needs the inputs: kept where their windows cover the use."""
    index = g.judge.graph.index
    windows_of: dict[int, list[int]] = {}  # node -> its windows
    for w, win in enumerate(g.windows):
        windows_of.setdefault(win.node, []).append(w)
    for w, win in enumerate(g.windows):
        b = g.stage_of[win.gap_end]
        for u in index.predecessors[win.node]:
            for wu in windows_of.get(u, []):
                uw = g.windows[wu]
                if g.stage_of[uw.gap_start] < b < g.stage_of[uw.gap_end]:
                    g.m.row([g.RC[w], g.KEEP[wu]], [1.0, -1.0], -INF, 0)


def _stage_rows(g: _Grid) -> None:
    """Per stage: the h2d link, the recomputations and memory within the budget."""
    from planner.sim.simulator import simulate

    index, r, m = g.judge.graph.index, g.judge.resources, g.m
    assert r.h2d is not None
    live = simulate(g.judge.graph, g.base).live_bytes  # store-all: one stream, per action
    moving_in: dict[int, list[tuple[int, int]]] = {}
    for (w, tt), v in g.MOVE.items():
        moving_in.setdefault(tt, []).append((w, v))
    ending: dict[int, list[int]] = {}
    for w, win in enumerate(g.windows):
        ending.setdefault(g.stage_of[win.gap_end], []).append(w)
    for t in range(len(g.computes)):
        # the h2d link: reloads carried in stage t fit in its duration
        moving = moving_in.get(t, [])
        if moving:
            m.row([g.TIME[t]] + [v for _, v in moving],
                  [1.0] + [-r.h2d.transfer_ms(g.windows[w_].nbytes) for w_, _ in moving], 0, INF)
        # stage time covers the recomputations before it
        rcs = ending.get(t, [])
        if rcs:
            m.row([g.TIME[t]] + [g.RC[w] for w in rcs],
                  [1.0] + [-index.node(g.windows[w].node).compute_ms for w in rcs],
                  g.compute_ms(t), INF)
        # memory during stage t within the budget
        cover = g.covering.get(t, [])
        if cover:
            idx: list[int] = []
            coef: list[float] = []
            const = float(live[g.computes[t]])
            for w, free_at in cover:
                nb = float(g.windows[w].nbytes)
                const -= nb
                idx.append(g.KEEP[w])
                coef.append(nb)
                if t < free_at:
                    idx.append(g.OFF[w])
                    coef.append(nb)
                for q, v in g.pre_of.get(w, []):
                    if q <= t:
                        idx.append(v)
                        coef.append(nb)
            m.row(idx, coef, -INF, g.judge.budget_bytes - const)


def hint_of(milp: OffloadMilp, plan: list[Action]) -> dict[int, float]:
    """KEEP/OFF/PRE values of a plan built by `with_offloads` on the same base (others free)."""
    offloaded = {a.node for a in plan if a.op is ActionOp.offload}
    out: dict[int, float] = {}
    for w, win in enumerate(milp.windows):
        off = win.node in offloaded
        out[milp.KEEP[w]] = 0.0 if off else 1.0
        out[milp.OFF[w]] = 1.0 if off else 0.0
        out[milp.RC[w]] = 0.0
    return out


def plan_of(milp: OffloadMilp, base: list[Action], values: list[float]) -> list[Action]:
    computes = {t: i for i, t in milp.stage_of.items()}
    chosen: list[Window] = []
    positions: dict[WindowKey, int] = {}
    recompute: dict[int, list[Action]] = {}  # action index of the use -> recomputations before
    release: dict[int, list[Action]] = {}  # action index -> frees after it
    for w, win in enumerate(milp.windows):
        if values[milp.OFF[w]] > 0.5:
            q = next(q for (ww, q), v in milp.PRE.items() if ww == w and values[v] > 0.5)
            chosen.append(win)
            positions[win.key] = computes[q]
        elif values[milp.RC[w]] > 0.5:
            recompute.setdefault(win.gap_end, []).append(compute(win.node))
            release.setdefault(win.gap_start, []).append(free(win.node))
    return with_offloads(base, chosen, positions, extra_before=recompute, extra_after=release)


def milp_plan(judge: Judge, base: list[Action], hint: Judged | None, time_limit_s: float, *,
              backend: str = "scip", threads: int = 1, seed: int = 0,
              windows: list[Window] | None = None) -> tuple[Judged | None, str, dict[str, Any]]:
    """Solve the model hinted with `hint` (a plan on `base`) and judge its plan: (the better of
    the two, "milp" or "hint", the model's figures: status, objective, bound, gap, size)."""
    windows = find_windows(judge.graph, base) if windows is None else windows
    milp = build(judge, base, windows)
    hinted = hint_of(milp, hint.actions) if hint is not None and hint.fits else None
    model_to_solve, grid = milp.model, {}
    if backend == "cpsat":  # integer variables only: the continuous ones on grids
        grid = {v: TIME_GRID if name.startswith("TIME_") else MOVE_GRID
                for v, name in enumerate(milp.model.names) if not milp.model.integer[v]}
        model_to_solve = integral_model(milp.model, grid)
    r = solve_linear(model_to_solve, backend, time_limit_s=max(0.1, time_limit_s),
                     threads=threads, seed=seed, hint=hinted)
    model: dict[str, Any] = {
        "backend": backend, "status": r.status, "objective_ms": r.objective,
        "bound_ms": r.bound, "variables": milp.model.num_vars, "rows": len(milp.model.rows),
        "windows": len(windows), "wall_seconds": round(r.wall_seconds, 3),
    }
    if r.objective is not None and r.bound is not None and r.objective > 0:
        model["gap"] = max(0.0, (r.objective - r.bound) / r.objective)
    if r.values is None:
        return hint, "hint", model
    values = original_values(r.values, grid) if grid else r.values
    got = judge(plan_of(milp, base, values))
    if got is None:
        model["plan"] = "the model's plan does not run on the graph"
        return hint, "hint", model
    return (got, "milp", model) if better(hint, got) is got else (hint, "hint", model)


def milp_method(request: SolveRequest) -> MethodResult:
    resources = require_host_tier(request.resources, "offload-milp")
    defaults = OffloadMilpOptions()  # the spec's options: one place for their defaults
    backend = str(request.options.get("backend") or defaults.backend)
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    max_nodes = request.options.get("max_nodes", defaults.max_nodes)
    if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1:
        raise InputError(f"option max_nodes {max_nodes!r}: must be an integer ≥ 1")
    started = time.perf_counter()
    graph = request.graph
    judge = Judge(graph, request.budget_bytes, resources)
    base = store_all(graph)
    hint = beaumont(judge, base, started + 0.3 * request.time_limit_s).best
    notes: list[str] = []
    details: dict[str, Any] = {}
    windows = find_windows(graph, base)
    if len(graph.nodes) > max_nodes or not windows:
        why = (f"{len(graph.nodes)} nodes > max_nodes {max_nodes}" if windows
               else "no window to offload")
        notes.append(f"MILP not built ({why}): the Beaumont heuristic's plan, no bound")
        return judged_result(request, judge, hint, "offload-milp:heuristic", notes, details)
    left = request.time_limit_s - (time.perf_counter() - started)
    best, source, details["model"] = milp_plan(
        judge, base, hint, left, backend=backend, threads=request.threads, seed=request.seed,
        windows=windows)
    notes.append("the model's bound holds only in its space (store-all order, up to "
                 f"{MAX_WINDOWS_PER_INTERVAL} windows per residency, {PREFETCH_CHOICES} reload "
                 "positions, copies out not queued, one recomputation per window from resident "
                 "inputs): no bound on every plan is claimed")
    if "plan" in details["model"]:
        notes.append(details["model"]["plan"] + "; the hint is returned")
    return judged_result(request, judge, best, f"offload-milp:{backend}:{source}", notes, details)
