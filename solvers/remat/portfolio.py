"""auto's first phase at any size: in-budget plans within seconds from a time-boxed portfolio.

Every step checks the deadline and gets a share of the time that depends on the graph's size,
so none of them starves the others:
1. store-all in the graph's order, in memory-aware greedy orders (`orders.ORDER_KEYS`) and in
   randomised ones (≤ 1.5 s): a reordering alone often fits at no extra compute,
   which is optimal (every node once);
2. on graphs over LOWERED_FIRST_NODES, the graph's own order lowered first (a store-all fit
   there is optimal; random_layered_dag(5000) at 0.9 in about a second), greedy eviction in it;
   greedy checkpoint eviction (`greedy.greedy_plan`) in the orders with the lowest store-all
   peak, each with an equal share of what is left of the phase; then, above
   LOWERED_MIN_NODES, peak-directed reordering (`late_orders.lowered_order`: local search on
   the order across the store-all peak) and greedy eviction in the lowered orders; while
   nothing fits, iterated local search in chunks of a few kicks, retention checkpointing
   (`retention.tight_budget_plan`) tried on each new lowest order near the budget;
3. the baselines (linear ones at any size, recompute-all only while affordable);
4. dynamic eviction (DTR-style) in the best order, when nothing fits yet;
5. the module-level chain DP (rotor on a linearisation, translated to op-level actions) on
   training graphs: on stacks of identical blocks op-level auto is then never worse than it.
Candidates go to `offer`, which judges them with the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.core.graph import Graph, Phase
from planner.core.plan import Action, PlanStatus
from planner.solvers.order import schedule_order
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.dtr import SCORES, dtr_depth_first_plan, dtr_plan
from planner.solvers.remat.greedy import improve, reduce_peak, sweep
from planner.solvers.remat.late_orders import KICK_MOVES, lowered_order
from planner.solvers.remat.orders import ORDER_KEYS, greedy_order, random_orders, with_order
from planner.solvers.remat.problem import RematProblem, problem_from_graph
from planner.solvers.remat.retention import tight_budget_plan

Offer = Callable[[list[Action] | None, str], bool]  # (plan, source) -> became the best
OrderMap = dict[str, list[int]]
LOWERED_MIN_NODES = 300  # above: peak-directed reordering (smaller graphs get exact searches)
RETENTION_ALSO_MAX_NODES = 1000  # up to here retention runs even when greedy already fits
LOWERED_FIRST_NODES = 2000  # above: the graph's own order is lowered before anything else
FIRST_ATTEMPT_S = 1.5  # above LOWERED_FIRST_NODES: greedy in the lowest-peak order, before it
RETENTION_NEAR = 1.05  # while nothing fits: retention in lowered orders peaking < this × budget
RETENTION_TRY_S = 2.0  # ... each for at most this long (it fits or gets stuck in about a second)
RANDOM_ORDERS_S = 1.5  # randomised memory-aware orders (below LOWERED_FIRST_NODES)
RANDOM_ORDERS_LARGE_S = 0.5  # from LOWERED_FIRST_NODES
ILS_CHUNK_KICKS = 3  # iterated local search while nothing fits: retention between chunks
ILS_KICK_PER_NODES = 40  # from LOWERED_FIRST_NODES while nothing fits: n / this moves per kick
DESCENTS_WHILE_NONE = 2  # from LOWERED_FIRST_NODES while nothing fits: orders descended
COARSE_SEGMENTS = 100  # large training graphs: a chain DP this long first (~8x faster than 200)
# after the first phase, when time allows, a finer DP than the default (twice the saving levels,
# three times the slots; about FINE_CHAIN_COST times as long): llama32 at 0.6 +18.1 % vs +20.5 %
FINE_CHAIN: dict[str, object] = {"saving_levels": 20, "slots": 1500}
FINE_CHAIN_COST = 3.0  # measured 1.7-2.4


def run_portfolio(graph: Graph, budget_bytes: int, offer: Offer, deadline: float,
                  *, threads: int = 1, seed: int = 0, order_of: OrderMap | None = None,
                  notes: list[str] | None = None, timings: dict[str, float] | None = None
                  ) -> list[tuple[str, CheckpointPlan]]:
    """Offer plans until `deadline`; returns the greedy checkpoint plans that fit (best first),
    for the improvement phase. `order_of` records each source's order of first computations;
    `timings["chain_dp_s"]`: how long the chain DP took (where it finished)."""
    started = time.perf_counter()
    orders: dict[str, list[int]] = {"given": schedule_order(graph)}
    order_of = order_of if order_of is not None else {}
    notes = notes if notes is not None else []
    timings = timings if timings is not None else {}

    def share(fraction: float) -> float:
        return time.perf_counter() + fraction * max(0.0, deadline - time.perf_counter())

    def share_until(until: float, fraction: float) -> float:
        return time.perf_counter() + fraction * max(0.0, until - time.perf_counter())

    for name, key in ORDER_KEYS.items():  # O(n · ready) each: well under a second at 20k
        if time.perf_counter() > share(0.5):
            break
        order = greedy_order(graph, key)
        if all(order != o for o in orders.values()):
            orders[name] = order
    problems: dict[str, RematProblem] = {}
    store_all: dict[str, CheckpointPlan] = {}
    for name, order in orders.items():
        if time.perf_counter() > deadline:
            break
        problems[name] = problem_from_graph(with_order(graph, order), budget_bytes)
        plan = CheckpointPlan(problems[name])
        store_all[name] = plan
        if plan.peak_bytes <= budget_bytes:
            order_of[f"store-all@{name}"] = order
            offer(plan.actions(), f"store-all@{name}")
            return [(name, plan)]  # every node once: nothing is cheaper
    fitted: list[tuple[str, CheckpointPlan]] = []
    n = len(graph.nodes)
    descended: list[tuple[int, str]] = []  # (store-all peak after descent, start order)
    attempted: set[str] = set()

    def attempt(name: str, fraction: float, cap_s: float | None = None) -> None:
        if name in attempted:
            return
        attempted.add(name)
        plan = store_all[name]
        part = share(fraction)
        if cap_s is not None:
            part = min(part, time.perf_counter() + cap_s)
        sweep(plan, part)
        if reduce_peak(plan, part):
            order_of[f"greedy@{name}"] = orders[name]
            offer(plan.actions(), f"greedy@{name}")  # the first plan before its improvement
            improve(plan, share(0.25))
            fitted.append((name, plan))
            offer(plan.actions(), f"greedy@{name}")

    retained: list[str] = []  # orders where retention checkpointing found a plan
    retention_below = budget_bytes * RETENTION_NEAR  # tried again below this peak only
    lowered_peaks: dict[str, int] = {}  # lowered order -> its store-all peak

    def lower(name: str, until: float, iterate: bool, chunk: int = 0
              ) -> list[tuple[str, CheckpointPlan]]:
        nonlocal retention_below
        low = f"lowered@{name}" + ("+ils" if iterate else "")
        start = orders.get(low, orders.get(f"lowered@{name}", orders[name]))
        kick = max(KICK_MOVES, n // ILS_KICK_PER_NODES) if n >= LOWERED_FIRST_NODES else KICK_MOVES
        order, _ = lowered_order(graph, start, budget_bytes, until, seed=seed + chunk,
                                 iterate=iterate, kick=kick if not fitted else KICK_MOVES,
                                 max_kicks=None if fitted else ILS_CHUNK_KICKS,
                                 stop_below=None if fitted or retained else int(retention_below))
        problem = problem_from_graph(with_order(graph, order), budget_bytes)
        plan = CheckpointPlan(problem)
        peak = plan.peak_bytes
        lower_peak = peak < lowered_peaks.get(low, peak + 1)
        lowered_peaks[low] = peak  # store-all's (greedy eviction below changes `plan`'s)
        orders[low], problems[low], store_all[low] = order, problem, plan  # never a worse score
        if not lower_peak:
            return []  # a chunk of iterated local search: a plateau move at most
        attempted.discard(low)
        if peak <= budget_bytes:  # every node once: nothing is cheaper
            order_of[f"store-all@{low}"] = order
            offer(store_all[low].actions(), f"store-all@{low}")
            return [(low, store_all[low])]
        if not iterate:
            descended.append((peak, name))
        attempt(low, 0.2)
        if not fitted and not retained and peak < retention_below:
            # Retention checkpointing fits (or gets stuck) in about a second once the order's
            # store-all peak is within a few per cent of the budget (random2000 at 0.8: plans
            # from 3 of 6 orders at 1.04-1.05 × budget, none of 9 above): tried on each new lowest
            # such order, one deterministic attempt each (restarts with random candidate
            # orders get stuck where the first does; another order is what helps).
            retention_below = peak
            retain(low, min(share(0.35), time.perf_counter() + RETENTION_TRY_S), attempts=1)
        return []

    def retain(name: str, until: float, attempts: int = 6) -> None:
        actions = tight_budget_plan(problems[name], until, seed=seed + len(retained),
                                    attempts=attempts)
        if actions is not None and offer(actions, f"retention@{name}"):
            order_of[f"retention@{name}"] = orders[name]
            retained.append(name)

    first = min(store_all, key=lambda k: store_all[k].peak_bytes, default=None)
    chain_found: bool | None = None  # None: the chain DP not tried yet, or not finished
    if n > LOWERED_FIRST_NODES and is_training(graph):
        # Large training graphs: the chain DP first; its first DP may take the phase, its
        # refinements half of it. Its model has at most 200 stages, so it takes seconds at any
        # size (about 2 s at 200), while greedy eviction may not fit in the whole phase (a
        # 20,001-node training chain at 0.9: one sweep takes 6.5 s; with a 10 s limit auto
        # had only chen-sqrt's +33 %, the chain DP alone +6 % at 0.9 and +15 % at 0.6).
        chain_found = chain_candidate(graph, budget_bytes, offer, threads, deadline, notes,
                                       timings, refine_until=share(0.5))
    if n > LOWERED_FIRST_NODES and "given" in store_all:
        # Large graphs: a short greedy attempt in the lowest-peak order (traced models often
        # fit there in a second), then the graph's own order lowered (a local search judged
        # move by move on the steps it changes, about a second at 5,000 nodes): its store-all
        # often fits, and greedy eviction from it is the quickest plan otherwise.
        if first is not None:
            attempt(first, 1.0 / (len(store_all) + 3), cap_s=FIRST_ATTEMPT_S)
        if found_optimal := lower("given", share(0.3), iterate=False):
            return found_optimal
    if first is not None:  # the first plan: greedy in the order with the lowest peak
        attempt(first, 1.0 / (len(store_all) + 3))
    if (chain_found is None and n <= LOWERED_FIRST_NODES and is_training(graph)
            and time.perf_counter() < deadline - 0.5):
        # The chain DP (a second or two) early on training graphs: at tight budgets on stacks
        # of blocks it is the quickest good plan (gpt12 at 0.6: +39 % where the first greedy
        # plan is +99 %; llama32 at 0.6: +27 %, where greedy does not fit).
        chain_found = chain_candidate(graph, budget_bytes, offer, threads, share(0.25), notes,
                                       timings)
    if n > LOWERED_MIN_NODES and is_training(graph) and time.perf_counter() < deadline:
        # Chen's √n checkpoints, which `offer` polishes (values kept instead of recomputed where
        # memory allows): milliseconds, and at tight budgets sometimes the best start (gpt12 at
        # 0.6: +57.5 % raw, +31.0 % polished; the chain DP's +32.6 %).
        from planner.solvers.baselines import ScheduleAbandoned, chen_sqrt

        try:
            if offer(chen_sqrt(graph, deadline=share(0.1)), "baseline:chen-sqrt"):
                order_of["baseline:chen-sqrt"] = orders["given"]
        except ScheduleAbandoned:
            pass  # past its share: the searches below matter more
    # Randomised memory-aware orders, a fifth of what is left and at most RANDOM_ORDERS_S (less
    # from LOWERED_FIRST_NODES, where lowering is what fits): each is checked in O(n) and a
    # store-all fit is optimal; the lowest-peak one joins the greedy attempts below.
    lowest: tuple[int, str, list[int], RematProblem, CheckpointPlan] | None = None
    random_s = RANDOM_ORDERS_S if n < LOWERED_FIRST_NODES else RANDOM_ORDERS_LARGE_S
    random_until = min(share(0.2), time.perf_counter() + random_s)
    for name, order in random_orders(graph, seed):
        if time.perf_counter() > random_until or not store_all:
            break
        problem = problem_from_graph(with_order(graph, order), budget_bytes)
        plan = CheckpointPlan(problem)
        if plan.peak_bytes <= budget_bytes:
            order_of[f"store-all@{name}"] = order
            offer(plan.actions(), f"store-all@{name}")
            return [(name, plan)]
        if lowest is None or plan.peak_bytes < lowest[0]:
            lowest = (plan.peak_bytes, name, order, problem, plan)
    if lowest is not None:
        _, name, order, problems[name], store_all[name] = lowest
        orders[name] = order
    ranked = sorted(store_all, key=lambda k: store_all[k].peak_bytes)
    rest = [k for k in ranked if k != first]
    for i, name in enumerate(rest):
        if time.perf_counter() > deadline:
            break
        attempt(name, 1.0 / (len(rest) - i + 2))  # leave room for the fallbacks below
    if n > LOWERED_MIN_NODES and store_all and time.perf_counter() < deadline:
        # Peak-directed reordering (`late_orders`) on the orders with the lowest store-all
        # peaks, greedy eviction in each lowered order; a third of what is left (half when
        # nothing fits yet): local search alone first, until a plan fits (seconds), then
        # iterated local search from the lowest lowered orders.
        lowered_until = share(0.5 if not fitted else 0.35)
        descent_until = share_until(lowered_until, 0.4)
        before = len(fitted)
        for name in list(ranked):
            if time.perf_counter() > descent_until or len(fitted) > before or retained:
                break
            if not fitted and n >= LOWERED_FIRST_NODES and len(descended) >= DESCENTS_WHILE_NONE:
                break  # seconds each at this size: iterated local search from the best instead
            if name.startswith("lowered@") or any(d == name for _, d in descended):
                continue
            if found_optimal := lower(name, descent_until, iterate=False):
                return found_optimal
        for _, name in sorted(descended):
            if time.perf_counter() > lowered_until or retained:
                break
            ils_until, chunk = share_until(lowered_until, 0.5), 0
            while time.perf_counter() < ils_until and not retained:
                # while nothing fits: in chunks, retention tried on each new lowest order
                if found_optimal := lower(name, ils_until, iterate=True, chunk=chunk):
                    return found_optimal
                chunk += 1
        ranked = sorted(store_all, key=lambda k: store_all[k].peak_bytes)
    if (ranked and time.perf_counter() < deadline
            and ((not fitted and not retained)
                 or LOWERED_MIN_NODES < n <= RETENTION_ALSO_MAX_NODES)):
        # Retention checkpointing (`retention.tight_budget_plan`: a value kept until the last
        # stage that needs it) in the lowest-peak orders, lowered ones included: it fits where
        # greedy eviction and DTR get stuck (random2000 at 0.8) and on small graphs it is often
        # cheaper than greedy (random500 at 0.8: +0.6 % vs +3.0 %).
        for name in ranked[:2]:
            if time.perf_counter() > deadline or (retained and not fitted):
                break
            if name not in retained:
                retain(name, share(0.35))
    fitted.sort(key=lambda item: item[1].total_cost)
    found = bool(fitted) or bool(retained)
    # The baselines (store-all, recompute-all, Chen's): above LOWERED_MIN_NODES only while
    # nothing fits (a greedy plan is never beaten by them there; recompute-all alone takes
    # seconds at 1,000 nodes, better spent on the improvement phase).
    if time.perf_counter() < deadline and n <= 3000 and (not fitted or n <= LOWERED_MIN_NODES):
        from planner.solvers.baselines import bounded_baselines

        for name, actions in bounded_baselines(graph, budget_bytes, deadline=share(0.5)):
            if offer(actions, f"baseline:{name}"):
                found = True
                order_of[f"baseline:{name}"] = orders["given"]
    # The chain DP again with the rest of the phase when the early call ran out of its share;
    # before DTR, which it often beats by far (llama32 at 0.6: +27 % vs +45 %).
    if chain_found is None and is_training(graph) and time.perf_counter() < deadline - 0.5:
        chain_found = chain_candidate(graph, budget_bytes, offer, threads, deadline, notes,
                                       timings)
    found = found or bool(chain_found)
    if not found and ranked and time.perf_counter() < deadline:
        found = _dtr(problems, ranked, orders, offer, order_of, deadline, share)
    if not found and time.perf_counter() > deadline:
        notes.append(f"no plan within the first phase ({time.perf_counter() - started:.1f} s)")
    return fitted


def _dtr(problems: dict[str, RematProblem], ranked: list[str], orders: dict[str, list[int]],
         offer: Offer, order_of: OrderMap, deadline: float,
         share: Callable[[float], float]) -> bool:
    found = False
    for name in ranked[:2]:
        for fn in (dtr_depth_first_plan, dtr_plan):
            for score in SCORES.values():
                if time.perf_counter() > deadline:
                    return found
                actions = fn(problems[name], score, share(0.3))
                if actions is not None and offer(actions, f"dtr@{name}"):
                    order_of[f"dtr@{name}"] = orders[name]
                    found = True
    return found


def is_training(graph: Graph) -> bool:
    return any(node.phase is Phase.backward for node in graph.nodes)


def chain_candidate(graph: Graph, budget_bytes: int, offer: Offer, threads: int,
                     deadline: float, notes: list[str], timings: dict[str, float],
                     refine_until: float | None = None) -> bool | None:
    """The module-level chain DP (rotor on a linearisation, each F_all choosing how much of
    its segment to keep: `planner.solvers.chain.saving`) as an op-level candidate; whether it became
    the best plan (None: not finished by `deadline`). With `refine_until` (large graphs), a
    chain of COARSE_SEGMENTS first where the linearisation is longer: the DP is cubic in the
    segments, and the 200-segment one alone took 3.1 s of a 4.8 s phase at 5,001 nodes, past
    it on a slower run."""
    from planner.solvers.chain.methods import chain_problem

    found: bool | None = None
    if refine_until is not None:
        try:
            length = chain_problem(graph).chain.length
        except Exception as e:  # noqa: BLE001 (a graph the chain model cannot take: skip it)
            notes.append(f"chain DP skipped: {type(e).__name__}: {e}")
            return False
        if length > COARSE_SEGMENTS:
            found = _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, None,
                              {"segments": COARSE_SEGMENTS, "refine": 0})
    began = time.perf_counter()
    plain = _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, refine_until, {})
    if plain is None:
        return found
    timings["chain_dp_s"] = time.perf_counter() - began
    return bool(found or plain)


def finer_chain_candidate(graph: Graph, budget_bytes: int, offer: Offer, threads: int,
                          deadline: float, notes: list[str], chain_dp_s: float) -> bool | None:
    """The chain DP again with FINE_CHAIN (more saving levels and slots) when it fits before
    `deadline` by the first DP's time `chain_dp_s`; whether it became the best plan."""
    if time.perf_counter() + FINE_CHAIN_COST * chain_dp_s > deadline:
        return None
    return _chain_dp(graph, budget_bytes, offer, threads, deadline, notes, None, FINE_CHAIN)


def _chain_dp(graph: Graph, budget_bytes: int, offer: Offer, threads: int, deadline: float,
              notes: list[str], refine_until: float | None, options: dict[str, object]
              ) -> bool | None:
    from planner.solvers.chain.methods import rotor
    from planner.solvers.request import SolveRequest

    try:
        now = time.perf_counter()
        result = rotor(SolveRequest(graph, budget_bytes, time_limit_s=max(0.1, deadline - now),
                                    threads=threads, options={"saving": True, **options}),
                       refine_within_s=None if refine_until is None else refine_until - now)
    except Exception as e:  # noqa: BLE001 (a graph the chain model cannot take: skip it)
        notes.append(f"chain DP skipped: {type(e).__name__}: {e}")
        return False
    if result.actions is None and result.status is PlanStatus.timeout:
        return None
    return offer(result.actions, "chain-dp")
