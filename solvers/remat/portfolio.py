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
   the order across the store-all peak) and greedy eviction in the lowered orders;
3. the baselines (linear ones at any size, recompute-all only while affordable);
4. dynamic eviction (DTR-style) in the best order, when nothing fits yet;
5. the module-level chain DP (rotor on a linearisation, translated to op-level actions) on
   training graphs: on stacks of identical blocks op-level auto is then never worse than it.
Candidates go to `offer`, which judges them with the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from planner.graph import Graph, Phase
from planner.plan import Action
from solvers.order import schedule_order
from solvers.remat.checkpoints import CheckpointPlan
from solvers.remat.dtr import SCORES, dtr_depth_first_plan, dtr_plan
from solvers.remat.greedy import improve, reduce_peak, sweep
from solvers.remat.late_orders import lowered_order
from solvers.remat.orders import ORDER_KEYS, greedy_order, random_orders, with_order
from solvers.remat.problem import RematProblem, problem_from_graph
from solvers.remat.retention import tight_budget_plan

Offer = Callable[[list[Action] | None, str], bool]  # (plan, source) -> became the best
OrderMap = dict[str, list[int]]
LOWERED_MIN_NODES = 300  # above: peak-directed reordering (smaller graphs get exact searches)
RETENTION_ALSO_MAX_NODES = 1000  # up to here retention runs even when greedy already fits
LOWERED_FIRST_NODES = 2000  # above: the graph's own order is lowered before anything else
FIRST_ATTEMPT_S = 1.5  # above LOWERED_FIRST_NODES: greedy in the lowest-peak order, before it


