"""Gradient lifetime: what charging gradients from their backward node on (not from the first
forward op) buys on a traced GPT, at the memory torch.compile's partitioner reached.

The issue's case: a 6-layer GPT (zoo.gpt, batch 8, context 128, dim 256); torch.compile with
`activation_memory_budget=0.2` ran its step at 26.0 MiB above the start (CPU profiler,
gradients included). For each lifetime the table gives the store-all peak above the start, and
the `auto` plan at start + 26.0 MiB (start: what is resident before the step's first op:
parameters, buffers, inputs, optimizer state, and gradients when they live all step).

    .venv/bin/python benchmarks/gradient_lifetime.py [--time-limit 30] [--above-mib 26.0] \
        [--write docs/gradient_lifetime.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import machine, write_sections  # noqa: E402

from planner.core.budget import format_bytes  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.sim.step_memory import step_memory  # noqa: E402
from planner.solvers.baselines import store_all_peak_bytes  # noqa: E402

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--above-mib", default="26,32", help="budgets: MiB above the start")
    parser.add_argument("--write", type=Path, default=None,
                        help="also write the table into this page's measured section")
    args = parser.parse_args()
    lines: list[str] = []

    def show(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    above = [float(x) for x in args.above_mib.split(",")]

    import torch

    from planner.sim.simulator import simulate
    from planner.solvers.baselines import BASELINES
    from planner.tracing import trace
    from planner.tracing.api import resolve_gradient_lifetime
    from planner.zoo import gpt

    torch.set_num_threads(1)
    show(f"machine: {machine()}")
    show("6-layer GPT (batch 8, context 128, dim 256, SGD); start = what is resident before "
         "the step under zero_grad(set_to_none=True): parameters, buffers, inputs")
    show(f"auto with --time-limit {args.time_limit:g}; peaks and budgets in MiB above the start\n")
    graphs = {}
    for lifetime in ("step", "backward"):
        model, inputs = gpt(batch_size=8, context=128, dim=256, layers=6)
        graphs[lifetime] = trace(model, inputs, gradient_lifetime=lifetime).graph
    start = step_memory(graphs["backward"]).start_bytes  # no gradients before the step
    default = resolve_gradient_lifetime(None)  # what trace() writes when not told
    cols = " | ".join(f"auto at +{a:g}" for a in above)
    header = (f"| gradient lifetime | charged from the first op | held from backward | "
              f"store-all peak | least baseline peak | {cols} |")
    show(header)
    show("|---" * (header.count("|") - 1) + "|")
    for lifetime, graph in graphs.items():
        memory = step_memory(graph)
        least = min(simulate(graph, fn(graph, None)).peak_bytes for fn in BASELINES.values())
        cells = []
        for a in above:
            began = time.perf_counter()
            plan = solve(graph, start + int(a * MIB), "auto", time_limit_s=args.time_limit)
            wall = time.perf_counter() - began
            if plan.status.value in ("optimal", "feasible") and plan.predicted is not None:
                cells.append(f"{plan.status.value} {100 * plan.predicted.overhead:+.1f} % "
                             f"({wall:.0f} s)")
            else:
                cells.append(f"{plan.status.value} ({wall:.0f} s)")
        label = f"{lifetime} (default)" if lifetime == default else lifetime
        show(f"| {label} | {format_bytes(memory.start_bytes - start)} | "
             f"{format_bytes(sum(memory.held_from_node.values()))} | "
             f"{(store_all_peak_bytes(graph) - start) / MIB:.2f} | "
             f"{(least - start) / MIB:.2f} | {' | '.join(cells)} |")
    if args.write:  # the table (the page's summary) in place, the notes around it kept
        write_sections(args.write, {"measured": lines}, title="Gradient lifetime on a traced GPT")


if __name__ == "__main__":
    main()
