"""Offloading planners vs pure recomputation: simulated makespan overhead vs store-all.

Graphs: the shared Checkmate corpus (/work/shared/graphs/checkmate, skipped when absent; the
importer stores `cost_cpu`/`duration` as compute_ms unchanged, so here costs are read as
microseconds: compute_ms = cost / 1000) and traced zoo models (GPT, ResNet, U-Net; costs
estimated for an H100 by the tracer's roofline, device_profile "h100"; skipped without torch).
Machine: H100 PCIe with Gen4 or Gen5 x16 links (resources presets), 512 GiB of host memory.
Budgets: fractions of store-all's peak. Per planner: makespan overhead vs store-all (every node
once, no copies), bytes moved (both ways), peak device and host memory, solve time. "remat" is
auto (pure recomputation); "offload+remat" is `improve_with_offload` on auto's plan (store-all
and remat plans at larger budgets brought down by offloading, and the pofo DP; auto's plan when
nothing is faster): what auto returns once it considers offloading.

    .venv/bin/python benchmarks/offload.py --time-limit 2 --write docs/offload_benchmark.md

`--write` replaces the page's summary (the Targets table, at the top) and measured sections
(every row), keeping its prose (benchmarks/results.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import machine, write_sections  # noqa: E402

from planner.core.budget import format_bytes  # noqa: E402
from planner.core.graph import Graph  # noqa: E402
from planner.core.plan import Action, ActionOp  # noqa: E402
from planner.core.resources import Resources, resources_preset  # noqa: E402
from planner.sim.simulator import PlanError, simulate  # noqa: E402
from planner.solvers.baselines import store_all  # noqa: E402
from planner.solvers.offload import methods  # noqa: E402
from planner.solvers.offload.hybrid import improve_with_offload  # noqa: E402
from planner.solvers.remat.auto import solve_auto  # noqa: E402
from planner.solvers.request import SolveRequest  # noqa: E402

CORPUS = Path("/work/shared/graphs/checkmate")
HOST_BYTES = 512 * 2**30
PLANNERS = {"offload-all": methods.offload_all, "offload-greedy": methods.offload_greedy,
            "offload-beaumont": methods.offload_beaumont, "offload-milp": methods.offload_milp,
            "pofo": methods.pofo}


def corpus_graphs() -> list[tuple[str, Graph]]:
    from planner.engine.inputs import load_graph

    out = []
    for path in sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []:
        g = load_graph(path)
        nodes = [n.model_copy(update={"compute_ms": n.compute_ms / 1000}) for n in g.nodes]
        out.append((path.stem, g.model_copy(update={"nodes": nodes})))
    return out


def zoo_graphs() -> list[tuple[str, Graph]]:
    try:
        import torch

        from planner.tracing import trace
        from planner.zoo import gpt, resnet, unet
    except ImportError:
        return []
    torch.set_num_threads(1)
    out = []
    for name, build in (("gpt", lambda: gpt(batch_size=8, context=128, dim=256, layers=6)),
                        ("resnet", lambda: resnet(batch_size=32, image=64)),
                        ("unet", lambda: unet(batch_size=8, image=128))):
        model, inputs = build()
        out.append((f"zoo:{name}", trace(model, inputs, device_profile="h100").graph))
    return out


def moved_bytes(graph: Graph, actions: list[Action]) -> int:
    size = graph.index.storage_bytes
    return sum(size[a.node] for a in actions if a.op in (ActionOp.offload, ActionOp.prefetch))


def row(graph: Graph, name: str, link: str, frac: float, planner: str, actions: list[Action] | None,
        res: Resources, budget: int, wall: float, base_ms: float) -> tuple[str, float | None]:
    if actions is None:
        return (f"| {name} | {link} | {frac:g} | {planner} | no plan | | | | {wall:.2f} |", None)
    try:
        sim = simulate(graph, actions, res)
    except PlanError as e:
        return (f"| {name} | {link} | {frac:g} | {planner} | INVALID: {e} | | | | {wall:.2f} |",
                None)
    over = 100 * (sim.makespan_ms / base_ms - 1) if base_ms > 0 else 0.0
    over = round(over, 2) + 0.0  # no "-0.00 %" from float noise
    ok = "" if sim.peak_bytes <= budget and sim.host_peak_bytes <= HOST_BYTES else " OVER"
    return (f"| {name} | {link} | {frac:g} | {planner} | {over:+.2f} %{ok} | "
            f"{format_bytes(moved_bytes(graph, actions))} | {format_bytes(sim.peak_bytes)} | "
            f"{format_bytes(sim.host_peak_bytes)} | {wall:.2f} |", over)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--fractions", default="0.8,0.6,0.4,0.2")
    parser.add_argument("--only", default="", help="comma-separated graph names")
    parser.add_argument("--write", type=Path, default=None,
                        help="also write the tables into this markdown page's sections")
    args = parser.parse_args()
    measured: list[str] = []

    def show(line: str) -> None:
        print(line, flush=True)
        measured.append(line)

    fractions = [float(f) for f in args.fractions.split(",")]
    graphs = corpus_graphs() + zoo_graphs()
    if args.only:
        keep = set(args.only.split(","))
        graphs = [(n, g) for n, g in graphs if n in keep]
    links = {"gen4": resources_preset("h100-pcie-gen4"), "gen5": resources_preset("h100-pcie-gen5")}
    show(f"machine: {machine()}\n")
    show(f"time limit {args.time_limit:g} s per planner; host memory {HOST_BYTES // 2**30} GiB; "
         "overhead = simulated makespan / store-all compute - 1; moved: bytes copied (both "
         "ways); OVER would mark a plan beyond a budget (none may)\n")
    show("| graph | link | budget | planner | overhead | moved | peak device | peak host | "
         "solve s |")
    show("|---|---|---|---|---|---|---|---|---|")
    summary: list[str] = []
    for name, graph in graphs:
        base_ms = graph.total_compute_ms
        full = simulate(graph, store_all(graph)).peak_bytes
        for frac in fractions:
            budget = int(full * frac)
            t0 = time.perf_counter()
            remat = solve_auto(graph, budget, time_limit_s=args.time_limit)
            remat_wall = time.perf_counter() - t0
            for link, preset in links.items():
                res = preset.model_copy(update={"host_memory_bytes": HOST_BYTES})
                line, remat_over = row(graph, name, link, frac, "remat (auto)", remat.actions,
                                       res, budget, remat_wall, base_ms)
                show(line)
                overs: dict[str, float | None] = {}
                plans: dict[str, list[Action] | None] = {}
                for planner, fn in PLANNERS.items():
                    t0 = time.perf_counter()
                    r = fn(SolveRequest(graph=graph, budget_bytes=budget, resources=res,
                                        time_limit_s=args.time_limit))
                    wall = time.perf_counter() - t0
                    line, overs[planner] = row(graph, name, link, frac, planner, r.actions, res,
                                               budget, wall, base_ms)
                    plans[planner] = r.actions
                    gap = r.details.get("model", {}).get("gap")
                    show(line + (f" model gap {100 * gap:.2f} %" if gap is not None else ""))
                t0 = time.perf_counter()
                improved = improve_with_offload(graph, budget, res, remat.actions,
                                                args.time_limit)
                wall = time.perf_counter() - t0
                hybrid = improved if improved is not None else remat.actions
                line, over = row(graph, name, link, frac, "remat+offload (improve)", hybrid, res,
                                 budget, wall + remat_wall, base_ms)
                show(line)
                summary.append(_summary(name, link, frac, remat_over, over, overs))
    targets = ["## Targets", "",
               "| graph | link | budget | remat | offload+remat | reduction | ≤ remat | ≥ 1/3 less "
               "(remat > 1 %) | ahead of all/greedy |", "|---|---|---|---|---|---|---|---|---|",
               *summary]
    print("", *targets, sep="\n")
    if args.write:  # the Targets table at the top of the page, every row below
        write_sections(args.write, {"summary": targets, "measured": measured},
                       title="Offloading planners vs recomputation: benchmark")


def _summary(name: str, link: str, frac: float, remat: float | None, best: float | None,
             overs: dict[str, float | None]) -> str:
    def pct(v: float | None) -> str:
        return "none" if v is None else f"{v:+.2f} %"

    if remat is None and best is not None:
        return (f"| {name} | {link} | {frac:g} | none | {pct(best)} | | yes (remat finds none) "
                "| n/a | |")

    if best is None:
        return f"| {name} | {link} | {frac:g} | {pct(remat)} | none | | | | |"
    le = "yes" if remat is None or best <= remat + 1e-9 else "NO"
    red = "" if remat is None or remat <= 0 else f"{100 * (1 - best / remat):.0f} %"
    third = ("n/a" if remat is None or remat <= 1 else
             ("yes" if best <= remat * (2 / 3) + 1e-9 else "NO"))
    ahead = []
    for b in ("offload-all", "offload-greedy"):
        o = overs[b]
        if o is not None:
            ahead.append(f"{b}: {'yes' if best <= o + 1e-9 else 'NO'}")
    return (f"| {name} | {link} | {frac:g} | {pct(remat)} | {pct(best)} | {red} | {le} | {third} "
            f"| {', '.join(ahead) or 'they do not fit'} |")


if __name__ == "__main__":
    main()
