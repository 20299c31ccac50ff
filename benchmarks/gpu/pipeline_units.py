"""Unit policies on one device (CUDA where there is one): a GPT as one pipeline stage whose blocks
keep, recompute (checkpoint) or offload (saved tensors to pinned host memory) their activations,
as planner.runtime.pipeline runs them. Prints, per policy mix, the step's peak above its start,
the host bytes, the largest gradient difference from the plain step, and the step's time
(median of --repeats after a warm-up): with every block offloaded, the time added over the
plain step against the simulator's rule (planner.sim.unit_times: each copy, out in the forward
and back in the backward, holds the stage's stream; at the PCIe Gen5 preset's 50 GB/s, the
copies' latency left out).

    python3 benchmarks/gpu/pipeline_units.py [--device cuda] [--layers 8] [--dim 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.pipeline_actions import Partition  # noqa: E402
from planner.core.pipeline_actions import PipelineStage as StageSpec  # noqa: E402
from planner.runtime.pipeline_split import split_model  # noqa: E402
from planner.runtime.pipeline_stage import StageModule  # noqa: E402
from planner.runtime.pipeline_units import (  # noqa: E402
    HostMemory,
    UnitSwitch,
    apply_unit_policies,
    check_unit_policies,
)


def gpt(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """The GPT of `args` (gpt_arguments) and its inputs on args.device, seeded."""
    torch.manual_seed(0)
    model, inputs = zoo.gpt(batch_size=args.batch, context=args.context, dim=args.dim,
                            layers=args.layers, vocab=args.vocab, dropout=0.0)
    device = torch.device(args.device)
    return model.to(device), tuple(x.to(device) for x in inputs)


def gpt_arguments(ap: argparse.ArgumentParser, repeats: int) -> None:
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=repeats, help="timed steps after warm-up")


def unit_stage(model: Any, inputs: tuple[Any, ...],
               policies: dict[str, Any]) -> tuple[StageModule, HostMemory]:
    """The whole model as one pipeline stage under the unit runtime's `policies`."""
    mods = ["tok", "pos", *[f"h.{i}" for i in range(len(model.h))], "ln_f", "head"]
    spec = StageSpec(stage_index=0, rank=0, modules=mods, unit_policies=policies)
    split = split_model(model, Partition(stages=[spec]), inputs)
    host, switch = HostMemory(), UnitSwitch()
    apply_unit_policies(split.stages[0].module, check_unit_policies(spec), switch, host)
    return StageModule(split.stages[0], frozenset(), switch), host


def step(args: argparse.Namespace, policies: dict[str, Any]) -> dict[str, Any]:
    model, inputs = gpt(args)
    device = torch.device(args.device)
    stage, host = unit_stage(model, inputs, policies)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    loss = stage(*inputs)
    loss.backward()
    peak = 0
    if cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    grads = {k: p.grad.detach().float().cpu() for k, p in model.named_parameters()}
    host_bytes = host.peak_bytes
    times = []
    for _ in range(1 + args.repeats):  # the first: a warm-up
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        stage(*inputs).backward()
        if cuda:
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - began) * 1e3)
    return {"loss": float(loss.detach()), "peak": peak, "host": host_bytes, "grads": grads,
            "ms": statistics.median(times[1:])}


def rule_ms(args: argparse.Namespace, blocks: list[str]) -> dict[str, tuple[float, float]]:
    """Per recompute mix, the rerun the simulator charges (torch's early stop:
    planner.sim.stage_facts.checkpoint_rerun) and the units' whole forward (the old rule), in ms,
    from the model traced on this device with measured op costs."""
    from planner.sim.stage_facts import stage_facts
    from planner.tracing.api import trace

    graph = trace(*gpt(args), costs="measure").graph
    nodes = [n.id for n in graph.nodes]
    out = {}
    for label, units in (("recompute all", blocks), ("recompute mlp", [f"{b}.mlp" for b in blocks]),
                         ("recompute attn", [f"{b}.attn" for b in blocks])):
        facts = stage_facts(graph, nodes, units)
        out[label] = (sum(u.rerun_ms for u in facts.units), sum(u.forward_ms for u in facts.units))
    out["keep"] = (graph.total_compute_ms, 0.0)  # the traced step's op times
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    gpt_arguments(ap, repeats=5)
    ap.add_argument("--link-gb-s", type=float, default=50.0,
                    help="host link bandwidth each way for the copies' time (PCIe Gen5: 50)")
    args = ap.parse_args(argv)
    blocks = [f"h.{i}" for i in range(args.layers)]
    mixes = {
        "keep": {},
        "recompute all": dict.fromkeys(blocks, "recompute"),
        "offload all": dict.fromkeys(blocks, "offload"),
        "mixed": {b: ("recompute", "offload", "keep")[i % 3] for i, b in enumerate(blocks)},
        "recompute mlp": {f"{b}.mlp": "recompute" for b in blocks},
        "recompute attn": {f"{b}.attn": "recompute" for b in blocks},
    }
    rules = rule_ms(args, blocks)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"device {name}; GPT {args.layers} blocks, dim {args.dim}, context {args.context}, "
          f"batch {args.batch}")
    print("| policies | step peak B | host peak B | loss | max grad diff | peak / keep | step ms "
          "| added ms | copies ms (rule) | rerun ms (rule, early stop) | whole forward ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    plain = step(args, {})
    for label, policies in mixes.items():
        r = plain if label == "keep" else step(args, policies)
        diff = max(float((r["grads"][k] - g).abs().max()) for k, g in plain["grads"].items())
        ratio = f"{r['peak'] / plain['peak']:.3f}" if plain["peak"] else "-"
        # every host byte goes out in the forward and back in the backward, in the stream
        copies_ms = 2 * r["host"] / (args.link_gb_s * 1e9) * 1e3
        rerun, whole = rules.get(label, (0.0, 0.0))
        rule = (f"{rerun:.2f} | {whole:.2f}" if label != "keep"
                else f"(traced step {rerun:.2f}) | -") if label in rules else "- | -"
        print(f"| {label} | {r['peak']:,} | {r['host']:,} | {r['loss']:.6f} | {diff:.2e} | "
              f"{ratio} | {r['ms']:.2f} | {r['ms'] - plain['ms']:+.2f} | {copies_ms:.2f} | "
              f"{rule} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
