"""Tight budgets on random layered DAGs: `retention.tight_budget_plan` in memory-aware orders.

For each graph (`planner.core.synthetic.random_layered_dag(n, seed=0)`): the trivial lower bound
(`lower_bound_peak_bytes`) and the orders' store-all peaks as fractions of the given order's
store-all peak; per fraction, whether a plan was found (the better of the orders), its
overhead (simulator compute over every node once) and seconds; and the least fraction the
heuristic reaches (a downward scan in steps of --step, stopped after three misses in a row).
Every plan is checked by `planner.sim.simulator.simulate`.

    .venv/bin/python benchmarks/remat_tight.py --sizes 500,1000,2000 --fractions 0.8,0.6,0.4
    .venv/bin/python benchmarks/remat_tight.py --lowered 10 ...   (orders after late_orders)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.core.graph import Graph  # noqa: E402
from planner.core.synthetic import random_layered_dag  # noqa: E402
from planner.sim.simulator import lower_bound_peak_bytes, simulate  # noqa: E402
from planner.solvers.baselines import store_all_peak_bytes  # noqa: E402
from planner.solvers.remat.orders import ORDER_KEYS, greedy_order, with_order  # noqa: E402
from planner.solvers.remat.problem import problem_from_graph  # noqa: E402
from planner.solvers.remat.retention import tight_budget_plan  # noqa: E402

ORDERS = ("least-growth", "growth-then-order")


def attempt(graph: Graph, ordered: dict[str, Graph], budget: int, limit_s: float
            ) -> tuple[float, float] | None:
    """(overhead, seconds) of the cheapest plan over the orders, each with limit_s / orders."""
    total = sum(n.compute_ms for n in graph.nodes)
    started = time.perf_counter()
    best: float | None = None
    for g in ordered.values():
        actions = tight_budget_plan(problem_from_graph(g, budget),
                                    time.perf_counter() + limit_s / len(ordered))
        if actions is None:
            continue
        result = simulate(graph, actions)
        assert result.peak_bytes <= budget, (result.peak_bytes, budget)
        overhead = result.compute_cost / total - 1.0
        best = overhead if best is None else min(best, overhead)
    return None if best is None else (best, time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="500,1000,2000")
    ap.add_argument("--fractions", default="0.8,0.6,0.4")
    ap.add_argument("--limit", type=float, default=20.0, help="seconds per attempt")
    ap.add_argument("--scan-limit", type=float, default=4.0, help="seconds per scan step")
    ap.add_argument("--step", type=float, default=0.01)
    ap.add_argument("--no-scan", action="store_true")
    ap.add_argument("--lowered", type=float, default=0.0,
                    help="seconds of peak-lowering local search (late_orders) per order")
    args = ap.parse_args()
    print("| graph | lower bound | store-all (orders) | fraction | found | overhead | s |")
    print("|---|---|---|---|---|---|---|")
    for n in map(int, args.sizes.split(",")):
        graph = random_layered_dag(n, seed=0)
        top = store_all_peak_bytes(graph)
        ordered = {k: with_order(graph, greedy_order(graph, ORDER_KEYS[k])) for k in ORDERS}
        if args.lowered > 0:
            from planner.solvers.remat.late_orders import lowered_order

            low = min(map(float, args.fractions.split(",")))
            ordered = {f"lowered@{k}": with_order(graph, lowered_order(
                graph, g.order or [], math.ceil(low * top),
                time.perf_counter() + args.lowered)[0]) for k, g in ordered.items()}
        peaks = "/".join(f"{store_all_peak_bytes(g) / top:.3f}" for g in ordered.values())
        bound = f"{lower_bound_peak_bytes(graph) / top:.4f}"
        for fraction in map(float, args.fractions.split(",")):
            hit = attempt(graph, ordered, math.ceil(fraction * top), args.limit)
            cells = (["yes", f"+{100 * hit[0]:.1f} %", f"{hit[1]:.1f}"] if hit
                     else ["no", "-", f"{args.limit:.1f}"])
            print(f"| random{n} | {bound} | {peaks} | {fraction} | " + " | ".join(cells) + " |",
                  flush=True)
        if args.no_scan:
            continue
        least, misses, fraction = None, 0, 1.0
        while misses < 3 and fraction > 0:
            hit = attempt(graph, ordered, math.ceil(fraction * top), args.scan_limit)
            if hit is not None:
                least, misses = (fraction, hit), 0
            else:
                misses += 1
            fraction = round(fraction - args.step, 4)
        if least is not None:
            print(f"| random{n} | {bound} | {peaks} | least {least[0]:.2f} | yes | "
                  f"+{100 * least[1][0]:.1f} % | {least[1][1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
