"""Planner compiled against torch.compile's own memory modes, side by side (issue 26, item 4).

One small GPT (planner.zoo.gpt, no dropout: gradients compare exactly), one row per way of
running its training step (forward, loss, backward):
- eager; torch.compile (inductor) default; inductor at `activation_memory_budget` levels with
  each knapsack solver (`activation_memory_budget_solver`: dp, ilp; ilp needs scipy);
- what users write by hand, compiled: torch.utils.checkpoint around every block, torchtitan's
  op-level selective policy (save matmul outputs; and every other matmul) — and the same
  policies as Planner plans them (methods checkpoint-blocks, selective-matmul) through
  planner.runtime.compile;
- torch's per-module SAC MILP (torch.distributed._tools.sac_ilp), where it can run;
- Planner op by op (`auto` + planner.runtime.apply) and Planner compiled (`sac` +
  planner.runtime.compile) at each memory level inductor's budget mode reached: the plan's
  budget is what resides before the step plus the peak that row measured.

Peak: bytes the step allocated at its most above what resides before it (parameters, inputs;
gradients are set to None first, so they count). On CPU from torch.profiler's allocation
records (every CPU allocation, inductor's buffers included: `measure_step`'s dispatch-mode
accounting cannot see inductor's kernels, and TorchDynamo runs frames eagerly under such a
mode), on CUDA the allocator's peak. Step ms: median of steps timed alternately with eager
steps. Compile s: the first step (inductor's kernel cache is a fresh directory per run, so a
row may reuse kernels an earlier row compiled). Gradients: the largest per-parameter
max|g - g_eager| / max|g_eager| (inductor's tolerance: 1e-4).

    .venv/bin/python benchmarks/compiled_vs_torch.py [--quick] [--write-docs] [--device cuda]

--backend aot_eager_decomp_partition runs every row without code generation (tests).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from results import machine, write_sections  # noqa: E402

from planner import zoo  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.runtime.compiled import compile as compile_plan  # noqa: E402
from planner.runtime.measure import time_steps, training_step  # noqa: E402
from planner.sim.step_memory import step_memory  # noqa: E402
from planner.solvers.handwritten import is_matmul  # noqa: E402
from planner.tracing.allocator_events import measure_allocator_peak  # noqa: E402
from planner.tracing.api import trace  # noqa: E402

MIB = 2**20
GRAD_TOLERANCE = 1e-4  # relative, as inductor's own accuracy checks against eager
SIZES = {  # zoo.gpt keywords; each compile <= 60 s on 2 cores
    "full": {"batch_size": 8, "context": 128, "dim": 128, "layers": 2, "vocab": 512},
    "quick": {"batch_size": 4, "context": 64, "dim": 64, "layers": 1, "vocab": 256},
    "tiny": {"batch_size": 2, "context": 8, "dim": 16, "layers": 2, "vocab": 32},
}


@dataclass
class Row:
    method: str
    budget: str = ""  # the memory setting, where one applies
    peak_bytes: int | None = None
    step_ms: float | None = None
    eager_ms: float | None = None  # eager steps timed alternately with this row's
    compile_s: float | None = None
    grad_diff: float | None = None
    predicted_bytes: int | None = None  # the plan's predicted peak above the start
    level: str = ""  # the inductor budget row this one is matched to
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.step_ms is None or not self.eager_ms:
            return None
        return self.step_ms / self.eager_ms


@dataclass
class Bench:
    model: nn.Module
    inputs: tuple[Any, ...]
    device: torch.device
    backend: str
    repeats: int
    time_limit_s: float
    eager_grads: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def peak_bytes(self, step: Callable[[], Any]) -> int:
        """Bytes allocated by one step at its most, above what resided before it."""
        self.model.zero_grad(set_to_none=True)
        return measure_allocator_peak(step, self.device).peak_bytes

    def grads(self, step: Callable[[], Any]) -> dict[str, torch.Tensor]:
        self.model.zero_grad(set_to_none=True)
        step()
        out = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()
               if p.grad is not None}
        self.model.zero_grad(set_to_none=True)
        return out

    def grad_diff(self, step: Callable[[], Any]) -> float:
        got = self.grads(step)
        if got.keys() != self.eager_grads.keys():
            return math.inf
        return max(float((got[n] - g).abs().max() / g.abs().max().clamp_min(1e-12))
                   for n, g in self.eager_grads.items())

    def timed(self, step: Callable[[], Any]) -> tuple[float, float]:
        """Median ms of `step` and of eager, alternately (interference hits both alike); each
        step starts with gradients set to None, as the plans assume."""
        eager = training_step(self.model, self.inputs)

        def fresh(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                self.model.zero_grad(set_to_none=True)
                return fn()

            return run

        mine, ref = [], []
        for _ in range(self.repeats):
            ref.append(time_steps(fresh(eager), warmup=0, repeats=1, cuda=self.cuda))
            mine.append(time_steps(fresh(step), warmup=0, repeats=1, cuda=self.cuda))
        self.model.zero_grad(set_to_none=True)
        return statistics.median(mine), statistics.median(ref)

    def measure(self, row: Row, make: Callable[[], Any],
                context: Callable[[], Any] = contextlib.nullcontext) -> Row:
        """Fill `row` from the module `make()` builds (compiled on its first step), with
        `context` active while it compiles and runs; a failure becomes the row's note."""
        torch._dynamo.reset()
        try:
            with context():
                module = make()
                step = training_step(module, self.inputs)
                started = time.perf_counter()
                self.grads(step)  # the first step compiles
                row.compile_s = time.perf_counter() - started
                row.grad_diff = self.grad_diff(step)
                row.peak_bytes = self.peak_bytes(step)
                row.step_ms, row.eager_ms = self.timed(step)
        except Exception as e:  # one row's failure must not end a long run
            row.note = (row.note + "; " if row.note else "") + one_line(e)
        print(line(row), flush=True)
        return row


