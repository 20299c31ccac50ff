"""What a checkpoint adds to a step on this device, against the simulator's rerun rule: a GPT's
step with every block's MLP (or every whole block) under torch's non-reentrant checkpoint, with
and without RNG state preservation, and under the project's unit runtime, timed (median of
--repeats after warm-ups, synchronised), beside the rule's rerun from a trace with measured op
costs (planner.sim.stage_facts.checkpoint_rerun). `host ms` is the time until backward returns
before synchronising: where it is near the step, the step is bound by Python and launches, not
kernels.

    python3 benchmarks/gpu/checkpoint_probe.py [--dim 256 --context 256 --batch 8]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_units import gpt, gpt_arguments, rule_ms, unit_stage  # noqa: E402


def _wrap(model: Any, paths: list[str], rng: bool) -> None:
    for path in paths:
        sub = model.get_submodule(path)
        sub.forward = functools.partial(checkpoint, sub.forward, use_reentrant=False,
                                        preserve_rng_state=rng)


def _time(fn: Any, model: Any, inputs: tuple[Any, ...], repeats: int) -> tuple[float, float]:
    cuda = inputs[0].is_cuda
    steps, hosts = [], []
    for _ in range(3 + repeats):
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        fn(*inputs).backward()
        host = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
        steps.append((time.perf_counter() - began) * 1e3)
        hosts.append((host - began) * 1e3)
    return statistics.median(steps[3:]), statistics.median(hosts[3:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    gpt_arguments(ap, repeats=10)
    args = ap.parse_args(argv)
    blocks = [f"h.{i}" for i in range(args.layers)]
    mlps = [f"{b}.mlp" for b in blocks]
    rules = rule_ms(args, blocks)
    print(f"device {args.device}; GPT {args.layers} blocks, dim {args.dim}, context "
          f"{args.context}, batch {args.batch}; traced step {rules['keep'][0]:.2f} ms")
    print("| step | step ms | host ms | added ms | rule rerun ms (early stop) | whole forward ms |")
    print("|---|---:|---:|---:|---:|---:|")
    model, inputs = gpt(args)
    keep, keep_host = _time(model, model, inputs, args.repeats)
    print(f"| keep | {keep:.2f} | {keep_host:.2f} | +0.00 | - | - |")
    cases: list[tuple[str, list[str], bool | None, str]] = [
        ("torch checkpoint, MLPs, RNG kept", mlps, True, "recompute mlp"),
        ("torch checkpoint, MLPs, no RNG", mlps, False, "recompute mlp"),
        ("torch checkpoint, blocks, RNG kept", blocks, True, "recompute all"),
        ("torch checkpoint, blocks, no RNG", blocks, False, "recompute all"),
        ("unit runtime, MLPs", mlps, None, "recompute mlp"),
        ("unit runtime, blocks", blocks, None, "recompute all"),
    ]
    for label, paths, rng, rule in cases:
        model, inputs = gpt(args)
        if rng is None:
            fn = unit_stage(model, inputs, dict.fromkeys(paths, "recompute"))[0]
        else:
            _wrap(model, paths, rng)
            fn = model
        ms, host = _time(fn, model, inputs, args.repeats)
        rerun, whole = rules[rule]
        print(f"| {label} | {ms:.2f} | {host:.2f} | {ms - keep:+.2f} | {rerun:.2f} | "
              f"{whole:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
