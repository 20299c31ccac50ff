"""Hand-written checkpointing against `auto` at the same memory (issue 26, item 3).

For GPTs of 12, 24 and 48 layers (about 800, 1,600 and 3,200 op-level nodes; `zoo.gpt`
defaults otherwise, costs estimated), every hand-written plan `auto` takes as a candidate
(`planner.solvers.handwritten.handwritten_plans`: torch's checkpoint around every k-th block,
k = 1..4, and torchtitan's selective matmul saving, with and without every other matmul):
its peak and compute overhead, then `auto` with that peak as the budget: its overhead, the
ratio of the costs, the time until auto's incumbent was at most as costly (its progress
reports) and the solve's wall time. With --repeats > 1 the times are medians.

    .venv/bin/python benchmarks/handwritten.py --time-limit 10 --write docs/handwritten_policies.md
    .venv/bin/python benchmarks/handwritten.py --rows gpt12 --time-limit 5

Traced graphs are cached as JSON in --cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from results import write_doc

ROWS = {"gpt12": 12, "gpt24": 24, "gpt48": 48}


def load_graph(name: str, cache: Path) -> Any:
    from planner.core.graph import Graph

    path = cache / f"{name}.json"
    if path.exists():
        return Graph.model_validate_json(path.read_text())
    from planner.tracing.api import trace
    from planner.zoo import gpt

    model, inputs = gpt(layers=ROWS[name])
    graph = trace(model, inputs, costs="estimate", model_name=name).graph
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(graph.model_dump_json())
    return graph


def auto_at(graph: Any, budget: int, target_cost: float, time_limit: float
            ) -> tuple[float | None, float | None, float]:
    """auto's cost at `budget`, seconds until its incumbent cost at most `target_cost`, wall."""
    from planner.engine.solve import solve

    started = time.perf_counter()
    matched: list[float] = []

    def progress(objective: float | None, _bound: float | None) -> None:
        if objective is not None and not matched and objective <= target_cost * (1 + 1e-9):
            matched.append(time.perf_counter() - started)

    plan = solve(graph, budget, "auto", time_limit_s=time_limit, progress=progress)
    wall = time.perf_counter() - started
    fits = plan.status.value in ("optimal", "feasible")
    cost = plan.objective if fits else None
    if cost is not None and not matched and cost <= target_cost * (1 + 1e-9):
        matched.append(wall)
    return cost, matched[0] if matched else None, wall


def run_row(name: str, graph: Any, time_limit: float, repeats: int) -> list[dict[str, Any]]:
    from planner.sim.simulator import simulate
    from planner.solvers.handwritten import handwritten_plans

    base = graph.total_compute_ms
    rows = []
    for policy, actions in handwritten_plans(graph):
        sim = simulate(graph, actions)
        runs = [auto_at(graph, sim.peak_bytes, sim.compute_cost, time_limit)
                for _ in range(repeats)]
        costs = [c for c, _, _ in runs if c is not None]
        matches = [m for _, m, _ in runs if m is not None]
        rows.append({
            "graph": name, "nodes": len(graph.nodes), "policy": policy,
            "peak": sim.peak_bytes, "overhead": sim.compute_cost / base - 1,
            "auto_overhead": statistics.median(costs) / base - 1 if costs else None,
            "ratio": statistics.median(costs) / sim.compute_cost if costs else None,
            "matched_s": statistics.median(matches) if len(matches) == repeats else None,
            "wall_s": statistics.median(w for _, _, w in runs),
        })
        print(_line(rows[-1]), flush=True)
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None else f"+{100 * x:.1f} %"


def _line(r: dict[str, Any]) -> str:
    ratio = "—" if r["ratio"] is None else f"{r['ratio']:.4f}"
    matched = "never" if r["matched_s"] is None else f"{r['matched_s']:.2f}"
    return (f"| {r['graph']} | {r['nodes']:,} | {r['policy']} | {r['peak'] / 2**20:.1f} | "
            f"{_pct(r['overhead'])} | {_pct(r['auto_overhead'])} | {ratio} | {matched} | "
            f"{r['wall_s']:.1f} |")


HEADER = ["| graph | nodes | hand-written plan | peak MiB | its overhead | auto's overhead "
          "at that peak | auto / plan | s until auto ≤ plan | auto wall s |",
          "|---|---|---|---|---|---|---|---|---|"]


NOTES = [
    "What the plans are: `planner-cli methods` lists them as `checkpoint-blocks` (option "
    "`every`, `prefix`) and `selective-matmul` (option `every_other`, `prefix`); "
    "`planner/solvers/handwritten.py` says how each becomes a plan of the one schedule builder "
    "the baselines use (torch's non-reentrant checkpoint: a block's inputs saved, the block "
    "recomputed at its first backward op that reads a dropped value, recomputed values freed "
    "after their last backward use; torchtitan's op policy: matmul and attention outputs "
    "saved, the rest of each block recomputed). Blocks: the module-path prefix whose numbered "
    "children (at least two) hold the most forward ops, `h` here.",
    "",
    "Why auto is never slower: its first phase offers these plans "
    "(`solvers/remat/fallbacks.handwritten_candidates`, built once per graph, well under a "
    "second at 3,200 nodes) before its own searches, so at a plan's own peak auto starts from "
    "it and only replaces it with a cheaper plan. At every block checkpointed it found "
    "nothing cheaper within 10 s and returns the hand-written plan itself; elsewhere it is "
    "2-9 % cheaper at the same memory.",
    "",
    "Wall times: auto uses its whole time limit (it keeps improving and proving) and the "
    "engine then judges the plan, so the wall is the limit plus a few tenths of a second; "
    "'s until auto ≤ plan' is when its incumbent first cost no more than the hand-written plan.",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/handwritten_cache"))
    ap.add_argument("--write", type=Path, default=None, help="markdown page to write")
    args = ap.parse_args()
    print("\n".join(HEADER))
    rows = [r for name in args.rows
            for r in run_row(name, load_graph(name, args.cache), args.time_limit, args.repeats)]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    worst = max(ratios, default=float("nan"))
    summary = (f"auto / hand-written cost at the same peak: median {statistics.median(ratios):.4f}"
               f", worst {worst:.4f} over {len(ratios)} plans" if ratios else "no plans")
    print(summary)
    if args.write is not None:
        write_doc(args.write, "Hand-written checkpointing vs auto at the same memory", [
            "",
            f"`{' '.join(['.venv/bin/python', 'benchmarks/handwritten.py', *sys.argv[1:]])}`",
            "",
            f"auto's time limit {args.time_limit:g} s, {args.repeats} run(s) per plan (times "
            "are medians). Overheads: the simulator's compute cost over running every node "
            "once (costs estimated); peak: the simulator's, which is auto's budget.", "", summary,
        ], [*HEADER, *map(_line, rows)], NOTES)
    return 0 if not ratios or worst <= 1 + 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