def one_line(e: BaseException) -> str:
    """The innermost cause, in one line (a backend's failure wraps the real one)."""
    while True:
        inner = e.__cause__ or getattr(e, "inner_exception", None)
        if not isinstance(inner, BaseException) or inner is e:
            break
        e = inner
    text = [t for t in str(e).strip().splitlines() if t.strip()]
    return f"failed: {type(e).__name__}: {text[0][:200] if text else ''}"


class WrapBlocks:
    """Each block's forward under torch.utils.checkpoint (non-reentrant) while active."""

    def __init__(self, blocks: list[nn.Module], context_fn: Any = None) -> None:
        self.blocks, self.context_fn = blocks, context_fn

    def __enter__(self) -> None:
        extra = {} if self.context_fn is None else {"context_fn": self.context_fn}
        for b in self.blocks:
            b.forward = functools.partial(_checkpointed, b.forward, extra)

    def __exit__(self, *_: Any) -> None:
        for b in self.blocks:
            b.__dict__.pop("forward", None)


def _checkpointed(forward: Any, extra: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)


class MatmulPolicy:
    """torchtitan's op-level SAC policy: save matmul outputs (attention kernels included),
    recompute the rest; `every_other` saves only the 1st, 3rd, ... matmul of the block."""

    def __init__(self, every_other: bool) -> None:
        self.every_other = every_other
        self.count = {False: 0, True: 0}  # matmuls seen, in the forward and in recomputation

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        name = str(func)
        if not is_matmul(name):
            return CheckpointPolicy.PREFER_RECOMPUTE
        if name.startswith("aten._scaled_dot_product") or not self.every_other:
            return CheckpointPolicy.MUST_SAVE
        key = bool(ctx.is_recompute)
        self.count[key] += 1
        return (CheckpointPolicy.MUST_SAVE if self.count[key] % 2 == 1
                else CheckpointPolicy.PREFER_RECOMPUTE)


def _selective_contexts(every_other: bool) -> Any:
    # A module-level function under functools.partial: dynamo accepts no closure as context_fn.
    return create_selective_checkpoint_contexts(MatmulPolicy(every_other))


def inductor_budget(budget: float, solver: str) -> Any:
    import torch._functorch.config as fconfig

    return fconfig.patch(activation_memory_budget=budget, activation_memory_budget_solver=solver)


def torch_rows(bench: Bench, levels: list[float], solvers: list[str]) -> list[Row]:
    model, backend = bench.model, bench.backend

    def compiled() -> Any:
        return torch.compile(model, backend=backend)

    rows = [bench.measure(Row("inductor default"), compiled)]
    for level in levels:
        for solver in solvers:
            rows.append(bench.measure(Row("inductor budget", f"{level} ({solver})"), compiled,
                                      functools.partial(inductor_budget, level, solver)))
    blocks = list(model.h.children())  # type: ignore[union-attr]
    hand = {
        "torch checkpoint every block": None,
        "torchtitan selective (save matmuls)": functools.partial(_selective_contexts, False),
        "torchtitan selective (every other matmul)": functools.partial(_selective_contexts,
                                                                       True),
    }
    for name, context_fn in hand.items():
        rows.append(bench.measure(Row(name), compiled,
                                  functools.partial(WrapBlocks, blocks, context_fn)))
    rows.append(Row("torch per-module SAC MILP (sac_ilp)", note=sac_ilp_reason(bench)))
    print(line(rows[-1]), flush=True)
    return rows


