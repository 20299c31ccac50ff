"""Whole-job plans against today's partitioners: the split, the schedule's in-flight count and
every stage's per-module remat/offload decided together (solvers/pipeline/whole_job.py).

Models: the zoo GPT traced at op level from its configuration (12/24/48 blocks, dim 256, context
256, batch 4, vocabulary 8192; costs estimated for an H100, Adam bf16-mixed state), one
micro-batch's step; units are its modules (tok, pos, h.0 ... h.L-1, ln, head). For each P,
micro-batch count, schedule and host tier (none, or 256 GiB per rank over PCIe Gen5 x16) the
device memory goes from generous to below the least memory any contiguous split needs without
recomputation (Lm, the memory DP): 2 Lm, Lm, 0.9 Lm, 0.7 Lm. Per row:

- dp: today's partitioner (`pipeline-dp`);
- ilp: today's CP-SAT partitioner with per-micro-batch stage recomputation (1F1B and ZB-H1);
- dp+policies: the sequential baseline, the DP's split (or the least-memory split when none
  fits) followed by each stage's best per-module policies;
- whole: `pipeline-whole`.

Every plan is judged by the event simulator (planner.sim.pipeline_ranks): fits or not, the
simulated step (ms), solve time (s).

    .venv/bin/python benchmarks/whole_job.py [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results import machine, write_sections  # noqa: E402

from planner.core.errors import InputError  # noqa: E402
from planner.core.graph import Graph  # noqa: E402
from planner.core.resources import LINK_PRESETS, GiB, Resources  # noqa: E402
from planner.solvers.pipeline.dp import dp_partition, least_memory_split  # noqa: E402
from planner.solvers.pipeline.ilp import ilp_partition  # noqa: E402
from planner.solvers.pipeline.policy_splits import WholeJob  # noqa: E402
from planner.solvers.pipeline.problem import (  # noqa: E402
    Candidate,
    PartitionOutcome,
    PipelineProblem,
)
from planner.solvers.pipeline.units import UnitChain  # noqa: E402
from planner.solvers.pipeline.whole_job import whole_job_partition  # noqa: E402

LEVELS = (("generous", 2.0), ("tight", 1.0), ("below", 0.9), ("far below", 0.7))
ILP_SCHEDULES = ("1f1b", "zb-h1")
HOST_BYTES = 256 * GiB
DOCS = REPO / "docs" / "whole_job.md"


def traced_gpt(layers: int, cache: Path, batch: int = 4, dim: int = 256,
               context: int = 256) -> Graph:
    """The zoo GPT at op level, cached by its configuration (tracing 48 blocks takes ~1 min);
    `batch` sequences of `context` tokens a micro-batch."""
    shape = "" if (dim, context) == (256, 256) else f"_d{dim}_c{context}"
    path = cache / (f"whole_job_gpt{layers}{shape}.json" if batch == 4 else
                    f"whole_job_gpt{layers}{shape}_b{batch}.json")
    if path.exists():
        return Graph.model_validate_json(path.read_text())
    import torch

    from planner.tracing import trace
    from planner.zoo.token_models import GPT

    torch.manual_seed(0)
    model = GPT(vocab=8192, dim=dim, layers=layers, heads=4, context=context, dropout=0.0)
    idx = torch.randint(0, 8192, (batch, context))
    graph = trace(model, (idx, idx), level="op", costs="estimate", device_profile="h100",
                  optimizer="adam").graph
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(graph.model_dump_json())
    return graph


@dataclass(frozen=True)
class Cell:
    fits: bool
    step_ms: float | None
    peak_ratio: float  # largest rank peak / device memory
    solve_s: float
    status: str = ""
    first_s: float | None = None  # whole: when its first plan was found

    def show(self) -> str:
        if not self.fits or self.step_ms is None:
            return f"**OVER** {100 * self.peak_ratio:.0f}%" if self.step_ms else "none"
        return f"{self.step_ms:.2f}"


def cell(cand: Candidate | None, limit: int, solve_s: float, status: str = "",
         notes: list[str] | None = None) -> Cell | None:
    if cand is None:
        return None
    step = cand.simulation.makespan_ms if cand.simulation is not None else None
    first = None
    for note in notes or []:
        found = re.search(r"first plan in ([0-9.]+) s", note)
        if found:
            first = float(found.group(1))
    return Cell(cand.fits, step, max(cand.peaks) / limit, solve_s, status, first)


def outcome_cell(out: PartitionOutcome, limit: int) -> Cell | None:
    return cell(out.best, limit, out.wall_seconds, out.status, out.notes)


def sequential(problem: PipelineProblem, dp: PartitionOutcome, limit: int) -> Cell | None:
    """The DP's split (or the least-memory split) with each stage's best policies."""
    started = time.perf_counter()
    bounds = (dp.best.split.bounds if dp.best is not None
              else least_memory_split(problem)[1].bounds)
    job = WholeJob(problem)
    split = job.with_policies(bounds)
    cand = job.candidate(split) if split is not None else None
    return cell(cand, limit, dp.wall_seconds + time.perf_counter() - started)


@dataclass
class Row:
    model: str
    ranks: int
    microbatches: int
    level: str
    limit: int
    schedule: str
    host: bool
    free_ms: float | None  # the fastest plain split with unbounded memory
    cells: dict[str, Cell | None]


def run_row(graph: Graph, chain: UnitChain, p: int, m: int, schedule: str, limit: int,
            host: bool, args: argparse.Namespace) -> dict[str, Cell | None]:
    resources = Resources(device_count=p, device_memory_bytes=limit,
                          host_memory_bytes=HOST_BYTES if host else None,
                          h2d=LINK_PRESETS["pcie-gen5-x16"] if host else None,
                          d2h=LINK_PRESETS["pcie-gen5-x16"] if host else None)
    problem = PipelineProblem(graph, chain, p, m, schedule, limit, chunks=2, resources=resources)
    _ = problem.inflight  # InputError: this schedule cannot run these numbers
    if problem.stage_count > chain.length:
        raise InputError("more stages than units")
    cells: dict[str, Cell | None] = {}
    dp = dp_partition(problem, time_limit_s=args.time_limit)  # the same time as the whole plan
    cells["dp"] = outcome_cell(dp, limit)
    cells["ilp"] = (outcome_cell(ilp_partition(problem, args.ilp_time_limit, threads=1), limit)
                    if schedule in ILP_SCHEDULES else None)
    cells["dp+policies"] = sequential(problem, dp, limit)
    cells["whole"] = outcome_cell(whole_job_partition(problem, args.time_limit, threads=1),
                                  limit)
    return cells


def grid(args: argparse.Namespace) -> tuple[list[Row], dict[str, Graph]]:
    graphs = {f"GPT-{n}": traced_gpt(n, args.cache) for n in args.layers}
    rows: list[Row] = []
    for name, graph in graphs.items():
        chain = UnitChain(graph)
        for p in args.devices:
            for m in args.microbatches:
                base = PipelineProblem(graph, chain, p, m, "1f1b", None)
                if base.stage_count > chain.length or m < p:
                    continue
                least, _ = least_memory_split(base)
                free = dp_partition(base).best
                free_ms = free.simulation.makespan_ms if free and free.simulation else None
                for level, factor in args.levels:
                    limit = int(least * factor)
                    for schedule in args.schedules:
                        for host in args.hosts:
                            try:
                                cells = run_row(graph, chain, p, m, schedule, limit, host, args)
                            except InputError:
                                continue
                            rows.append(Row(name, p, m, level, limit, schedule, host, free_ms,
                                            cells))
                            print(".", end="", file=sys.stderr, flush=True)
    return rows, graphs


def _fits(c: Cell | None) -> bool:
    return c is not None and c.fits and c.step_ms is not None


def summary(rows: list[Row]) -> list[str]:
    plain = [r for r in rows if _fits(r.cells["dp"]) or _fits(r.cells["ilp"])]
    whole_on_plain = [r for r in plain if _fits(r.cells["whole"])]
    slower = []
    ratios = []
    for r in rows:
        w = r.cells["whole"]
        others = [c.step_ms for k, c in r.cells.items()
                  if k != "whole" and c is not None and _fits(c) and c.step_ms is not None]
        if w is not None and w.step_ms is not None and _fits(w) and others:
            ratios.append(w.step_ms / min(others))
            if w.step_ms > min(others) * (1 + 1e-9):
                slower.append(r)
    only_whole = [r for r in rows if _fits(r.cells["whole"]) and not any(
        _fits(c) for k, c in r.cells.items() if k != "whole")]
    only_whole_vs_plain = [r for r in rows if _fits(r.cells["whole"]) and r not in plain]
    # the ILP's recomputation overhead over the fastest unconstrained split, and the whole plan's
    costly = []
    for r in rows:
        ilp, w = r.cells["ilp"], r.cells["whole"]
        if r.free_ms and _fits(ilp) and _fits(w):
            assert ilp is not None and ilp.step_ms is not None
            assert w is not None and w.step_ms is not None
            ilp_over = ilp.step_ms / r.free_ms - 1
            if ilp_over > 0.05:
                costly.append((ilp_over, w.step_ms / r.free_ms - 1))
    halved = [x for x in costly if x[1] <= x[0] / 2 + 1e-12]
    lines = [
        f"- rows: {len(rows)} (model x P x m x memory x schedule x host tier)",
        f"- a whole-job plan on **{len(whole_on_plain)} / {len(plain)}** rows where today's "
        "partitioner (DP or ILP) has one",
        f"- whole-job slower than the fastest of dp, ilp and dp+policies: **{len(slower)}** "
        "rows" + (f"; whole / fastest other: median {statistics.median(ratios):.3f}, best "
                  f"{min(ratios):.3f} ({len(ratios)} rows)" if ratios else ""),
        f"- rows where only the whole-job plan fits: **{len(only_whole)}**; where it fits and "
        f"neither dp nor ilp does: {len(only_whole_vs_plain)}",
        f"- rows where the ILP's recomputation costs > 5 % over the fastest unconstrained "
        f"split: {len(costly)}; whole-job overhead at most half the ILP's on "
        f"**{len(halved)} / {len(costly)}**"
        + (f" (ILP overhead median {100 * statistics.median(x[0] for x in costly):.1f} %, "
           f"whole-job {100 * statistics.median(x[1] for x in costly):.1f} %)" if costly else ""),
    ]
    for model in sorted({r.model for r in rows}, key=lambda s: int(s.split("-")[1])):
        whole = [r.cells["whole"] for r in rows if r.model == model and r.cells["whole"]]
        firsts = [c.first_s for c in whole if c is not None and c.first_s is not None]
        solves = [c.solve_s for c in whole if c is not None]
        if solves:
            lines.append(
                f"- {model}: whole-job first plan median {statistics.median(firsts):.2f} s, max "
                f"{max(firsts):.2f} s; answer median {statistics.median(solves):.1f} s, max "
                f"{max(solves):.1f} s" if firsts else f"- {model}: no whole-job plan")
    statuses: dict[str, int] = {}
    for r in rows:
        w = r.cells["whole"]
        if w is not None:
            statuses[w.status] = statuses.get(w.status, 0) + 1
    lines.append("- whole-job status: " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(statuses.items())))
    return lines


def table(rows: list[Row]) -> list[str]:
    out = ["| model | P | m | memory | schedule | host | dp | ilp | dp+policies | whole | "
           "whole status | solve s (dp / ilp / whole) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shown = {k: (v.show() if v is not None else "-") for k, v in r.cells.items()}
        times = " / ".join(f"{v.solve_s:.1f}" if (v := r.cells.get(k)) is not None else "-"
                           for k in ("dp", "ilp", "whole"))
        w = r.cells.get("whole")
        out.append(f"| {r.model} | {r.ranks} | {r.microbatches} | {r.level} "
                   f"{r.limit / GiB:.3f} GiB | {r.schedule} | {'yes' if r.host else 'no'} | "
                   f"{shown['dp']} | {shown['ilp']} | {shown['dp+policies']} | {shown['whole']} "
                   f"| {w.status if w else '-'} | {times} |")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="GPT-12 and GPT-24, fewer rows")
    ap.add_argument("--layers", default="12,24,48")
    ap.add_argument("--devices", default="2,4,8")
    ap.add_argument("--microbatches", default="8", help="e.g. 4,8,16,32 (the default keeps the "
                    "run near 30 minutes on 2 cores)")
    ap.add_argument("--schedules", default="1f1b,interleaved-1f1b,zb-h1")
    ap.add_argument("--time-limit", type=float, default=10.0, help="whole-job seconds per row")
    ap.add_argument("--ilp-time-limit", type=float, default=3.0)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "planner" / "bench")
    ap.add_argument("--write-docs", action="store_true", help=f"write {DOCS.relative_to(REPO)}")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.devices, args.microbatches = "12,24", "2,4", "4,8"
        args.time_limit = min(args.time_limit, 4.0)
    args.layers = [int(x) for x in args.layers.split(",")]
    args.devices = [int(x) for x in args.devices.split(",")]
    args.microbatches = [int(x) for x in args.microbatches.split(",")]
    args.schedules = args.schedules.split(",")
    args.levels = LEVELS
    args.hosts = (False, True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.time()
    rows, graphs = grid(args)
    minutes = (time.time() - started) / 60
    command = " ".join(["benchmarks/whole_job.py", *(argv if argv is not None else sys.argv[1:])])
    run = (f"`{command}` on {time.strftime('%Y-%m-%d')}: machine {machine()}; whole-job "
           f"time limit {args.time_limit:g} s, ILP {args.ilp_time_limit:g} s, 1 thread; "
           f"{minutes:.0f} minutes.")
    models = "Models: " + ", ".join(f"{k} ({len(g.nodes)} op nodes, {UnitChain(g).length} "
                                    f"units)" for k, g in graphs.items())
    first = ["## Summary", "", *summary(rows)]
    rest = ["## Every row", "",
            "Cells: the simulated step (ms) of a plan that fits every rank; **OVER** with the "
            "largest rank's peak / device memory; none: no plan. Memory: a fraction of the "
            "least any contiguous split needs without recomputation (1F1B, exact).", "",
            *table(rows)]
    print("\n".join([run, "", models, "", *first, "", *rest]) + "\n")
    if args.write_docs:  # the summary near the top of the page, the rows at its end
        write_sections(DOCS, {"summary": [*first, "", run],
                              "measured": [run, "", models, "", *rest]}, title="Whole-job plans")
        print(f"wrote {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

