"""The portfolio's candidates from simpler methods: Chen's √n checkpoints, the baselines, the
hand-written policies and dynamic eviction (DTR-style). `Portfolio.run` decides when each runs;
these offer the plans.

Each takes the running `Portfolio` for its graph, budget, deadline, `offer`, the orders it
knows and their problems, and records the order of each plan that became the best in
`order_of`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from planner.solvers.remat.dtr import SCORES, dtr_depth_first_plan, dtr_plan

if TYPE_CHECKING:
    from planner.solvers.remat.portfolio import Portfolio


def chen_sqrt_candidate(p: Portfolio) -> None:
    """Chen's √n checkpoints, which `offer` polishes (values kept instead of recomputed where
    memory allows): milliseconds, and at tight budgets sometimes the best start (gpt12 at 0.6:
    +57.5 % raw, +31.0 % polished; the chain DP's +32.6 %)."""
    from planner.solvers.baselines import ScheduleAbandoned, chen_sqrt

    try:
        if p.offer(chen_sqrt(p.graph, deadline=p.share(0.1)), "baseline:chen-sqrt"):
            p.order_of["baseline:chen-sqrt"] = p.orders["given"]
    except ScheduleAbandoned:
        pass  # past its share: the searches after it matter more


def baseline_candidates(p: Portfolio) -> bool:
    """The baselines (store-all, recompute-all, Chen's) within half of what is left of the
    phase; whether one became the best plan."""
    from planner.solvers.baselines import bounded_baselines

    found = False
    for name, actions in bounded_baselines(p.graph, p.budget_bytes, deadline=p.share(0.5)):
        if p.offer(actions, f"baseline:{name}"):
            found = True
            p.order_of[f"baseline:{name}"] = p.orders["given"]
    return found


def handwritten_candidates(p: Portfolio) -> bool:
    """What users write by hand (`planner.solvers.handwritten`: torch's checkpoint around
    every k-th block, torchtitan's selective matmul saving), built once per graph in
    milliseconds: at each of their own peaks auto is then at least as fast as they are;
    whether one became the best plan."""
    from planner.solvers.handwritten import handwritten_plans

    if not any(node.module_path for node in p.graph.nodes):
        return False  # no model behind the graph (synthetic, imported): nothing hand-written
    found = False
    for name, actions in handwritten_plans(p.graph, deadline=p.share(0.2)):
        if time.perf_counter() > p.deadline:
            break
        if p.offer(actions, f"handwritten:{name}"):
            found = True
            p.order_of[f"handwritten:{name}"] = p.orders["given"]
    return found


def dtr_candidates(p: Portfolio, ranked: list[str]) -> bool:
    """Dynamic eviction, depth-first and plain, with each score, in the two lowest-peak orders
    of `ranked`, each with 30 % of what is left; whether one became the best plan."""
    found = False
    for name in ranked[:2]:
        for fn in (dtr_depth_first_plan, dtr_plan):
            for score in SCORES.values():
                if time.perf_counter() > p.deadline:
                    return found
                actions = fn(p.problems[name], score, p.share(0.3))
                if actions is not None and p.offer(actions, f"dtr@{name}"):
                    p.order_of[f"dtr@{name}"] = p.orders[name]
                    found = True
    return found
