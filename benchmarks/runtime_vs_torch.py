"""Step time at matched measured activation memory: eager, checkpoint, torch.compile, runtime.

For a GPT-style decoder and a ResNet-style CNN (planner.zoo), on CPU (or CUDA with --device):
- eager store-all;
- `torch.utils.checkpoint` (non-reentrant) on every block (GPT: `h.*`, ResNet: `layers.*`);
- `torch.compile` with `torch._functorch.config.activation_memory_budget` at several levels.
  Backend `aot_eager_decomp_partition_with_mode` (inductor's decompositions and min-cut
  partitioner, which reads the budget; the graphs run op by op, so the memory accounting sees
  their allocations through a relay mode, and times compare like with like: no kernel fusion);
- this runtime (`planner.runtime.apply`) with the `auto` plan at budgets whose predicted activation
  memory matches what each of the above measured.
Memory: bytes the step allocates, gradients left out ("act"), and with them ("total"), measured
by exact live-storage accounting on CPU (allocator peak on CUDA). Time: steps timed without the
accounting, alternating with eager steps; the minimum of each (see `measure`).
Writes the table to docs/runtime_benchmark.md.

    .venv/bin/python benchmarks/runtime_vs_torch.py [--quick] [--time-limit 15]
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results import write_page  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.budget import format_bytes  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.runtime.measure import (  # noqa: E402
    TrackerRelay,
    measure_step,
    time_steps,
    training_step,
)
from planner.tracing.api import trace  # noqa: E402


@dataclass
class Row:
    model: str
    method: str
    setting: str
    act_bytes: int
    total_bytes: int
    step_ms: float
    eager_ms: float  # eager step timed alternately with this one
    predicted_act_bytes: int | None = None
    budget_act_bytes: int | None = None
    note: str = ""


def models(quick: bool) -> dict[str, tuple[nn.Module, tuple[Any, ...], str]]:
    if quick:
        gpt = zoo.gpt(batch_size=4, context=32, dim=64, layers=2, vocab=256, dropout=0.1)
        cnn = zoo.resnet(batch_size=4, image=16, widths=(8, 16), blocks=1)
    else:
        gpt = zoo.gpt(batch_size=8, context=64, dim=128, layers=4, vocab=512, dropout=0.1)
        cnn = zoo.resnet(batch_size=8, image=32, widths=(16, 32, 64), blocks=2)
    return {"gpt": (*gpt, "h"), "resnet": (*cnn, "layers")}


def blocks_of(model: nn.Module, container: str) -> list[nn.Module]:
    return list(getattr(model, container).children())


class CheckpointEveryBlock:
    """torch.utils.checkpoint(use_reentrant=False) around each block while active."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        self.blocks = blocks

    def __enter__(self) -> None:
        for b in self.blocks:
            original = b.forward
            b.forward = (
                lambda *a, _f=original, **k: checkpoint(_f, *a, use_reentrant=False, **k)
            )

    def __exit__(self, *_: Any) -> None:
        for b in self.blocks:
            b.__dict__.pop("forward", None)


def measure(model: nn.Module, step_module: Any, inputs: tuple[Any, ...], device: torch.device,
            repeats: int, relay: TrackerRelay | None = None) -> tuple[int, int, float, float]:
    """Measured act and total peak; step ms of this step and of eager, timed alternately.

    Alternating with eager and keeping each one's minimum makes the ratio robust on a shared
    machine: interference only ever adds time, and it hits both sides alike.
    """
    step = training_step(step_module, inputs)
    m = measure_step(step, model, device, relay=relay)
    eager = training_step(model, inputs)
    cuda = device.type == "cuda"
    mine: list[float] = []
    ref: list[float] = []
    for _ in range(repeats):
        ref.append(time_steps(eager, warmup=0, repeats=1, cuda=cuda))
        mine.append(time_steps(step, warmup=0, repeats=1, cuda=cuda))
    model.zero_grad(set_to_none=True)
    return m.activation_peak_bytes, m.peak_bytes, min(mine), min(ref)


