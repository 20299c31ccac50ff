"""`auto`: an in-budget plan within seconds at any size, then improvement, with a proven bound.

1. A time-boxed portfolio of fast heuristics (`portfolio.run_portfolio`): store-all in
   memory-aware orders, greedy checkpoint eviction (incremental), the baselines, dynamic
   eviction and the module-level chain DP, each with a share of the time that adapts to the
   graph's size. With three threads or more, on graphs small enough for it, the HiGHS MILP
   starts at once in its own thread (it releases the GIL) and races everything below; it stops
   the others on a proof.
2. Small graphs (≤ EXACT_MAX_NODES): the LP relaxation (HiGHS) for a bound and LP-rounded plans;
   on ≤ MILP_MAX_NODES the MILP on CP-SAT, first to find plans (default search, hinted with the
   best plan, until it stalls), then to prove (the LP in the search, one worker, hinted with
   the best plan found); then the CP-SAT interval model (Moccasin-style).
   Its bound counts only when every node may be computed as often as the MILP allows (small
   graphs); on larger graphs recomputations per node are capped: fast, but no proof.
3. Larger graphs: large-neighbourhood search (`lns.improve_windows`) on windows of the best
   checkpoint plan, randomised memory-aware orders (a fit in a new order costs nothing extra)
   and the greedy add-back search, until the deadline.
The best in-budget plan found in time is returned with its gap, against the bound that covers
it: LP/MILP bounds cover Checkmate's staged schedules (first computations in the graph's order,
ascending recomputations between them); the uncapped interval model's bound covers any schedule
whose first computations follow the graph's order; any other plan gets the universal bound
(every node computed once), raised by the cut bound (`cut_bound`: a value read across a node is
resident there or computed again), which holds for plans in any order. Every phase checks the
deadline: the answer comes within the time limit less a margin for turning the plan into
actions and judging it (`final_margin_s`).

Before step 1, up to CUT_FIRST_MAX_NODES, the cut bound's proof of infeasibility (no LP). On
training graphs of EXACT_MAX_NODES-COUNTED_MAX_NODES nodes, steps 1 and 3 go by counts that the
limit buys (`portfolio`'s counted phase, then `counted_kicks`), the deadline a safety net: the
same request gets the same plan on a loaded machine.

The phases share one explicit state, `auto_search.AutoSearch` (the incumbent, the bounds, the
deadline, the listener); the exact searches of step 2 are `auto_exact.ExactSearch`, the
portfolio `portfolio.Portfolio`.
"""

from __future__ import annotations

import time

from planner.core.graph import Graph
from planner.sim.simulator import lower_bound_peak_bytes
from planner.solvers.remat.auto_exact import (
    EXACT_INTERVALS_MAX_NODES,
    FIND_SHARE,
    FIND_STALL_FRACTION,
    GAP_TO_STOP,
    LP_MAX_NODES,
    MILP_MAX_NODES,
    PROVE_SHARE,
    RECOMPUTATIONS_CAP,
    ExactSearch,
    HighsRace,
)
from planner.solvers.remat.auto_search import (
    EXACT_MAX_NODES,
    AutoConfig,
    AutoResult,
    AutoSearch,
    Incumbent,
)
from planner.solvers.remat.chain_candidates import (
    chain_candidate,
    finer_chain_candidate,
    is_training,
)
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.counted_kicks import counted_kicks, kicks_for
from planner.solvers.remat.cut_bound import cut_lower_bound
from planner.solvers.remat.improve_large import improve_large
from planner.solvers.remat.portfolio import LOWERED_FIRST_NODES, run_portfolio
from planner.solvers.remat.problem import problem_from_graph
from planner.solvers.remat.sink_search import decide_from_sink, plan_when_none_fits
from planner.solvers.remat.stop import PlanListener, Progress, SearchStop

__all__ = [
    "COUNTED_MAX_NODES", "CUT_BOUND_SHARE", "CUT_FIRST_MAX_NODES", "EXACT_INTERVALS_MAX_NODES",
    "EXACT_MAX_NODES", "FIND_SHARE", "FIND_STALL_FRACTION", "GAP_TO_STOP",
    "HIGHS_RACE_MIN_THREADS", "LP_MAX_NODES", "MILP_MAX_NODES", "PROVE_SHARE",
    "RECOMPUTATIONS_CAP", "AutoConfig", "AutoResult", "AutoSearch", "Incumbent", "final_margin_s",
    "solve_auto",
]

