"""The offload runtime on a GPU: measured vs predicted memory and step time, side by side with
torch.autograd.graph.save_on_cpu and with pure-remat plans at the same budget.

For each model (planner.zoo, traced with measured op costs, links measured on this machine):
- eager store-all; eager under `save_on_cpu(pin_memory=True)` (what users have today);
- `boundary-offload`: every tensor kept across the forward/backward boundary offloaded, prefetched
  one computation ahead (planner.runtime.offload_plans);
- each registered offload planner (solvers/offload: offload-all, offload-greedy, ...) and pure-remat
  `auto` at the boundary plan's predicted peak (the same device budget).
Memory: the allocator's peak of the step above its start (gradients included). The models are
traced with gradient lifetime "backward" (gradients created in backward, as after
`zero_grad(set_to_none=True)`): the predicted peak already holds each gradient from its gradient
node on, so "pred" is the plan's predicted peak minus the graph's fixed bytes, the gradients
counted once. Time: median of timed steps after warm-up.
Needs CUDA; without it, says so and exits 1. `--cpu-accounting` runs instead what CI can check
without a GPU: on small zoo models, the boundary plans (store-all and chen-sqrt offloaded) and
every registered offload planner's plan at 0.8 of the store-all peak, with gradient parity
against eager, the measured device peak (exact storage accounting) against
the predicted one, and the host bytes against the simulator's host peak. The CPU accounting
traces with gradient lifetime "step" and leaves the gradient storages out of the measured peak
(`activation_peak_bytes`): both sides then exclude the gradients, exactly.

    .venv/bin/python benchmarks/offload_runtime_gpu.py [--quick]
    .venv/bin/python benchmarks/offload_runtime_gpu.py --cpu-accounting
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MiB = 2**20


def _models(quick: bool) -> dict[str, Any]:
    from planner import zoo

    if quick:
        return {"gpt-s": lambda: zoo.gpt(batch_size=4, context=128, dim=256, layers=2,
                                         vocab=1024, dropout=0.1)}
    return {
        "gpt-m": lambda: zoo.gpt(batch_size=8, context=512, dim=768, layers=6, vocab=8192,
                                 dropout=0.1),
        "resnet": lambda: zoo.resnet(batch_size=32, image=64, widths=(64, 128, 256), blocks=2),
    }


def _row(name: str, variant: str, measured: Any, step_ms: float, pred_bytes: int | None,
         makespan_ms: float | None, stats: Any) -> list[str]:
    def ratio(a: float, b: float | None) -> str:
        return f"{a / b:.3f}" if b else "-"

    return [
        name, variant, f"{measured.peak_bytes / MiB:.1f}",
        "-" if pred_bytes is None else f"{pred_bytes / MiB:.1f}",
        ratio(measured.peak_bytes, pred_bytes), f"{step_ms:.2f}",
        "-" if makespan_ms is None else f"{makespan_ms:.2f}", ratio(step_ms, makespan_ms),
        "-" if stats is None else f"{stats.d2h_bytes / MiB:.1f}",
        "-" if stats is None else f"{stats.h2d_bytes / MiB:.1f}",
    ]


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")


def cpu_accounting() -> int:
    """The CPU program's accounting against the simulator (see the module docstring)."""
    import warnings

    import torch

    # The "step" lifetime is chosen for the comparison (not a user's loop to warn about)
    warnings.filterwarnings("ignore", message="gradient lifetime: ")

    from planner import zoo
    from planner.core.plan import PlanStatus
    from planner.core.resources import resources_preset
    from planner.engine.offload_checks import is_offload_method
    from planner.engine.registry import BUILTIN_METHODS
    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, training_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import chen_sqrt, store_all
    from planner.tracing.api import trace

    resources = resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})
    models = {
        "mlp": lambda: zoo.mlp(batch_size=64, in_features=64, hidden=256, depth=4),
        "resnet": lambda: zoo.resnet(batch_size=4, image=16, widths=(8, 16), blocks=1),
        "gpt": lambda: zoo.gpt(batch_size=4, context=32, dim=64, layers=2, vocab=128,
                               dropout=0.1),
    }
    header = ["model", "plan", "kind", "offloads", "d2h KiB", "pred dev KiB", "meas dev KiB",
              "meas/pred", "store-all meas KiB", "host pred KiB", "host meas KiB", "parity"]
    rows: list[list[str]] = []
    for name, build in models.items():
        model, inputs = build()
        # "step": fixed bytes hold the gradients, which activation_peak_bytes leaves out
        result = trace(model, inputs, dropout_masks="graph", gradient_lifetime="step")
        graph = result.graph
        keep = store_all(graph)
        from planner.core.plan import Plan
        from planner.sim.simulator import simulate

        plain = Plan(graph_hash=graph.content_hash(), method="store-all",
                     status=PlanStatus.feasible, actions=keep,
                     predicted=simulate(graph, keep).predicted())
        kept = measure_step(training_step(apply(model, plain, inputs, trace=result), inputs),
                            model)
        candidates = [(f"{base_name}+offload", boundary_offload_plan(graph, base, resources))
                      for base_name, base in (("store-all", keep), ("chen-sqrt", chen_sqrt(graph)))]
        budget = int(0.8 * (plain.predicted.peak_bytes if plain.predicted else 0))
        for method in [m for m in BUILTIN_METHODS if is_offload_method(m)]:
            solved = solve(graph, budget, method, time_limit_s=10, resources=resources)
            if solved.status in (PlanStatus.optimal, PlanStatus.feasible):
                candidates.append((f"{method} @0.8", solved))
            else:
                rows.append([name, f"{method} @0.8", "no plan", *["-"] * 9])
        for label, plan in candidates:
            p = plan.predicted
            assert p is not None
            module = apply(model, plan, inputs, trace=result)
            model.zero_grad(set_to_none=True)
            torch.manual_seed(3)
            from planner.tracing.capture import compute_loss

            ref = compute_loss(model(*inputs))
            ref.backward()
            ref_grads = [q.grad.clone() for q in model.parameters() if q.grad is not None]
            model.zero_grad(set_to_none=True)
            torch.manual_seed(3)
            loss = module(*inputs)
            loss.backward()
            grads = [q.grad for q in model.parameters() if q.grad is not None]
            same = torch.allclose(loss, ref) and all(
                torch.allclose(a, b) for a, b in zip(grads, ref_grads, strict=True))
            measured = measure_step(training_step(module, inputs), model)
            stats = module.last_transfer_stats
            pred = p.peak_bytes - graph.fixed_bytes
            rows.append([
                name, label, str(plan.kind), str(stats.offloads),
                f"{stats.d2h_bytes / 1024:.1f}", f"{pred / 1024:.1f}",
                f"{measured.activation_peak_bytes / 1024:.1f}",
                f"{measured.activation_peak_bytes / pred:.3f}",
                f"{kept.activation_peak_bytes / 1024:.1f}",
                f"{(p.host_peak_bytes or 0) / 1024:.1f}", f"{stats.host_peak_bytes / 1024:.1f}",
                "yes" if same else "NO",
            ])
    print(f"CPU program, torch {torch.__version__}; device bytes: exact storage accounting "
          "(gradients left out), host bytes: the runtime's host pool\n")
    _table(header, rows)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small model")
    parser.add_argument("--time-limit", type=float, default=20.0, help="per planner solve, s")
    parser.add_argument("--cpu-accounting", action="store_true",
                        help="the CPU program's memory accounting instead (no GPU needed)")
    args = parser.parse_args()
    if args.cpu_accounting:
        return cpu_accounting()
    import torch

    if not torch.cuda.is_available():
        print("offload_runtime_gpu: no CUDA device here; this benchmark measures the runtime on a "
              "GPU (the CPU path is tested by tests/runtime/test_runtime_offload.py)",
              file=sys.stderr)
        return 1
    from planner.core.plan import PlanStatus
    from planner.engine.offload_checks import is_offload_method
    from planner.engine.registry import BUILTIN_METHODS
    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.runtime.measure import measure_step, time_steps, training_step
    from planner.runtime.offload_measure import measured_resources, save_on_cpu_step
    from planner.runtime.offload_plans import boundary_offload_plan
    from planner.solvers.baselines import store_all
    from planner.tracing.api import trace

    resources = measured_resources("cuda")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"links measured: h2d {resources.h2d}, d2h {resources.d2h}\n")
    header = ["model", "variant", "peak MiB", "pred MiB", "meas/pred", "step ms", "pred ms",
              "meas/pred", "d2h MiB", "h2d MiB"]
    rows: list[list[str]] = []

    def timed(step: Any, model: Any) -> tuple[Any, float]:
        def clean_step() -> Any:  # as a training loop: gradients released before each step
            model.zero_grad(set_to_none=True)
            return step()

        for _ in range(2):  # warm-up: cuBLAS workspaces, pinned pools, first-call caches
            clean_step()
        mem = measure_step(step, model, "cuda")
        return mem, time_steps(clean_step, warmup=2, repeats=7, cuda=True)

    for name, build in _models(args.quick).items():
        model, inputs = build()
        model = model.cuda()
        inputs = tuple(x.cuda() for x in inputs)
        result = trace(model, inputs, costs="measure", dropout_masks="graph",
                       gradient_lifetime="backward")
        graph = result.graph

        mem, ms = timed(training_step(model, inputs), model)
        rows.append(_row(name, "eager", mem, ms, None, graph.total_compute_ms, None))
        mem, ms = timed(save_on_cpu_step(model, inputs), model)
        rows.append(_row(name, "save_on_cpu", mem, ms, None, None, None))
        boundary = boundary_offload_plan(graph, store_all(graph), resources, min_bytes=2**16)
        assert boundary.predicted is not None
        plans = [("boundary-offload", boundary)]
        budget = boundary.predicted.peak_bytes
        offload_methods = [m for m in BUILTIN_METHODS if is_offload_method(m)]
        for method in [*offload_methods, "auto"]:
            plan = solve(graph, budget, method, time_limit_s=args.time_limit,
                         resources=resources)
            if plan.status in (PlanStatus.optimal, PlanStatus.feasible):
                plans.append((method, plan))
            else:
                rows.append([name, method, "no plan", "-", "-", "-", "-", "-", "-", "-"])
        for variant, plan in plans:
            module = apply(model, plan, inputs, trace=result)
            step = training_step(module, inputs)
            mem, ms = timed(step, model)
            p = plan.predicted
            assert p is not None
            pred = p.peak_bytes - graph.fixed_bytes  # lifetime "backward": gradients inside
            rows.append(_row(name, variant, mem, ms, pred, p.makespan_ms or p.compute_cost,
                             getattr(module, "last_transfer_stats", None)))
        del model, inputs, result
        torch.cuda.empty_cache()
    _table(header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