def run_model(name: str, model: nn.Module, inputs: tuple[Any, ...], container: str,
              args: argparse.Namespace, device: torch.device) -> list[Row]:
    rows: list[Row] = []
    act, total, ms, ref = measure(model, model, inputs, device, args.repeats)
    rows.append(Row(name, "eager", "store-all", act, total, ms, ref))
    targets: list[tuple[str, int]] = []
    with CheckpointEveryBlock(blocks_of(model, container)):
        act, total, ms, ref = measure(model, model, inputs, device, args.repeats)
    rows.append(Row(name, "checkpoint", "every block", act, total, ms, ref))
    targets.append(("= checkpoint", act))
    for budget in args.compile_budgets:
        import torch._dynamo
        import torch._functorch.config as fconfig
        from torch._dynamo.backends.debugging import aot_eager_decomp_partition_with_mode

        torch._dynamo.reset()
        relay = TrackerRelay()
        backend = functools.partial(aot_eager_decomp_partition_with_mode, mode=relay)
        with fconfig.patch(activation_memory_budget=budget):
            compiled = cast(nn.Module, torch.compile(model, backend=backend))
            started = time.perf_counter()
            training_step(compiled, inputs)()  # compiles
            compile_s = time.perf_counter() - started
            act, total, ms, ref = measure(model, compiled, inputs, device, args.repeats, relay)
        rows.append(Row(name, "torch.compile", f"budget {budget}", act, total, ms, ref,
                        note=f"compile {compile_s:.1f} s"))
        targets.append((f"= compile {budget}", act))
    torch._dynamo.reset()
    traced = trace(model, inputs, dropout_masks="graph")  # sized as the runtime runs
    graph = traced.graph
    for label, target_act in targets:
        budget = graph.fixed_bytes + target_act
        started = time.perf_counter()
        plan = solve(graph, budget, "auto", time_limit_s=args.time_limit)
        solve_s = time.perf_counter() - started
        if plan.status.value not in ("optimal", "feasible") or plan.predicted is None:
            smallest = plan.details.get("smallest_feasible_bytes")
            rows.append(Row(name, "runtime auto", label, 0, 0, float("nan"), float("nan"),
                            budget_act_bytes=target_act,
                            note=f"no plan ({plan.status.value}; smallest "
                            f"{format_bytes((smallest or 0) - graph.fixed_bytes)} act)"))
            continue
        module = apply(model, plan, inputs, trace=traced)
        act, total, ms, ref = measure(model, module, inputs, device, args.repeats)
        rows.append(Row(
            name, "runtime auto", label, act, total, ms, ref,
            predicted_act_bytes=plan.predicted.peak_bytes - graph.fixed_bytes,
            budget_act_bytes=target_act,
            note=f"{plan.backend}, solve {solve_s:.1f} s, sim overhead "
            f"{100 * plan.predicted.overhead:+.1f}%",
        ))
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| model | method | setting | act peak | total peak | predicted act | step ms | "
        "eager ms | vs eager | notes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        overhead = (r.step_ms / r.eager_ms - 1) * 100 if r.step_ms == r.step_ms else None
        fits = ""
        if r.budget_act_bytes is not None and r.act_bytes:
            excess = 100 * (r.act_bytes / r.budget_act_bytes - 1)
            fits = " (within target)" if excess <= 0 else f" (target {excess:+.1f}%)"
        if r.predicted_act_bytes:
            fits += f", {r.act_bytes / r.predicted_act_bytes:.3f}× predicted"
        lines.append(
            f"| {r.model} | {r.method} | {r.setting} | {format_bytes(r.act_bytes)}{fits} | "
            f"{format_bytes(r.total_bytes)} | {format_bytes(r.predicted_act_bytes)} | "
            f"{r.step_ms:.1f} | {r.eager_ms:.1f} | "
            f"{'' if overhead is None else f'{overhead:+.0f}%'} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller models")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--time-limit", type=float, default=15.0, help="solver seconds per plan")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile-budgets", type=float, nargs="*", default=[0.5, 0.1])
    parser.add_argument("--out", default=str(REPO / "docs" / "runtime_benchmark.md"))
    parser.add_argument("--models", nargs="*", default=["gpt", "resnet"])
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (CPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    for name, (model, inputs, container) in models(args.quick).items():
        if name not in args.models:
            continue
        model = model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        rows.extend(run_model(name, model, inputs, container, args, device))
        print(table([r for r in rows if r.model == name]), flush=True)
    text = table(rows)
    header = (
        "# Runtime vs PyTorch at matched activation memory\n\n"
        f"`benchmarks/runtime_vs_torch.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" on {device.type} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}).\n\n"
        "act peak: bytes the step allocated at its most, gradients left out (the quantity the "
        "plan's prediction counts); total: with gradients. 'target' compares the runtime's "
        "measured act peak with the activation memory it was asked to match (its budget = "
        "fixed memory + that target); '× predicted' with the plan's own prediction. Step "
        "times: minimum over steps timed alternately with eager steps (eager ms), on a shared "
        "machine; 'vs eager' is their ratio.\n\n"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_page(Path(args.out), header + text + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