# With this many threads the HiGHS MILP races from the start on one of them. With fewer it
# only took CPU from the CP-SAT prover, which proved every corpus row HiGHS had proved, sooner.
HIGHS_RACE_MIN_THREADS = 3
# Training graphs above EXACT_MAX_NODES up to here: the first phase and the improvement by
# counts (larger ones, and the forward-only random DAGs, keep searching until the deadline)
COUNTED_MAX_NODES = 500
# Up to here the cut bound's proof of infeasibility runs before the first phase (a few dozen
# searches over the graph: 0.05 s at 367 nodes, 0.34 s at 2,001); after the first phase, 75 %
# of a traced GPT-2 waited 15-36 s for its proof
CUT_FIRST_MAX_NODES = 1000
CUT_BOUND_SHARE = 0.05  # of the limit, after the first phase: the any-order cut bound's LPs


def final_margin_s(node_count: int, time_limit_s: float) -> float:
    """Seconds kept back from the time limit for building the final plan's actions and the
    engine's judgement of it (simulation): grows with the graph, never most of the limit."""
    return min(0.25 * time_limit_s, 0.3 + 6e-5 * node_count)


def solve_auto(graph: Graph, budget_bytes: int, *, time_limit_s: float = 60.0,
               threads: int = 2, seed: int = 0, progress: Progress | None = None,
               incumbent: PlanListener | None = None) -> AutoResult:
    """`progress(objective, bound)` hears of every better plan (the simulator's cost) and every
    better bound, as soon as each phase or search finds it; `incumbent(actions, source,
    bound)` gets each better plan itself (the engine's anytime answer)."""
    config = AutoConfig(time_limit_s=time_limit_s, threads=threads, seed=seed)
    started = time.perf_counter()
    n_nodes = len(graph.nodes)
    deadline = started + time_limit_s - final_margin_s(n_nodes, time_limit_s)
    problem = problem_from_graph(graph, budget_bytes)
    least = lower_bound_peak_bytes(graph)
    if least > budget_bytes:  # at some node's first computation what must be resident exceeds it
        return AutoResult(None, None, "none", problem.total_cost, False, True,
                          [f"no schedule fits: computing one node needs {least} bytes (the "
                           f"fixed bytes, its inputs, output and workspace, and the bytes its "
                           f"ancestors hold to the end of the step)"])
    if (n_nodes <= CUT_FIRST_MAX_NODES
            and (no_plan := _cut_proof(graph, budget_bytes, deadline)) is not None):
        return no_plan
    search = AutoSearch(graph, budget_bytes, problem, config, started=started,
                        deadline=deadline, progress=progress, incumbent=incumbent)
    if (no_plan := decide_from_sink(search)) is not None:
        return no_plan  # a tight budget on a single-sink DAG, decided exactly (sink_search)
    stop = SearchStop()
    race = _start_highs_race(search, stop)
    workers = threads - 1 if race is not None else threads
    # Mid-sized graphs: the first phase by counts, the limit only a safety net, so that a
    # loaded machine gets the same plans later (GPT-2, 4 layers, at 0.9: +10.1 % quiet, +11.7 %
    # with three CPU hogs when each step had a share of the time)
    counted = EXACT_MAX_NODES < n_nodes <= COUNTED_MAX_NODES and is_training(graph)
    first_deadline = (deadline if counted else
                      started + (0.25 if search.small else 0.6) * (deadline - started))
    fitted = run_portfolio(graph, budget_bytes, search.offer, first_deadline, threads=workers,
                           seed=seed, order_of=search.order_of, notes=search.notes,
                           timings=search.timings,
                           counted_limit_s=time_limit_s if counted else None)
    search.timings["first_phase_s"] = time.perf_counter() - started
    if (no_plan := _add_cut_bound(search)) is not None:
        return no_plan
    plan_when_none_fits(search)  # single-sink DAGs: best-first backward search (sink_search)
    _chain_dp_candidates(search, workers)
    if not search.small:
        if not search.optimal():
            _improve(search, fitted, counted)
        search.timings["improve_s"] = (time.perf_counter() - started
                                       - search.timings["first_phase_s"])
    elif not search.optimal():
        ExactSearch(search, workers=workers, stop=stop, first_deadline=first_deadline).run()
    if race is not None:
        _join_highs_race(search, race, stop)
    return search.result()


