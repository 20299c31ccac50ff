"""Which per-op cost model predicts a planned step's time on this GPU (a diagnostic for
benchmarks/gpu_fidelity.py's step/pred column).

For each model: the joint graph's ops timed three ways — kernels only (the device sleeps while
the op is queued), CPU dispatch only, and CUDA events around the fx interpreter's calls (kernels
plus launch gaps, the old measurement) — then the store-all, chen-sqrt and recompute-all plans
simulated under each and set against their measured steps. Also gradient parity of ResNet with
cuDNN's TF32 on and off. Prints one table; `python benchmarks/gpu/cost_probe.py [--quick]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from planner import zoo
from planner.core.graph import Graph
from planner.engine.solve import solve
from planner.runtime.apply import apply
from planner.runtime.measure import time_steps, training_step
from planner.sim.simulator import simulate
from planner.tracing import costs
from planner.tracing.api import trace


class _Split(costs._Timer):
    """The benchmark's timer, keeping kernel time and dispatch time apart."""

    def __init__(self, device: torch.device, gaps: bool) -> None:
        super().__init__(device)
        self.gaps = gaps  # old measurement: events around the call, no idle device first
        self.kernel: dict[str, float] = {}
        self.dispatch: dict[str, float] = {}

    def run(self, key: str, fn: Any) -> Any:
        if not self.cuda:
            return super().run(key, fn)
        if not self.gaps:
            return self._run_cuda(key, fn)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        self.pending.append((key, start, end, 0.0))
        return out

    def collect(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            for key, start, end, dispatch_ms in self.pending:
                self.kernel[key] = self.kernel.get(key, 0.0) + start.elapsed_time(end)
                self.dispatch[key] = self.dispatch.get(key, 0.0) + dispatch_ms
        return super().collect()


def op_costs(result: Any, args: list[Any], gaps: bool,
             runs: int = 4) -> dict[str, dict[str, float]]:
    """fx name -> median ms, per cost model (kernel, dispatch, max, gaps)."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    samples: dict[str, dict[str, list[float]]] = {}
    timer = _Split(device, gaps)
    with torch.no_grad():
        for i in range(runs):
            timer.kernel, timer.dispatch = {}, {}
            costs._TimingInterpreter(result.capture.gm, timer, None).run(
                *args, enable_io_processing=False)
            wall = timer.collect()
            if not timer.cuda:  # CPU smoke run: the clock's times stand for kernels
                timer.kernel = wall
            if i == 0:
                continue
            for name, ms in timer.kernel.items():
                d = timer.dispatch.get(name, 0.0)
                row = {"gaps": ms} if gaps else {"kernel": ms, "dispatch": d, "max": max(ms, d)}
                for model, v in row.items():
                    samples.setdefault(model, {}).setdefault(name, []).append(v)
    return {m: {k: statistics.median(v) for k, v in per.items()} for m, per in samples.items()}


def graph_with(graph: Graph, result: Any, fx_ms: dict[str, float]) -> Graph:
    data = graph.model_dump()
    for node in data["nodes"]:
        node["compute_ms"] = sum(fx_ms.get(m, 0.0) for m in result.node_fx_names[node["id"]])
    return Graph.model_validate(data)


def probe(name: str, model: Any, inputs: tuple[Any, ...], autocast: str | None) -> None:
    kwargs: dict[str, Any] = dict(costs="measure", dropout_masks="graph",
                                  gradient_lifetime="backward")
    if autocast:
        kwargs["autocast"] = autocast
    t0 = time.perf_counter()
    result = trace(model, inputs, **kwargs)
    args = costs.joint_arguments(result.capture, model, inputs)
    models = {**op_costs(result, args, gaps=False), **op_costs(result, args, gaps=True)}
    graph = result.graph
    for method in ("store-all", "chen-sqrt", "recompute-all"):
        plan = solve(graph, 10**15, method)
        module = apply(model, plan, inputs, trace=result)
        cuda = args[0].device.type == "cuda"
        step_ms = time_steps(training_step(module, inputs), warmup=2, repeats=5, cuda=cuda)
        cells = []
        for m, fx_ms in models.items():
            pred = simulate(graph_with(graph, result, fx_ms), plan.actions, check_hash=False)
            figures = pred.predicted()
            ms = figures.makespan_ms or figures.compute_cost
            cells.append(f"{m} {ms:8.2f} ({step_ms / ms if ms else 0:.3f})")
        print(f"| {name:8} | {method:13} | {step_ms:8.2f} | " + " | ".join(cells) + " |",
              flush=True)
    print(f"  {name}: {len(graph.nodes)} nodes, {time.perf_counter() - t0:.1f} s", flush=True)


def tf32_parity(model: Any, inputs: tuple[Any, ...]) -> None:
    from planner.tracing.capture import compute_loss

    for allow in (True, False):
        torch.backends.cudnn.allow_tf32 = allow
        result = trace(model, inputs, dropout_masks="graph", gradient_lifetime="backward")
        plan = solve(result.graph, 10**15, "recompute-all")
        module = apply(model, plan, inputs, trace=result)
        grads = []
        for step in (lambda: compute_loss(model(*inputs)), lambda m=module: m(*inputs)):
            model.zero_grad(set_to_none=True)
            step().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        diff = max((grads[0][n] - grads[1][n]).abs().max().item() for n in grads[0])
        scale = max(g.abs().max().item() for g in grads[0].values())
        print(f"  resnet cudnn.allow_tf32={allow}: max grad diff {diff:.3g} of {scale:.3g}")
    torch.backends.cudnn.allow_tf32 = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models (a CPU smoke run)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")  # the probe's steps keep .grad: the lifetime check says so
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        gpt = dict(batch_size=2, context=16, dim=32, layers=1, vocab=64, dropout=0.1)
        res = dict(batch_size=4, image=16, widths=(8, 16), blocks=1)
    else:  # benchmarks/gpu_fidelity.py's CUDA sizes
        gpt = dict(batch_size=8, context=512, dim=768, layers=6, vocab=8192, dropout=0.1)
        res = dict(batch_size=32, image=64, widths=(64, 128, 256), blocks=2)
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch "
          f"{torch.__version__}\n| model | plan | meas ms | predicted ms (meas/pred) per cost "
          "model |", flush=True)
    cases: list[tuple[str, Callable[..., Any], dict[str, Any], str | None]] = [
        ("resnet", zoo.resnet, res, None), ("gpt-bf16", zoo.gpt, gpt, "bf16"),
        ("gpt", zoo.gpt, gpt, None)]
    for name, make, kw, autocast in cases:
        model, inputs = make(**kw)
        model = model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        if name == "resnet" and device == "cuda":
            tf32_parity(model, inputs)
        probe(name, model, inputs, autocast)
    return 0


if __name__ == "__main__":
    sys.exit(main())
