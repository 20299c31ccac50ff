"""Train a GPT-style model for a few steps under a memory budget that store-all exceeds.

    .venv/bin/python examples/train_gpt.py                      # in-process solve
    .venv/bin/python examples/train_gpt.py --server http://127.0.0.1:8000

The agent traces one step, gets a plan (service, cache or local solve; progress lines while it
solves, PLANNER_PROGRESS_EVERY_S apart), applies it, measures one step and plans again, once,
only when that step exceeds the budget by more than 0.5 % (at least 64 KiB): `--strict` makes
a step still over after that an error (exit 3) instead of a warning. The loop below is ordinary
PyTorch: forward returns the loss, `loss.backward()`, `optimizer.step()`.
Every step is measured: loss, peak bytes the step allocated (exact live-storage accounting on
CPU, the allocator's peak on CUDA) and wall time (on CPU the accounting slows each op: compare
step times with `benchmarks/runtime_vs_torch.py`, which times without it).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--fraction", type=float, default=0.6,
        help="budget = fixed memory + this fraction of store-all's activation memory",
    )
    parser.add_argument("--method", default="auto")
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver seconds")
    parser.add_argument("--server", default=None, help="planner service URL (else solve here)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--strict", action="store_true",
                        help="fail (exit 3) when the measured step exceeds the budget")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="agent: %(message)s")
    for noisy in ("httpx", "httpcore"):  # not one line per poll of the service (--server)
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from planner import zoo
    from planner.core.budget import format_bytes
    from planner.core.errors import InputError, NoPlanFits
    from planner.runtime.agent import plan_for
    from planner.runtime.measure import measure_step, training_step
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(
        batch_size=args.batch, context=args.context, dim=args.dim, layers=args.layers, vocab=256
    )
    graph = trace(model, inputs).graph  # only to size the budget
    store_all = store_all_peak_bytes(graph)
    budget = graph.fixed_bytes + int(args.fraction * (store_all - graph.fixed_bytes))
    print(
        f"GPT {args.layers} layers, dim {args.dim}, batch {args.batch}×{args.context}: "
        f"{len(graph.nodes)} graph nodes; store-all peak {format_bytes(store_all)}, "
        f"budget {format_bytes(budget)} ({format_bytes(graph.fixed_bytes)} fixed)"
    )
    try:
        module = plan_for(
            model, inputs, budget, server=args.server, method=args.method,
            cache_dir=args.cache_dir, time_limit_s=args.time_limit, log_steps=0,
            strict=args.strict,
        )
    except NoPlanFits as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = module.agent_report
    predicted = report.plan.predicted
    assert predicted is not None
    print(
        f"plan: {report.plan.summary()} (from {report.source}); predicted peak "
        f"{format_bytes(predicted.peak_bytes)} = {format_bytes(graph.fixed_bytes)} fixed + "
        f"{format_bytes(report.predicted_activation_bytes)} step"
    )
    eager = measure_step(training_step(model, inputs), model)
    print(f"eager step for reference: {format_bytes(eager.peak_bytes)} allocated by the step")
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    print(f"{'step':>4} {'loss':>8} {'step peak':>12} {'w/o grads':>12} {'ms':>8}")
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        measured = measure_step(training_step(module, inputs), model)
        optimizer.step()
        print(
            f"{step:>4} {measured.loss:>8.4f} {format_bytes(measured.peak_bytes):>12} "
            f"{format_bytes(measured.activation_peak_bytes):>12} {measured.duration_ms:>8.1f}"
        )
    predicted = report.predicted_activation_bytes or 0
    # the prediction holds the gradients the step creates when the graph's lifetime is
    # "backward" (the default), and leaves them in its fixed bytes under "step"
    state = report.graph.model_state
    backward = state is not None and state.gradient_lifetime == "backward"
    comparable = measured.peak_bytes if backward else measured.activation_peak_bytes
    print(
        f"step peak ({'with' if backward else 'without'} gradients) vs predicted: "
        f"{format_bytes(comparable)} vs {format_bytes(predicted)}; whole step incl. gradients "
        f"vs eager: {format_bytes(measured.peak_bytes)} vs {format_bytes(eager.peak_bytes)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