def _improve(search: AutoSearch, fitted: list[tuple[str, CheckpointPlan]],
             counted: bool) -> None:
    """Graphs over EXACT_MAX_NODES: kicked orders by count where the first phase was counted
    and a greedy plan fits (then the answer is the same on a loaded machine, and comes before
    the limit on a quiet one), otherwise `improve_large` until the deadline."""
    graph, budget_bytes, config = search.graph, search.budget_bytes, search.config
    if counted and fitted:
        counted_kicks(graph, budget_bytes, fitted, search.offer, search.order_of,
                      kicks_for(len(graph.nodes), config.time_limit_s), search.deadline,
                      config.seed)
        return
    improve_large(graph, budget_bytes, fitted, search.offer, search.order_of, search.deadline,
                  config.seed)


def _start_highs_race(search: AutoSearch, stop: SearchStop) -> HighsRace | None:
    """The frontier MILP often proves optimality on mid-sized graphs, given most of the
    limit: HiGHS (its own thread, no hint) starts now and races everything after it."""
    if (search.problem.n <= MILP_MAX_NODES and search.config.threads >= HIGHS_RACE_MIN_THREADS
            and search.left() > 4.0):
        return HighsRace(search.problem, search.left(), search.config.seed, stop,
                         search.within_order)
    return None


def _cut_proof(graph: Graph, budget_bytes: int, deadline: float) -> AutoResult | None:
    """The cut bound's proof of infeasibility before any search (its cuts' resident bytes, no
    LP: O(n + e) a cut): values read across a cut that may not be recomputed are resident with
    what the lower bound counts; a no-plan answer where that exceeds the budget."""
    cut = cut_lower_bound(graph, budget_bytes, deadline=deadline, max_cuts=0, integer_s=0)
    if not cut.infeasible:
        return None
    return AutoResult(None, None, "none", graph.total_compute_ms, False, True,
                      [f"no schedule fits: {cut.reason}"], {"cut_bound_s": cut.wall_seconds})


def _add_cut_bound(search: AutoSearch) -> AutoResult | None:
    """The cut bound after the first plan (it never delays it; none needed when the plan runs
    every node once): on training graphs the loss is the cut, where every activation saved
    for the backward pass is resident or recomputed. An AutoResult when it proves that no
    plan fits and none was found."""
    if search.optimal():
        return None
    cut = cut_lower_bound(search.graph, search.budget_bytes, deadline=min(
        search.deadline,
        time.perf_counter() + max(0.2, CUT_BOUND_SHARE * search.config.time_limit_s)))
    search.timings["cut_bound_s"] = cut.wall_seconds
    if cut.infeasible and search.best is None:
        return AutoResult(None, None, "none", search.problem.total_cost, False, True,
                          [f"no schedule fits: {cut.reason}"], search.timings)
    if cut.infeasible:  # a plan fits: the proof is wrong, so claim nothing from it
        search.notes.append(f"cut bound ignored: it claims no plan fits, beside one that does "
                            f"({cut.reason})")
    elif cut.extra_ms > 0:
        search.any_order_bound = search.problem.total_cost + cut.extra_ms
        search.tell()
    return None


def _chain_dp_candidates(search: AutoSearch, workers: int) -> None:
    """The chain DP where the first phase left it no room, then its finer form."""
    graph, budget_bytes, timings = search.graph, search.budget_bytes, search.timings
    if (not search.optimal() and "chain_dp_s" not in timings
            and search.problem.n <= LOWERED_FIRST_NODES and is_training(graph)):
        # the chain DP where the first phase left it no room (a short limit; under a second
        # up to this size), within half of what is left
        chain_candidate(graph, budget_bytes, search.offer, workers,
                        time.perf_counter() + search.left() / 2, search.notes, timings)
    if not search.optimal() and "chain_dp_s" in timings:
        # the chain DP's finer form, within half of what is left (seconds on thousands of
        # nodes: llama32 at 0.6 +16.9 % where the first DP gave +17.2 %; a tenth of a second
        # on a 4-layer GPT, where at 0.6 only it finds a good plan: +112 %, greedy's +170 %)
        finer_chain_candidate(graph, budget_bytes, search.offer, workers,
                              time.perf_counter() + search.left() / 2, search.notes,
                              timings["chain_dp_s"])


def _join_highs_race(search: AutoSearch, race: HighsRace, stop: SearchStop) -> None:
    """Stop a search still running past its share (its answer is not waited for), then wait
    for HiGHS while time is left and nothing is proven yet; take its bound and its plan."""
    stop.stop()
    proven_now = search.proven()
    raced = race.result(timeout_s=0.0 if proven_now or search.optimal()
                        else max(0.0, search.left()))
    if raced is not None:
        if raced.bound is not None:
            search.bound = max(search.bound, raced.bound)
        search.offer(raced.actions, "milp:highs")
    search.timings["milp_highs_s"] = race.wall_seconds
