"""Gradient lifetime: what charging gradients from their backward node on (not from the first
forward op) buys on a traced GPT, at the memory torch.compile's partitioner reached.

The issue's case: a 6-layer GPT (zoo.gpt, batch 8, context 128, dim 256); torch.compile with
`activation_memory_budget=0.2` ran its step at 26.0 MiB above the start (CPU profiler,
gradients included). For each lifetime the table gives the store-all peak above the start, and
the `auto` plan at start + 26.0 MiB (start: what is resident before the step's first op:
parameters, buffers, inputs, optimizer state, and gradients when they live all step).

    .venv/bin/python benchmarks/gradient_lifetime.py [--time-limit 30] [--above-mib 26.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine  # noqa: E402

from planner.budget import format_bytes  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.memory_model import step_memory  # noqa: E402
from solvers.baselines import store_all_peak_bytes  # noqa: E402

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--above-mib", type=float, default=26.0)
    args = parser.parse_args()

    import torch

    from planner.tracing import trace
    from planner.zoo import gpt

    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    print(f"6-layer GPT (batch 8, context 128, dim 256), auto with --time-limit "
          f"{args.time_limit:g}, budget = start + {args.above_mib:g} MiB\n")
    header = ("| gradient lifetime | start | gradients held from backward | store-all peak above "
              "start | budget | auto status | peak above start | overhead | solve s |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for lifetime in ("step", "backward"):
        model, inputs = gpt(batch_size=8, context=128, dim=256, layers=6)
        graph = trace(model, inputs, gradient_lifetime=lifetime).graph
        memory = step_memory(graph)
        start = memory.start_bytes
        held = sum(memory.held_from_node.values())
        store_all = store_all_peak_bytes(graph)
        budget = start + int(args.above_mib * MIB)
        began = time.perf_counter()
        plan = solve(graph, budget, "auto", time_limit_s=args.time_limit)
        wall = time.perf_counter() - began
        peak = plan.predicted.peak_bytes if plan.predicted else None
        fits = plan.status.value in ("optimal", "feasible")
        overhead = f"{100 * plan.predicted.overhead:+.2f} %" if plan.predicted and fits else "-"
        above = format_bytes(peak - start) if peak is not None and fits else "-"
        print(f"| {lifetime} | {format_bytes(start)} | {format_bytes(held)} | "
              f"{format_bytes(store_all - start)} | {format_bytes(budget)} | "
              f"{plan.status.value} | {above} | {overhead} | {wall:.1f} |")


if __name__ == "__main__":
    main()
