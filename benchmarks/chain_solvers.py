"""Chain solvers benchmark: Rotor DP solve time, and rotor beside the general-graph solvers.

1. Solve time of the Rotor DP for L ∈ {25, 50, 100, 200} stages and M ∈ {250, 500, 1000}
   memory slots on random heterogeneous chains (budget 0.4 × store-all, one plain DP run,
   no refinement), with the exact peak of the sequence found.
2. Every graph of ../shared/graphs/checkmate at budgets 0.9 and 0.8 (budget = ceil(fraction ×
   store-all peak), as published): duration increase of the plan from `rotor` (linearised
   graph), `revolve`, `chain-chen-sqrt`, the baselines and `auto` where registered. Plans are
   judged by the simulator; ✗ = no plan within the budget (with the least budget the method
   knows of).

    .venv/bin/python benchmarks/chain_solvers.py --write docs/chain_benchmark.md
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from results import machine, write_page

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "graphs" / "checkmate"


def random_chain(length: int, seed: int = 0):
    from planner.solvers.chain.model import Chain, Stage

    rng = random.Random(seed)
    prev = rng.randint(1, 8) * 2**20
    x0, stages = prev, []
    for _ in range(length):
        x = rng.randint(1, 8) * 2**20 + rng.randint(0, 4095)
        stages.append(
            Stage(
                forward_ms=rng.uniform(1, 10),
                backward_ms=rng.uniform(2, 20),
                output_bytes=x,
                saved_bytes=x + rng.randint(0, 16) * 2**20,
                forward_tmp_bytes=rng.randint(0, 2) * 2**20,
                backward_tmp_bytes=rng.randint(0, 2) * 2**20,
                grad_input_bytes=prev,
            )
        )
        prev = x
    return Chain(tuple(stages), input_bytes=x0)


def timing_table(lengths: list[int], slot_counts: list[int]) -> list[str]:
    from planner.solvers.chain.rotor import solve_rotor
    from planner.solvers.chain.sequence import run_sequence, store_all_ops

    rows = [
        "| L | M | solve (s) | recomputation overhead | peak / budget |",
        "|---|---|---|---|---|",
    ]
    for length in lengths:
        chain = random_chain(length)
        full = run_sequence(chain, store_all_ops(length)).peak_bytes
        base = sum(s.forward_ms + s.backward_ms for s in chain.stages)
        budget = int(0.4 * full)
        for slots in slot_counts:
            started = time.perf_counter()
            sol = solve_rotor(chain, budget, slots)
            elapsed = time.perf_counter() - started
            if sol.ops is None or sol.cost is None or sol.peak_bytes is None:
                rows.append(f"| {length} | {slots} | {elapsed:.2f} | ✗ | - |")
            else:
                overhead = 100 * (sol.cost - base) / base
                rows.append(
                    f"| {length} | {slots} | {elapsed:.2f} | {overhead:+.2f} % "
                    f"| {sol.peak_bytes / budget:.4f} |"
                )
            print(rows[-1], flush=True)
    return rows


def cell(plan, graph) -> str:
    from planner.core.plan import PlanStatus

    if plan.status in (PlanStatus.optimal, PlanStatus.feasible) and plan.predicted is not None:
        return f"{100 * plan.predicted.overhead:+.2f} %"
    from planner.core.budget import format_bytes

    least = plan.details.get("smallest_feasible_bytes")
    return f"✗ (≥ {format_bytes(least)})" if least else f"✗ {plan.status.value}"


def corpus_table(methods: list[str], time_limit: float) -> list[str]:
    from planner.core.budget import format_bytes
    from planner.engine.inputs import load_graph
    from planner.engine.registry import method_names
    from planner.engine.solve import solve
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.solvers.chain.linearize import linearize

    methods = [m for m in methods if m in method_names()]
    head = "| graph | nodes | segments | budget | " + " | ".join(methods) + " | rotor time (s) |"
    rows = [head, "|" + "---|" * (len(methods) + 5)]
    for path in sorted(CORPUS.glob("*.json")):
        graph = load_graph(path)
        segments = linearize(graph).chain.length
        full = store_all_peak_bytes(graph)
        for fraction in (0.9, 0.8):
            budget = math.ceil(fraction * full)
            cells, rotor_time = [], "-"
            for method in methods:
                plan = solve(graph, budget, method, time_limit_s=time_limit)
                cells.append(cell(plan, graph))
                if method == "rotor":
                    rotor_time = f"{plan.wall_seconds:.2f}"
            rows.append(
                f"| {path.stem} | {len(graph.nodes)} | {segments} | {fraction} "
                f"({format_bytes(budget)}) | " + " | ".join(cells) + f" | {rotor_time} |"
            )
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="25,50,100,200")
    parser.add_argument("--slots", default="250,500,1000")
    parser.add_argument(
        "--methods",
        default="rotor,revolve,chain-chen-sqrt,chen-sqrt,chen-greedy,best-baseline,auto",
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per solve (auto)")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--write", type=Path, help="also write the tables as Markdown here")
    args = parser.parse_args()
    out = [f"Machine: {machine()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.", ""]
    if not args.skip_timing:
        out += ["## Rotor DP solve time (random heterogeneous chains, budget 0.4 × store-all)", ""]
        out += timing_table(
            [int(v) for v in args.lengths.split(",")], [int(v) for v in args.slots.split(",")]
        )
        out.append("")
    if not args.skip_corpus:
        if not CORPUS.is_dir():
            print(f"{CORPUS} is absent: corpus table skipped", file=sys.stderr)
        else:
            out += [
                "## Checkmate corpus: duration increase at budgets 0.9 and 0.8",
                "",
                f"Rotor, revolve and chain-chen-sqrt run on the linearised graph (segments: its "
                f"chain length); `auto` with a {args.time_limit:g} s limit. ✗: no plan within "
                "the budget (≥: least budget the method knows of). The difference between "
                "rotor and `auto` is what linearisation costs: rotor recomputes whole "
                "segments, and graphs with long skip connections (U-Nets, FCN) or no chain "
                "structure (random_layered) collapse into few large segments.",
                "",
            ]
            out += corpus_table(args.methods.split(","), args.time_limit)
    if args.write:
        write_page(args.write, ["# Chain solvers benchmark", "", *out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
