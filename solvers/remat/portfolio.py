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
3. the baselines (linear ones at any size, recompute-all only while affordable); the
   hand-written policies (checkpoint every k-th block, selective matmul saving) early, at
   any size: at their own peaks auto is never slower than them;
4. dynamic eviction (DTR-style) in the best order, when nothing fits yet;
5. the module-level chain DP (rotor on a linearisation, translated to op-level actions) on
   training graphs: on stacks of identical blocks op-level auto is then never worse than it.
Candidates go to `offer`, which judges them with the simulator.
Graphs whose nodes hold bytes to the end of the step (weight gradients) also get the graph's
order with those nodes computed late (`held_orders`), and greedy eviction skips orders whose held
bytes alone exceed the budget somewhere (`held_orders.order_floor_bytes`). A counted phase
(`counted_limit_s`, auto's mid-sized training graphs) runs each step to its end or to a count
the limit buys, the deadline only a safety net: the same plans on a loaded machine, later.
"""

from __future__ import annotations

import time

from planner.core.graph import Graph
from planner.solvers.order import schedule_order
from planner.solvers.remat.chain_candidates import (
    Offer,
    chain_candidate,
    finer_chain_candidate,
    is_training,
)
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.fallbacks import (
    baseline_candidates,
    chen_sqrt_candidate,
    dtr_candidates,
    handwritten_candidates,
)
from planner.solvers.remat.greedy import improve, reduce_peak, sweep
from planner.solvers.remat.held_orders import held_last_order, order_floor_bytes
from planner.solvers.remat.late_orders import KICK_MOVES, lowered_order
from planner.solvers.remat.orders import ORDER_KEYS, greedy_order, random_orders, with_order
from planner.solvers.remat.problem import RematProblem, problem_from_graph
from planner.solvers.remat.retention import tight_budget_plan

__all__ = ["LOWERED_FIRST_NODES", "Offer", "OrderMap", "Portfolio", "chain_candidate",
           "finer_chain_candidate", "is_training", "run_portfolio"]

OrderMap = dict[str, list[int]]
Fitted = list[tuple[str, CheckpointPlan]]  # (order name, greedy checkpoint plan that fits)
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
# A counted phase: randomised orders tried and chunks of ILS_CHUNK_KICKS kicks (all orders
# together) at most, and what the limit buys: steps x nodes per second of the limit (GPT-2 with
# 367 nodes at 60 s: 48 chunks, 3.5 s quiet on a shared 2-core machine; 32 orders, 1 s)
RANDOM_ORDERS_COUNTED = 32
ILS_CHUNKS_COUNTED = 48
COUNTED_NODES_PER_S = 300.0
# Baselines above LOWERED_MIN_NODES only while nothing fits (a greedy plan is never beaten by
# them there; recompute-all alone takes seconds at 1,000 nodes), none above this:
BASELINES_MAX_NODES = 3000


def run_portfolio(graph: Graph, budget_bytes: int, offer: Offer, deadline: float,
                  *, threads: int = 1, seed: int = 0, order_of: OrderMap | None = None,
                  notes: list[str] | None = None, timings: dict[str, float] | None = None,
                  counted_limit_s: float | None = None) -> Fitted:
    """Offer plans until `deadline`; returns the greedy checkpoint plans that fit (best first),
    for the improvement phase. `order_of` records each source's order of first computations;
    `timings["chain_dp_s"]`: how long the chain DP took (where it finished). With
    `counted_limit_s` (the request's limit) every step runs to its end or to a count that the
    limit buys (random orders, chunks of kicks), not to a share of the time, and `deadline` is
    only a safety net: the same plans on a loaded machine, later."""
    return Portfolio(graph, budget_bytes, offer, deadline, threads=threads, seed=seed,
                     order_of={} if order_of is None else order_of,
                     notes=[] if notes is None else notes,
                     timings={} if timings is None else timings,
                     counted_limit_s=counted_limit_s).run()


def _bought(node_count: int, counted_limit_s: float | None, least: int, most: int) -> int:
    """Steps (chunks of iterated local search, random orders) a counted phase runs: what the
    limit buys at COUNTED_NODES_PER_S, within [least, most]."""
    if counted_limit_s is None:
        return 0
    bought = int(COUNTED_NODES_PER_S * counted_limit_s / max(1, node_count))
    return min(most, max(least, bought))


class Portfolio:
    """One run of the first phase: the orders tried, their store-all plans and what fitted.
    A store-all plan that fits ends it (every node once: nothing is cheaper)."""

    def __init__(self, graph: Graph, budget_bytes: int, offer: Offer, deadline: float, *,
                 threads: int, seed: int, order_of: OrderMap, notes: list[str],
                 timings: dict[str, float], counted_limit_s: float | None = None) -> None:
        self.started = time.perf_counter()
        # steps end by counts, `deadline` a safety net (run_portfolio)
        self.counted = counted_limit_s is not None
        self.ils_chunks = 0  # chunks of iterated local search run, over all orders
        self.ils_chunks_counted = _bought(len(graph.nodes), counted_limit_s, ILS_CHUNK_KICKS,
                                          ILS_CHUNKS_COUNTED)
        self.random_orders_counted = _bought(len(graph.nodes), counted_limit_s,
                                             ILS_CHUNK_KICKS, RANDOM_ORDERS_COUNTED)
        self.graph = graph
        self.budget_bytes = budget_bytes
        self.offer = offer
        self.deadline = deadline
        self.threads = threads
        self.seed = seed
        self.n = len(graph.nodes)
        self.orders: OrderMap = {"given": schedule_order(graph)}
        self.order_of = order_of
        self.notes = notes
        self.timings = timings
        self.problems: dict[str, RematProblem] = {}
        self.store_all: dict[str, CheckpointPlan] = {}
        self.fitted: Fitted = []
        self.descended: list[tuple[int, str]] = []  # (store-all peak after descent, start)
        self.attempted: set[str] = set()
        self.retained: list[str] = []  # orders where retention checkpointing found a plan
        self.retention_below = budget_bytes * RETENTION_NEAR  # tried again below this peak
        self.lowered_peaks: dict[str, int] = {}  # lowered order -> its store-all peak
        self.first: str | None = None  # the order with the lowest store-all peak at first
        self.chain_found: bool | None = None  # None: the chain DP not tried or not finished

    def share(self, fraction: float) -> float:
        """The deadline of a step that gets `fraction` of what is left of the phase (counted:
        the phase's, the step ends by its own counts)."""
        if self.counted:
            return self.deadline
        return time.perf_counter() + fraction * max(0.0, self.deadline - time.perf_counter())

    def share_until(self, until: float, fraction: float) -> float:
        if self.counted:
            return until
        return time.perf_counter() + fraction * max(0.0, until - time.perf_counter())

    def run(self) -> Fitted:
        """The steps in turn (see the module's docstring); a store-all fit returns at once."""
        self.add_greedy_orders()
        if (optimal := self.store_all_in_orders()) is not None:
            return optimal
        # the first greedy attempt in the lowest-peak order among those a plan may fit in
        self.first = min(self.store_all, key=lambda k: (
            order_floor_bytes(self.graph, self.orders[k]) > self.budget_bytes,
            self.store_all[k].peak_bytes), default=None)
        handwritten_candidates(self)
        if (optimal := self.large_graph_start()) is not None:
            return optimal
        if self.first is not None:  # the first plan: greedy in the order with the lowest peak
            self.attempt(self.first, 1.0 / (len(self.store_all) + 3))
        self.early_chain_dp()
        if (self.n > LOWERED_MIN_NODES and is_training(self.graph)
                and time.perf_counter() < self.deadline):
            chen_sqrt_candidate(self)
        if (optimal := self.store_all_in_random_orders()) is not None:
            return optimal
        ranked = sorted(self.store_all, key=lambda k: self.store_all[k].peak_bytes)
        self.greedy_in_other_orders(ranked)
        if (self.n > LOWERED_MIN_NODES and self.store_all
                and time.perf_counter() < self.deadline):
            if (optimal := self.lowered_orders(ranked)) is not None:
                return optimal
            ranked = sorted(self.store_all, key=lambda k: self.store_all[k].peak_bytes)
        self.retention(ranked)
        self.fitted.sort(key=lambda item: item[1].total_cost)
        found = bool(self.fitted) or bool(self.retained)
        if (time.perf_counter() < self.deadline and self.n <= BASELINES_MAX_NODES
                and (not self.fitted or self.n <= LOWERED_MIN_NODES)):
            found = baseline_candidates(self) or found
        self.late_chain_dp()
        found = found or bool(self.chain_found)
        if not found and ranked and time.perf_counter() < self.deadline:
            found = dtr_candidates(self, ranked)
        if not found and time.perf_counter() > self.deadline:
            self.notes.append(f"no plan within the first phase "
                              f"({time.perf_counter() - self.started:.1f} s)")
        return self.fitted

    # -- orders and store-all ---------------------------------------------------------------
    def add_greedy_orders(self) -> None:
        """Memory-aware greedy orders, O(n · ready) each: well under a second at 20k."""
        for name, key in ORDER_KEYS.items():
            if time.perf_counter() > self.share(0.5):
                break
            order = greedy_order(self.graph, key)
            if all(order != o for o in self.orders.values()):
                self.orders[name] = order
        self.add_held_last_orders()

    def add_held_last_orders(self) -> None:
        """The graph's order with its held nodes (weight gradients) computed late
        (`held_orders.held_last_order`): where held bytes pile up at a late peak, no eviction
        can lower it in the list-scheduled orders (GPT-2, 4 layers, at 0.9: none fitted for
        20 s; greedy fits in 0.1 s in the held-last order). Not each list order's: there
        greedy eviction gave the same plans, 0.4 s each."""
        late = held_last_order(self.graph, self.orders["given"])
        if late is not None and all(late != o for o in self.orders.values()):
            self.orders["held-last@given"] = late

    def store_all_in_orders(self) -> Fitted | None:
        """Store-all in each order; the first that fits is optimal (every node once)."""
        for name, order in self.orders.items():
            if time.perf_counter() > self.deadline:
                break
            self.problems[name] = problem_from_graph(with_order(self.graph, order),
                                                     self.budget_bytes)
            plan = CheckpointPlan(self.problems[name])
            self.store_all[name] = plan
            if plan.peak_bytes <= self.budget_bytes:
                self.order_of[f"store-all@{name}"] = order
                self.offer(plan.actions(), f"store-all@{name}")
                return [(name, plan)]
        return None

    def store_all_in_random_orders(self) -> Fitted | None:
        """Randomised memory-aware orders, a fifth of what is left and at most RANDOM_ORDERS_S
        (less from LOWERED_FIRST_NODES, where lowering is what fits): each is checked in O(n)
        and a store-all fit is optimal; the lowest-peak one joins the greedy attempts."""
        lowest: tuple[int, str, list[int], RematProblem, CheckpointPlan] | None = None
        random_s = RANDOM_ORDERS_S if self.n < LOWERED_FIRST_NODES else RANDOM_ORDERS_LARGE_S
        random_until = (self.deadline if self.counted
                        else min(self.share(0.2), time.perf_counter() + random_s))
        for k, (name, order) in enumerate(random_orders(self.graph, self.seed)):
            if (time.perf_counter() > random_until or not self.store_all
                    or (self.counted and k >= self.random_orders_counted)):
                break
            problem = problem_from_graph(with_order(self.graph, order), self.budget_bytes)
            plan = CheckpointPlan(problem)
            if plan.peak_bytes <= self.budget_bytes:
                self.order_of[f"store-all@{name}"] = order
                self.offer(plan.actions(), f"store-all@{name}")
                return [(name, plan)]
            if lowest is None or plan.peak_bytes < lowest[0]:
                lowest = (plan.peak_bytes, name, order, problem, plan)
        if lowest is not None:
            _, name, order, self.problems[name], self.store_all[name] = lowest
            self.orders[name] = order
        return None

    # -- greedy checkpoint eviction ---------------------------------------------------------
    def attempt(self, name: str, fraction: float, cap_s: float | None = None) -> None:
        """Greedy eviction in order `name` (once per order), improved when it fits."""
        if name in self.attempted:
            return
        self.attempted.add(name)
        if order_floor_bytes(self.graph, self.orders[name]) > self.budget_bytes:
            return  # held bytes alone exceed the budget somewhere in this order: none fits
        plan = self.store_all[name]
        part = self.share(fraction)
        if cap_s is not None:
            part = min(part, time.perf_counter() + cap_s)
        sweep(plan, part)
        if reduce_peak(plan, part):
            self.order_of[f"greedy@{name}"] = self.orders[name]
            self.offer(plan.actions(), f"greedy@{name}")  # the first plan before its improvement
            improve(plan, self.share(0.25))
            self.fitted.append((name, plan))
            self.offer(plan.actions(), f"greedy@{name}")

    def greedy_in_other_orders(self, ranked: list[str]) -> None:
        rest = [k for k in ranked if k != self.first]
        for i, name in enumerate(rest):
            if time.perf_counter() > self.deadline:
                break
            self.attempt(name, 1.0 / (len(rest) - i + 2))  # leave room for the fallbacks below

    def large_graph_start(self) -> Fitted | None:
        """Graphs over LOWERED_FIRST_NODES: the chain DP first on training graphs, a short
        greedy attempt in the lowest-peak order, then the graph's own order lowered."""
        if self.n > LOWERED_FIRST_NODES and is_training(self.graph):
            # Large training graphs: the chain DP first; its first DP may take the phase, its
            # refinements half of it. Its model has at most 200 stages, so it takes seconds at
            # any size (about 2 s at 200), while greedy eviction may not fit in the whole phase
            # (a 20,001-node training chain at 0.9: one sweep takes 6.5 s; with a 10 s limit
            # auto had only chen-sqrt's +33 %, the chain DP alone +6 % at 0.9, +15 % at 0.6).
            self.chain_found = chain_candidate(self.graph, self.budget_bytes, self.offer,
                                               self.threads, self.deadline, self.notes,
                                               self.timings, refine_until=self.share(0.5))
        if self.n > LOWERED_FIRST_NODES and "given" in self.store_all:
            # Large graphs: a short greedy attempt in the lowest-peak order (traced models often
            # fit there in a second), then the graph's own order lowered (a local search judged
            # move by move on the steps it changes, about a second at 5,000 nodes): its
            # store-all often fits, and greedy eviction from it is the quickest plan otherwise.
            if self.first is not None:
                self.attempt(self.first, 1.0 / (len(self.store_all) + 3),
                             cap_s=FIRST_ATTEMPT_S)
            if found_optimal := self.lower("given", self.share(0.3), iterate=False):
                return found_optimal
        return None

    # -- peak-directed reordering and retention ---------------------------------------------
    def lowered_orders(self, ranked: list[str]) -> Fitted | None:
        """Peak-directed reordering (`late_orders`) on the orders with the lowest store-all
        peaks, greedy eviction in each lowered order; a third of what is left (half when
        nothing fits yet): local search alone first, until a plan fits (seconds), then
        iterated local search from the lowest lowered orders."""
        lowered_until = self.share(0.5 if not self.fitted else 0.35)
        descent_until = self.share_until(lowered_until, 0.4)
        before = len(self.fitted)
        for name in list(ranked):
            if (time.perf_counter() > descent_until or len(self.fitted) > before
                    or self.retained):
                break
            if (not self.fitted and self.n >= LOWERED_FIRST_NODES
                    and len(self.descended) >= DESCENTS_WHILE_NONE):
                break  # seconds each at this size: iterated local search from the best instead
            if name.startswith("lowered@") or any(d == name for _, d in self.descended):
                continue
            if found_optimal := self.lower(name, descent_until, iterate=False):
                return found_optimal
        for _, name in sorted(self.descended):
            if time.perf_counter() > lowered_until or self.retained:
                break
            ils_until, chunk = self.share_until(lowered_until, 0.5), 0
            while (time.perf_counter() < ils_until and not self.retained
                   and not (self.counted and self.ils_chunks >= self.ils_chunks_counted)):
                # while nothing fits: in chunks, retention tried on each new lowest order
                if found_optimal := self.lower(name, ils_until, iterate=True, chunk=chunk):
                    return found_optimal
                chunk += 1
                self.ils_chunks += 1
        return None

    def lower(self, name: str, until: float, iterate: bool, chunk: int = 0) -> Fitted:
        """Order `name` lowered (or, `iterate`, a chunk of iterated local search from it);
        greedy eviction, then retention near the budget, in each new lowest order. A one-plan
        list when its store-all fits (optimal), else empty."""
        low = f"lowered@{name}" + ("+ils" if iterate else "")
        start = self.orders.get(low, self.orders.get(f"lowered@{name}", self.orders[name]))
        kick = (max(KICK_MOVES, self.n // ILS_KICK_PER_NODES) if self.n >= LOWERED_FIRST_NODES
                else KICK_MOVES)
        order, _ = lowered_order(
            self.graph, start, self.budget_bytes, until, seed=self.seed + chunk,
            iterate=iterate, kick=kick if not self.fitted else KICK_MOVES,
            max_kicks=None if self.fitted and not self.counted else ILS_CHUNK_KICKS,
            stop_below=None if self.fitted or self.retained else int(self.retention_below))
        problem = problem_from_graph(with_order(self.graph, order), self.budget_bytes)
        plan = CheckpointPlan(problem)
        peak = plan.peak_bytes
        lower_peak = peak < self.lowered_peaks.get(low, peak + 1)
        self.lowered_peaks[low] = peak  # store-all's (greedy eviction below changes `plan`'s)
        # lowered_order never returns a worse score than `start`'s
        self.orders[low], self.problems[low], self.store_all[low] = order, problem, plan
        if not lower_peak:
            return []  # a chunk of iterated local search: a plateau move at most
        self.attempted.discard(low)
        if peak <= self.budget_bytes:  # every node once: nothing is cheaper
            self.order_of[f"store-all@{low}"] = order
            self.offer(self.store_all[low].actions(), f"store-all@{low}")
            return [(low, self.store_all[low])]
        if not iterate:
            self.descended.append((peak, name))
        self.attempt(low, 0.2)
        if not self.fitted and not self.retained and peak < self.retention_below:
            # Retention checkpointing fits (or gets stuck) in about a second once the order's
            # store-all peak is within a few per cent of the budget (random2000 at 0.8: plans
            # from 3 of 6 orders at 1.04-1.05 × budget, none of 9 above): tried on each new
            # lowest such order, one deterministic attempt each (restarts with random candidate
            # orders get stuck where the first does; another order is what helps).
            self.retention_below = peak
            self.retain(low, min(self.share(0.35), time.perf_counter() + RETENTION_TRY_S),
                        attempts=1)
        return []

    def retain(self, name: str, until: float, attempts: int = 6) -> None:
        actions = tight_budget_plan(self.problems[name], until, seed=self.seed + len(self.retained),
                                    attempts=attempts)
        if actions is not None and self.offer(actions, f"retention@{name}"):
            self.order_of[f"retention@{name}"] = self.orders[name]
            self.retained.append(name)

    def retention(self, ranked: list[str]) -> None:
        """Retention checkpointing (`retention.tight_budget_plan`: a value kept until the last
        stage that needs it) in the lowest-peak orders, lowered ones included: it fits where
        greedy eviction and DTR get stuck (random2000 at 0.8) and on small graphs it is often
        cheaper than greedy (random500 at 0.8: +0.6 % vs +3.0 %)."""
        if not (ranked and time.perf_counter() < self.deadline
                and ((not self.fitted and not self.retained)
                     or LOWERED_MIN_NODES < self.n <= RETENTION_ALSO_MAX_NODES)):
            return
        for name in ranked[:2]:
            if time.perf_counter() > self.deadline or (self.retained and not self.fitted):
                break
            if name not in self.retained:
                # counted: no share of the phase to end it, so a cap (only while none fits)
                self.retain(name, min(self.share(0.35), time.perf_counter() + RETENTION_TRY_S)
                            if self.counted else self.share(0.35))

    # -- the chain DP (the baselines and dynamic eviction: `fallbacks`) ---------------------
    def early_chain_dp(self) -> None:
        """The chain DP (a second or two) early on training graphs: at tight budgets on stacks
        of blocks it is the quickest good plan (gpt12 at 0.6: +39 % where the first greedy
        plan is +99 %; llama32 at 0.6: +27 %, where greedy does not fit)."""
        if (self.chain_found is None and self.n <= LOWERED_FIRST_NODES
                and is_training(self.graph) and time.perf_counter() < self.deadline - 0.5):
            self.chain_found = chain_candidate(self.graph, self.budget_bytes, self.offer,
                                               self.threads, self.share(0.25), self.notes,
                                               self.timings)

    def late_chain_dp(self) -> None:
        """The chain DP again with the rest of the phase when the early call ran out of its
        share; before DTR, which it often beats by far (llama32 at 0.6: +27 % vs +45 %)."""
        if (self.chain_found is None and is_training(self.graph)
                and time.perf_counter() < self.deadline - 0.5):
            self.chain_found = chain_candidate(self.graph, self.budget_bytes, self.offer,
                                               self.threads, self.deadline, self.notes,
                                               self.timings)