def sac_ilp_reason(bench: Bench) -> str:
    """Why torch.distributed._tools.sac_ilp has no row here (one line)."""
    try:
        import torch.distributed._tools.sac_ilp  # noqa: F401
    except ImportError as e:
        return f"not run: {one_line(e).removeprefix('failed: ')}"
    if not bench.cuda:
        return ("not run: its op cost estimators need CUDA (operator-level-benchmark times ops "
                "with CUDA events, operator-level-cost-model asserts a CUDA device)")
    return ("not run: its statistics (MemTracker, RuntimeEstimator, SACEstimator under "
            "FakeTensorMode) are not wired into this benchmark yet")


def planner_rows(bench: Bench, torch_rows_: list[Row]) -> list[Row]:
    """Planner's hand-written plans compiled, then Planner op by op and compiled at the peak
    of each inductor budget row."""
    model, inputs, backend = bench.model, bench.inputs, bench.backend
    traced = trace(model, inputs, dropout_masks="graph")
    graph = traced.graph
    start = step_memory(graph).start_bytes
    rows: list[Row] = []

    def compiled_plan(plan: Any) -> Callable[[], Any]:
        return lambda: compile_plan(model, plan, inputs, trace=traced, project=True,
                                    backend=backend)

    unlimited = 10**15
    hand = {"checkpoint-blocks": {}, "selective-matmul": {},
            "selective-matmul (every other)": {"every_other": True}}
    for name, options in hand.items():
        plan = solve(graph, unlimited, name.split(" ")[0], options=options,
                     time_limit_s=bench.time_limit_s)
        row = Row(f"Planner compiled, {name} plan")
        rows.append(_planned(bench, row, plan, start, compiled_plan(plan)))
    seen: dict[int, str] = {}
    for ref in torch_rows_:
        if ref.method != "inductor budget" or ref.peak_bytes is None:
            continue
        if ref.peak_bytes in seen:  # the same memory as an earlier level: same plans
            continue
        seen[ref.peak_bytes] = ref.budget
        budget = start + ref.peak_bytes
        setting = f"≤ {ref.peak_bytes / MIB:.2f} MiB"
        for method, label in (("auto", "Planner op-by-op (auto)"), ("sac", "Planner compiled")):
            began = time.perf_counter()
            plan = solve(graph, budget, method, time_limit_s=bench.time_limit_s)
            row = Row(label, setting, level=ref.budget,
                      note=f"solve {time.perf_counter() - began:.1f} s")
            make: Callable[[], Any] = (
                functools.partial(apply, model, plan, inputs, trace=traced) if method == "auto"
                else compiled_plan(plan))
            rows.append(_planned(bench, row, plan, start, make))
    return rows


def _planned(bench: Bench, row: Row, plan: Any, start: int, make: Callable[[], Any]) -> Row:
    if plan.status.value not in ("optimal", "feasible") or plan.predicted is None:
        row.note = (row.note + "; " if row.note else "") + f"no plan ({plan.status.value})"
        print(line(row), flush=True)
        return row
    row.predicted_bytes = plan.predicted.peak_bytes - start
    row = bench.measure(row, make)
    return row


def mib(n: int | None) -> str:
    return "" if n is None else f"{n / MIB:.2f}"


def line(r: Row) -> str:
    ratio = r.ratio
    cells = [r.method, r.budget, mib(r.peak_bytes),
             "" if r.peak_bytes is None else str(r.peak_bytes), mib(r.predicted_bytes),
             "" if r.step_ms is None else f"{r.step_ms:.1f}",
             "" if r.eager_ms is None else f"{r.eager_ms:.1f}",
             "" if ratio is None else f"{ratio:.2f}×",
             "" if r.compile_s is None else f"{r.compile_s:.1f}",
             "" if r.grad_diff is None else
             f"{r.grad_diff:.1e} {'ok' if r.grad_diff <= GRAD_TOLERANCE else 'OVER'}",
             r.note]
    return "| " + " | ".join(cells) + " |"