def run_portfolio(graph: Graph, budget_bytes: int, offer: Offer, deadline: float,
                  *, threads: int = 1, seed: int = 0, order_of: OrderMap | None = None,
                  notes: list[str] | None = None) -> list[tuple[str, CheckpointPlan]]:
    """Offer plans until `deadline`; returns the greedy checkpoint plans that fit (best first),
    for the improvement phase. `order_of` records each source's order of first computations."""
    started = time.perf_counter()
    orders: dict[str, list[int]] = {"given": schedule_order(graph)}
    order_of = order_of if order_of is not None else {}
    notes = notes if notes is not None else []

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
            improve(plan, share(0.25))
            fitted.append((name, plan))
            order_of[f"greedy@{name}"] = orders[name]
            offer(plan.actions(), f"greedy@{name}")

    def lower(name: str, until: float, iterate: bool) -> list[tuple[str, CheckpointPlan]]:
        start = orders.get(f"lowered@{name}", orders[name])
        order, _ = lowered_order(graph, start, budget_bytes, until, seed=seed,
                                 iterate=iterate)
        low = f"lowered@{name}" + ("+ils" if iterate else "")
        orders[low] = order
        problems[low] = problem_from_graph(with_order(graph, order), budget_bytes)
        store_all[low] = CheckpointPlan(problems[low])
        peak = store_all[low].peak_bytes
        if peak <= budget_bytes:  # every node once: nothing is cheaper
            order_of[f"store-all@{low}"] = order
            offer(store_all[low].actions(), f"store-all@{low}")
            return [(low, store_all[low])]
        if not iterate:
            descended.append((peak, name))
        attempt(low, 0.2)
        return []

    first = min(store_all, key=lambda k: store_all[k].peak_bytes, default=None)
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
    chain_found: bool | None = None  # None: the chain DP not tried yet
    if not fitted and _is_training(graph) and time.perf_counter() < deadline - 0.5:
        # Greedy eviction did not fit at once (tight budgets on stacks of blocks): the chain
        # DP (a second or two) is then the quickest good plan (llama32 at 0.6: +27 %).
        chain_found = _chain_candidate(graph, budget_bytes, offer, threads, deadline, notes)
    # Randomised memory-aware orders, a fifth of what is left and at most 1.5 s: each is
    # checked in O(n) and a store-all fit is optimal; the lowest-peak one joins the greedy
    # attempts below.
    lowest: tuple[int, str, list[int], RematProblem, CheckpointPlan] | None = None
    random_until = min(share(0.2), time.perf_counter() + 1.5)
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
    if len(graph.nodes) > LOWERED_MIN_NODES and store_all and time.perf_counter() < deadline:
        # Peak-directed reordering (`late_orders`) on the orders with the lowest store-all
        # peaks, greedy eviction in each lowered order; a third of what is left (half when
        # nothing fits yet): local search alone first, until a plan fits (seconds), then
        # iterated local search from the lowest lowered orders.
        lowered_until = share(0.5 if not fitted else 0.35)
        descent_until = share_until(lowered_until, 0.4)
        before = len(fitted)
        for name in list(ranked):
            if time.perf_counter() > descent_until or len(fitted) > before:
                break
            if name.startswith("lowered@") or any(d == name for _, d in descended):
                continue
            if found_optimal := lower(name, descent_until, iterate=False):
                return found_optimal
        for _, name in sorted(descended):
            if time.perf_counter() > lowered_until:
                break
            if found_optimal := lower(name, share_until(lowered_until, 0.5), iterate=True):
                return found_optimal
        ranked = sorted(store_all, key=lambda k: store_all[k].peak_bytes)
    retained = False
    if (ranked and time.perf_counter() < deadline
            and (not fitted or LOWERED_MIN_NODES < len(graph.nodes) <= RETENTION_ALSO_MAX_NODES)):
        # Retention checkpointing (`retention.tight_budget_plan`: a value kept until the last
        # stage that needs it) in the lowest-peak orders, lowered ones included: it fits where
        # greedy eviction and DTR get stuck (random2000 at 0.8) and on small graphs it is often
        # cheaper than greedy (random500 at 0.8: +0.6 % vs +3.0 %).
        for i, name in enumerate(ranked[:2]):
            if time.perf_counter() > deadline:
                break
            actions = tight_budget_plan(problems[name], share(0.35), seed=seed + i)
            if actions is not None and offer(actions, f"retention@{name}"):
                order_of[f"retention@{name}"] = orders[name]
                retained = True
                if not fitted:
                    break
    fitted.sort(key=lambda item: item[1].total_cost)
    found = bool(fitted) or retained
    n = len(graph.nodes)
    # The baselines (store-all, recompute-all, Chen's): above LOWERED_MIN_NODES only while
    # nothing fits (a greedy plan is never beaten by them there; recompute-all alone takes
    # seconds at 1,000 nodes, better spent on the improvement phase).
    if time.perf_counter() < deadline and n <= 3000 and (not fitted or n <= LOWERED_MIN_NODES):
        from solvers.baselines import bounded_baselines

        for name, actions in bounded_baselines(graph, budget_bytes, deadline=share(0.5)):
            if offer(actions, f"baseline:{name}"):
                found = True
                order_of[f"baseline:{name}"] = orders["given"]
    # The chain DP is cheap (a DP over segments) and on stacks of blocks often beats dynamic
    # eviction by far (llama32 at 0.6: +27 % vs +45 %): it runs first, DTR only if nothing fits.
    if chain_found is None and _is_training(graph) and time.perf_counter() < deadline - 0.5:
        chain_found = _chain_candidate(graph, budget_bytes, offer, threads, deadline, notes)
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


def _is_training(graph: Graph) -> bool:
    return any(node.phase is Phase.backward for node in graph.nodes)


def _chain_candidate(graph: Graph, budget_bytes: int, offer: Offer, threads: int,
                     deadline: float, notes: list[str]) -> bool:
    """The module-level chain DP (rotor on a linearisation) as an op-level candidate; whether
    it became the best plan."""
    from solvers.chain.methods import rotor
    from solvers.request import SolveRequest

    try:
        result = rotor(SolveRequest(graph, budget_bytes,
                                    time_limit_s=max(0.1, deadline - time.perf_counter()),
                                    threads=threads))
    except Exception as e:  # noqa: BLE001 (a graph the chain model cannot take: skip it)
        notes.append(f"chain DP skipped: {type(e).__name__}: {e}")
        return False
    return offer(result.actions, "chain-dp")
