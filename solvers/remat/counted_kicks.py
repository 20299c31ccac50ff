"""Kicked orders by count: auto's improvement on mid-sized graphs, the same plans on a loaded
machine (later), where a search until the deadline answers what the machine had time for.

The walk of `improve_large`'s kicks (random moves on the order of the cheapest plan, a
peak-lowering local search, greedy eviction in the result, kept when cheaper; the walk goes on
from any order within WALK_TOLERANCE of the cheapest), for a number of kicks that the time
limit buys on a quiet machine (`kicks_for`), not for as long as the limit lasts: on a traced
GPT-2 (4 layers) at 0.9 of store-all, 60 s, the plan of a search until the deadline was
+10.1 % quiet and +11.7 % with three CPU hogs. The deadline stays a safety net.
"""

from __future__ import annotations

import random
import time

from planner.core.graph import Graph
from planner.solvers.remat.checkpoints import CheckpointPlan
from planner.solvers.remat.greedy import evict
from planner.solvers.remat.improve_large import KICK_FRACTIONS, WALK_TOLERANCE, Offer
from planner.solvers.remat.late_orders import KICK_MOVES, Reorderer
from planner.solvers.remat.orders import with_order
from planner.solvers.remat.problem import problem_from_graph

__all__ = ["KICK_NODES_PER_S", "counted_kicks", "kicks_for"]

# Kicks x nodes per second of the limit: a kick on a 367-node GPT-2 took about 0.25 s on a
# shared 2-core machine; this buys kicks for about a sixth of the limit there (24 at 60 s),
# leaving room for a machine four times slower, after the first phase, before the deadline
# cuts the walk short.
KICK_NODES_PER_S = 150.0
MAX_KICK_MOVES = 400  # random moves per kick at most (improve_large's cap)


def kicks_for(node_count: int, time_limit_s: float) -> int:
    """How many kicks a limit buys on a graph of this size (at least one)."""
    return max(1, int(KICK_NODES_PER_S * time_limit_s / max(1, node_count)))


def counted_kicks(graph: Graph, budget_bytes: int, fitted: list[tuple[str, CheckpointPlan]],
                  offer: Offer, order_of: dict[str, list[int]], kicks: int, deadline: float,
                  seed: int) -> bool:
    """`kicks` kicks from the cheapest plan of `fitted` (cheapest first; it gains every plan
    kept); True when an order's store-all fits (optimal, offered). Nothing when nothing fits
    yet (the walk needs a plan to start from)."""
    if not fitted:
        return False
    rng = random.Random(seed + 1)
    reorder = Reorderer(graph, budget_bytes)
    n = len(graph.nodes)
    current = list(fitted[0][1].problem.node_ids)
    for count in range(1, kicks + 1):
        if time.perf_counter() > deadline:
            break
        moves = max(KICK_MOVES, min(MAX_KICK_MOVES, int(rng.choice(KICK_FRACTIONS) * n)))
        order, _ = reorder.lower(current, deadline, rng, moves, first_improvement=True)
        plan = CheckpointPlan(problem_from_graph(with_order(graph, order), budget_bytes))
        name = f"kick{count}"
        if plan.peak_bytes <= budget_bytes:
            order_of[f"store-all@{name}"] = order
            offer(plan.actions(), f"store-all@{name}")
            return True
        if not evict(plan, deadline):
            continue
        best = fitted[0][1].total_cost
        if plan.total_cost < best:
            order_of[f"greedy@{name}"] = order
            fitted.insert(0, (name, plan))
            offer(plan.actions(), f"greedy@{name}")
        if plan.total_cost <= best * (1 + WALK_TOLERANCE):
            current = order  # a walk over near-equal orders, not only downhill
    return False