HEADER = ["| method | budget | peak MiB | peak bytes | predicted MiB | step ms | eager ms | "
          "vs eager | compile s | grad diff | notes |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]


def verdict(rows: list[Row]) -> list[str]:
    """At each inductor budget row's peak: does Planner compiled fit it, and how fast."""
    out = []
    for ref in rows:
        if ref.method != "inductor budget" or ref.peak_bytes is None:
            continue
        ours = next((r for r in rows if r.method == "Planner compiled" and r.budget ==
                     f"≤ {ref.peak_bytes / MIB:.2f} MiB"), None)
        if ours is None or ours.peak_bytes is None or ours.step_ms is None:
            why = "no row" if ours is None else ours.note or "not measured"
            out.append(f"- inductor {ref.budget}: {mib(ref.peak_bytes)} MiB; Planner compiled: "
                       f"{why}")
            continue
        fits = "fits" if ours.peak_bytes <= ref.peak_bytes else "EXCEEDS it"
        speed = ("" if ref.step_ms is None or ref.ratio is None or ours.ratio is None else
                 f"; step {ours.step_ms:.1f} ms against inductor's {ref.step_ms:.1f} ms "
                 f"({ours.ratio / ref.ratio:.2f}× inductor's, by ratios to eager)")
        out.append(f"- inductor {ref.budget}: {mib(ref.peak_bytes)} MiB; Planner compiled "
                   f"{mib(ours.peak_bytes)} MiB, {fits}{speed}")
    return out


def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    device = torch.device(args.device)
    size = SIZES["tiny" if args.tiny else "quick" if args.quick else "full"]
    model, inputs = zoo.gpt(**size, dropout=0.0)
    model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    bench = Bench(model, inputs, device, args.backend, args.repeats, args.time_limit)
    eager = training_step(model, inputs)
    bench.eager_grads = bench.grads(eager)
    first = Row("eager", compile_s=0.0, grad_diff=0.0, peak_bytes=bench.peak_bytes(eager))
    first.step_ms, first.eager_ms = bench.timed(eager)
    print("\n".join(HEADER) + "\n" + line(first), flush=True)
    rows = [first, *torch_rows(bench, args.levels, args.solvers)]
    if not args.no_planner:
        rows += planner_rows(bench, rows)
    return rows, size


@contextlib.contextmanager
def inductor_cache() -> Iterator[str]:
    """A fresh kernel cache for the run (unless TORCHINDUCTOR_CACHE_DIR is set)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield os.environ["TORCHINDUCTOR_CACHE_DIR"]
        return
    with tempfile.TemporaryDirectory(prefix="inductor-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        try:
            yield tmp
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller GPT, levels 0.5 and 0.2")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests
    parser.add_argument("--write-docs", action="store_true",
                        help="write docs/compiled_vs_torch.md (CPU) or its GPU twin")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--levels", type=float, nargs="+", default=None)
    parser.add_argument("--solvers", nargs="+", default=["dp", "ilp"])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per row")
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds per plan")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (CPU)")
    parser.add_argument("--no-planner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.levels is None:
        args.levels = [0.5, 0.2] if args.quick or args.tiny else [0.8, 0.5, 0.2, 0.1]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with inductor_cache():
        rows, size = run(args)
    minutes = (time.perf_counter() - started) / 60
    table = [*HEADER, *(line(r) for r in rows)]
    print("\n" + "\n".join(verdict(rows)) + f"\n\n({minutes:.1f} minutes)")
    if args.write_docs:
        gpu = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else ""
        name = "compiled_vs_torch_gpu.md" if gpu else "compiled_vs_torch.md"
        where = gpu or f"CPU, {torch.get_num_threads()} intra-op thread(s)"
        command = " ".join(["benchmarks/compiled_vs_torch.py",
                            *(argv if argv is not None else sys.argv[1:])])
        ran = (f"`{command}` on {date.today().isoformat()}: {where}; machine: {machine()}; "
               f"torch {torch.__version__}, backend {args.backend}; GPT {size}, fp32; "
               f"{minutes:.0f} minutes.")
        path = REPO / "docs" / name
        write_sections(path, {"summary": ["Verdict at inductor's levels:", "", *verdict(rows),
                                          "", ran],
                              "measured": [ran, "", *table]},
                       title="Planner compiled against torch.compile")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
