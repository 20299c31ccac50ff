"""FSDP plans against torchtitan's hand settings, on gloo CPU ranks (issue 52).

For a GPT and a Llama-style model (planner.zoo, dropout off so every rank's gradients can be
checked against one process), on 2 and 4 ranks: the blocks are profiled once on one process
(planner.tracing.fsdp_blocks: each block's forward and backward under keep / selective / full,
the allocator's records), then every plan is judged by planner.sim.fsdp and run on gloo CPU
ranks (planner.runtime.fsdp_apply: policies, then fully_shard per block and the root):

- hand settings (FSDP2's defaults: every block reshards after forward, one block prefetched):
  no AC, full AC, selective per op (matmul outputs kept), every other layer full AC;
- Planner's plan (planner.solvers.fsdp.search, exact over the plan space) at each hand
  setting's predicted peak, and at the least peak the search finds (`least`).

Columns: the rank's predicted step peak (bytes the step allocates above the sharded state; the
whole rank's peak adds the sharded parameters and Adam's state, `resident`), the largest
measured peak over the ranks (the allocator's records), their ratio, the largest gradient
difference against one process (all ranks), the simulated step time (compute measured on this
CPU, collectives on the link below) and the measured CPU step (collectives drained, see
runtime/fsdp_apply.py: not a GPU time).

    .venv/bin/python benchmarks/fsdp.py [--worlds 2 4] [--link pcie-gen4-x16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.resources import LINK_PRESETS  # noqa: E402
from planner.sim.fsdp import FsdpModel, FsdpPlan, LinkSpec, hand_plans, simulate_fsdp  # noqa: E402
from planner.solvers.fsdp.search import solve_fsdp  # noqa: E402

MODELS: dict[str, dict[str, float | int]] = {
    "gpt": dict(context=64, dim=64, layers=4, vocab=256, dropout=0.0),
    "llama": dict(context=64, dim=64, layers=4, heads=4, kv_heads=2, vocab=256),
}
PER_RANK_BATCH = 2


def profile(name: str, worlds: list[int]) -> FsdpModel:
    import torch

    from planner import zoo
    from planner.tracing.fsdp_blocks import profile_blocks

    torch.set_num_threads(1)  # as each rank runs (a shared machine: no spinning pools)
    kw = {**MODELS[name], "batch_size": PER_RANK_BATCH}
    return profile_blocks(lambda: getattr(zoo, name)(**kw), world_sizes=tuple(worlds))


def rows_for(name: str, model: FsdpModel, world: int, link: LinkSpec) -> list[str]:
    from planner.runtime.fsdp_apply import ModelSpec, run_fsdp_plans

    nb = len(model.blocks)
    hands = hand_plans(nb)
    entries: list[tuple[str, FsdpPlan]] = [(f"hand: {n}", p) for n, p in hands.items()]
    floor = solve_fsdp(model, 0, world, link, backend="gloo")
    budgets = [(f"at {n}", simulate_fsdp(model, p, world, link, "gloo").peak_bytes)
               for n, p in hands.items()]
    budgets.append(("least", floor.least_peak_bytes))
    notes = []
    for label, budget in budgets:
        sol = solve_fsdp(model, budget, world, link, backend="gloo")
        entries.append((f"Planner {label}", sol.plan))
        notes.append(f"- {name}, {world} ranks, budget {budget:,} B ({label}): {sol.text()}")
    unique = list(dict.fromkeys(p for _, p in entries))
    spec = ModelSpec(f"planner.zoo:{name}",
                     tuple({**MODELS[name], "batch_size": PER_RANK_BATCH * world}.items()))
    started = time.perf_counter()
    runs = dict(zip(unique, run_fsdp_plans(spec, unique, world), strict=True))
    wall = time.perf_counter() - started
    rows = []
    for label, plan in entries:
        sim = simulate_fsdp(model, plan, world, link, "gloo")
        ranks = runs[plan]
        measured = max(r.peak_bytes for r in ranks)
        grad = max(r.max_grad_diff for r in ranks)
        cpu_ms = max(r.step_ms for r in ranks)
        rows.append(
            f"| {name} | {world} | {label} | `{plan.text()}` | {sim.step_peak_bytes:,} | "
            f"{measured:,} | {measured / sim.step_peak_bytes:.4f} | {sim.peak_bytes:,} | "
            f"{grad:.1e} | {sim.step_ms:.2f} | {cpu_ms:.1f} |")
    notes.append(f"- {name}, {world} ranks: {len(unique)} distinct plans run in {wall:.0f} s")
    return rows + [""] + notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--link", default="pcie-gen4-x16", choices=sorted(LINK_PRESETS))
    args = ap.parse_args()
    preset = LINK_PRESETS[args.link]
    link = LinkSpec(preset.bandwidth_bytes_per_s, preset.latency_s)
    print(f"# FSDP plans on gloo CPU ranks (link for the simulated time: {args.link}, "
          f"{preset})\n")
    header = ("| model | ranks | plan | settings | predicted step peak B | measured peak B "
              "(max over ranks) | measured / predicted | predicted rank peak B | grad max diff "
              "| simulated step ms | CPU step ms |")
    for name in args.models:
        started = time.perf_counter()
        model = profile(name, args.worlds)
        print(f"## {name}: {MODELS[name]}, {PER_RANK_BATCH} sequences per rank; {len(model.blocks)}"
              f" blocks, profiled in {time.perf_counter() - started:.0f} s\n")
        print(header)
        print("|" + "---|" * 11)
        notes: list[str] = []
        for world in args.worlds:
            out = rows_for(name, model, world, link)
            cut = out.index("")
            print("\n".join(out[:cut]))
            notes += out[cut + 1:]
        print()
        print("\n".join(notes))
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
