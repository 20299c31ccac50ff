"""The schedule and micro-batch count chosen with the split (planner.engine.job_choice) against
the whole-job plan at a fixed default, and against every option planned alone.

Models: the zoo GPTs of benchmarks/whole_job.py (12 and 24 blocks, dim 256, context 256,
vocabulary 8192; costs estimated for an H100, Adam) and a wider one (12 blocks, dim 768, context
1024), each traced at op level at micro-batch sizes 1, 2, 4 and 8, global batch 32: 32, 16, 8 or
4 micro-batches a step. Schedules: every one (`auto`). Memory per device: from generous to below
the least the default needs without recomputation (Lm: micro-batch 4 x 8 micro-batches, 1F1B,
the memory DP): 2 Lm, Lm, 0.7 Lm, 0.5 Lm. Per row:

- default: the whole-job plan at micro-batch 4, 8 micro-batches, 1F1B (the whole_job
  benchmark's setting), `--time-limit` seconds;
- chosen: `choose_job` over the 4 sizes x 5 schedules at its default limit (2 s an option: 40
  s), and again in 10 s overall;
- best alone: each option planned alone with `--time-limit` seconds (options whose work bound
  reaches the best so far skipped, as they cannot win): what 20 separate runs reach.

Every plan is judged by the event simulator. Step times are for the same 32 samples, so they
compare directly.

    .venv/bin/python benchmarks/job_choice.py [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results import machine, write_sections  # noqa: E402
from whole_job import traced_gpt  # noqa: E402

from planner.core.errors import InputError, NoPlanFits  # noqa: E402
from planner.core.graph import Graph  # noqa: E402
from planner.core.resources import GiB  # noqa: E402
from planner.engine.job_choice import JobChoice, choose_job  # noqa: E402
from planner.engine.job_options import (  # noqa: E402
    AUTO_SCHEDULES,
    job_options,
    work_bound_ms,
)
from planner.engine.partition import make_problem, partition_plan  # noqa: E402
from planner.solvers.pipeline.dp import least_memory_split  # noqa: E402

SIZES = (1, 2, 4, 8)
GLOBAL_BATCH = 32
DEFAULT = (4, "1f1b")  # micro-batch size, schedule
# name -> (blocks, dim, context): the whole_job benchmark's GPTs, and a GPT-2-small-wide one
MODELS = {"GPT-12": (12, 256, 256), "GPT-24": (24, 256, 256), "GPT-12 d768": (12, 768, 1024)}
LEVELS = (("generous", 2.0), ("tight", 1.0), ("below", 0.7), ("far below", 0.5))
DOCS = REPO / "docs" / "job_choice.md"


@dataclass(frozen=True)
class Chosen:
    choice: JobChoice | None  # None: no option fits
    wall_s: float

    @property
    def step_ms(self) -> float | None:
        return self.choice.best.step_ms if self.choice else None

    def option(self) -> str:
        return self.choice.best.option.text() if self.choice else "-"


@dataclass(frozen=True)
class Row:
    model: str
    ranks: int
    level: str
    limit: int
    default_ms: float | None
    default_s: float
    chosen: Chosen  # at the default limit (DEFAULT_S_PER_OPTION an option)
    quick: Chosen  # at --quick-choice-limit seconds
    alone_ms: float | None  # the best option planned alone
    alone_option: str
    alone_s: float
    alone_runs: int


def _step(report_fn: object) -> tuple[float | None, float]:
    start = time.perf_counter()
    try:
        report = report_fn()  # type: ignore[operator]
    except (NoPlanFits, InputError):
        return None, time.perf_counter() - start
    return (report.makespan_ms if report.fits else None), time.perf_counter() - start


def best_alone(graphs: list[tuple[str, Graph]], ranks: int, limit: int,
               time_limit_s: float) -> tuple[float | None, str, float, int]:
    """Every option alone with the whole limit, least work bound first; skipped once its bound
    reaches the best step (no plan of it can be faster)."""
    options, _ = job_options(graphs, global_batch=GLOBAL_BATCH, microbatches=None,
                             schedules=AUTO_SCHEDULES)
    bound = {o: work_bound_ms(graphs[o.graph_index][1], o.microbatches, ranks) for o in options}
    best: tuple[float | None, str] = (None, "-")
    start, runs = time.perf_counter(), 0
    for o in sorted(options, key=bound.__getitem__):
        if best[0] is not None and bound[o] >= best[0]:
            continue
        runs += 1
        graph = graphs[o.graph_index][1]
        step, _ = _step(lambda g=graph, o=o: partition_plan(
            g, microbatches=o.microbatches, schedule=o.schedule, method="whole", devices=ranks,
            device_memory_bytes=limit, time_limit_s=time_limit_s, threads=1))
        if step is not None and (best[0] is None or step < best[0]):
            best = (step, o.text())
    return best[0], best[1], time.perf_counter() - start, runs


def choose(graphs: list[tuple[str, Graph]], ranks: int, limit: int,
           time_limit_s: float | None) -> Chosen:
    start = time.perf_counter()
    try:
        choice: JobChoice | None = choose_job(
            graphs, global_batch=GLOBAL_BATCH, method="whole", devices=ranks,
            device_memory_bytes=limit, time_limit_s=time_limit_s, threads=1)
    except NoPlanFits:
        choice = None
    return Chosen(choice, time.perf_counter() - start)


def run_row(model: str, graphs: list[tuple[str, Graph]], ranks: int, level: str, limit: int,
            args: argparse.Namespace) -> Row:
    by_size = {g.metadata.batch_size: g for _, g in graphs}
    size, schedule = DEFAULT
    default_ms, default_s = _step(lambda: partition_plan(
        by_size[size], microbatches=GLOBAL_BATCH // size, schedule=schedule, method="whole",
        devices=ranks, device_memory_bytes=limit, time_limit_s=args.time_limit, threads=1))
    chosen = choose(graphs, ranks, limit, None)
    quick = choose(graphs, ranks, limit, args.quick_choice_limit)
    alone = best_alone(graphs, ranks, limit, args.time_limit) if args.alone else \
        (None, "-", 0.0, 0)
    return Row(model, ranks, level, limit, default_ms, default_s, chosen, quick, *alone)


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "no fit"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def table(rows: list[Row]) -> list[str]:
    out = ["| model | P | memory | default (mb 4 x 8, 1f1b) | chosen | chosen option | run / "
           "ruled out | chosen / default | chosen in 10 s | best alone | best alone option | "
           "chosen / best alone | time s (default / chosen / in 10 s / alone, runs) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.chosen.choice
        ruled = sum(1 for x in c.results if x.note.startswith("ruled out")) if c else 0
        ran = sum(1 for x in c.results if x.report is not None or x.least_bytes) if c else 0
        out.append(
            f"| {r.model} | {r.ranks} | {r.level} {r.limit / GiB:.3f} GiB | {_ms(r.default_ms)} "
            f"| {_ms(r.chosen.step_ms)} | {r.chosen.option()} | {ran} / {ruled} | "
            f"{_ratio(r.chosen.step_ms, r.default_ms)} | {_ms(r.quick.step_ms)} | "
            f"{_ms(r.alone_ms)} | {r.alone_option} | {_ratio(r.chosen.step_ms, r.alone_ms)} | "
            f"{r.default_s:.1f} / {r.chosen.wall_s:.1f} / {r.quick.wall_s:.1f} / "
            f"{r.alone_s:.1f}, {r.alone_runs} |")
    return out


def _against(rows: list[Row], pick: str, other: str) -> list[float]:
    """step(pick) / step(other) over the rows where both fit."""
    def step(r: Row, what: str) -> float | None:
        return {"chosen": r.chosen.step_ms, "quick": r.quick.step_ms,
                "default": r.default_ms, "alone": r.alone_ms}[what]

    return [a / b for r in rows if (a := step(r, pick)) and (b := step(r, other))]


def _spread(values: list[float], what: str) -> str:
    if not values:
        return f"- {what}: no row where both fit"
    worse = sum(1 for v in values if v > 1 + 1e-9)
    return (f"- {what}: median **{statistics.median(values):.3f}**, {min(values):.3f} to "
            f"{max(values):.3f}; slower on {worse} of {len(values)} rows")


def summary(rows: list[Row]) -> list[str]:
    only = [r for r in rows if r.chosen.choice and not r.default_ms]
    walls = [r.chosen.wall_s for r in rows]
    quick = [r.quick.wall_s for r in rows]
    return [
        f"- rows: {len(rows)}; a chosen plan on {sum(1 for r in rows if r.chosen.choice)}, the "
        f"default fits on {sum(1 for r in rows if r.default_ms)}; only the chosen option fits "
        f"on **{len(only)}**",
        _spread(_against(rows, "chosen", "default"), "chosen / default step"),
        _spread(_against(rows, "chosen", "alone"), "chosen / best alone"),
        _spread(_against(rows, "quick", "default"), "chosen in 10 s / default step"),
        f"- choice time at the default limit (2 s an option, 40 s for 20): median "
        f"{statistics.median(walls):.1f} s, max {max(walls):.1f} s; at 10 s: median "
        f"{statistics.median(quick):.1f} s, max {max(quick):.1f} s",
        f"- proven fastest over every option: "
        f"{sum(1 for r in rows if r.chosen.choice and r.chosen.choice.proven)} rows",
    ]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="GPT-12 on 4 ranks, two memory levels")
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--devices", default="4,8")
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds, default and alone")
    ap.add_argument("--quick-choice-limit", type=float, default=10.0,
                    help="the second choice's seconds overall")
    ap.add_argument("--no-alone", dest="alone", action="store_false",
                    help="skip planning every option alone")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "planner" / "bench")
    ap.add_argument("--write-docs", action="store_true", help=f"write {DOCS.relative_to(REPO)}")
    args = ap.parse_args(argv)
    args.levels = LEVELS
    if args.quick:
        args.models, args.devices, args.levels = "GPT-12", "4", LEVELS[1:3]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rows = []
    for model in args.models.split(","):
        layers, dim, context = MODELS[model]
        graphs = [(f"b{b}", traced_gpt(layers, args.cache, b, dim, context)) for b in SIZES]
        by_size = {g.metadata.batch_size: g for _, g in graphs}
        for ranks in (int(x) for x in args.devices.split(",")):
            size, schedule = DEFAULT
            base = make_problem(by_size[size], devices=ranks, memory_bytes=None,
                                microbatches=GLOBAL_BATCH // size, schedule=schedule)
            least, _ = least_memory_split(base)
            for level, factor in args.levels:
                rows.append(run_row(model, graphs, ranks, level, int(least * factor), args))
                print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    first, rest = ["## Summary", "", *summary(rows)], ["## Rows", "", *table(rows)]
    print(f"Machine: {machine()}.\n")
    print("\n".join([*first, "", *rest]))
    if args.write_docs:  # the summary near the top of the page, the rows at its end
        write_sections(DOCS, {"summary": [*first, "", f"Machine: {machine()}."],
                              "measured": [f"Machine: {machine()}.", "", *rest]},
                       title="The schedule and micro-batch count, chosen with the split")


if __name__ == "__main__":
    main()
