"""Commands over many budgets: min-budget (the least budget that fits) and sweep."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from planner.cli.options import (
    METHOD_HELP,
    OptionsOpt,
    ResourcesOpt,
    ThreadsOpt,
    TimeLimitOpt,
    TimeLimitPerBudgetOpt,
    method_options,
    resources_input,
)
from planner.cli.output import bytes_text, console, key_value_table, print_json
from planner.core.budget import format_bytes
from planner.core.limits import DEFAULT_SWEEP_TIME_LIMIT_S

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# The MILP backends that minimise a peak (solvers/remat/backends: MIP_BACKENDS less pulp-cbc);
# typer refuses any other value and lists these in --help.
MinBudgetBackend = Literal["cpsat", "scip", "highs", "cbc"]
GraphArg = Annotated[
    Path, typer.Argument(metavar="GRAPH", help="graph.json or a Checkmate node-link file")
]


def register(app: typer.Typer) -> None:
    app.command("min-budget")(min_budget_cmd)
    app.command("sweep")(sweep_cmd)


def min_budget_cmd(
    graph_path: GraphArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="plan.json to write")
    ] = None,
    time_limit: TimeLimitOpt = 30.0,
    threads: ThreadsOpt = 2,
    backend: Annotated[MinBudgetBackend, typer.Option("--backend", help="The MILP solver")
                       ] = "cpsat",
    as_json: JsonFlag = False,
) -> None:
    """The least memory budget for which a plan exists: a plan achieving it plus a bound."""
    from planner.cli.progress_view import work_status
    from planner.core.io import write_json
    from planner.core.plan import PlanStatus
    from planner.engine.checked import checked_plan
    from planner.engine.inputs import load_graph
    from planner.sim.simulator import lower_bound_peak_bytes
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.solvers.request import MethodResult

    graph = load_graph(graph_path)
    store_all = store_all_peak_bytes(graph)
    searching = (f"searching between {format_bytes(lower_bound_peak_bytes(graph))} (lower bound) "
                 f"and {format_bytes(store_all)} (store-all)")
    with work_status("min-budget", quiet=as_json, limit_s=time_limit, detail=searching):
        r = _min_budget_in_time(graph, backend, time_limit, threads)
    result = MethodResult(actions=r.actions, status=PlanStatus.feasible, backend=r.method,
                          details={"min_budget_lower_bound_bytes": r.lower_bound_bytes,
                                   "min_budget_proven": r.proven})
    plan = checked_plan(graph, r.peak_bytes, "min-budget", result, r.wall_seconds)
    summary = {
        "min_budget_bytes": r.peak_bytes,
        "lower_bound_bytes": r.lower_bound_bytes,
        "proven": r.proven,
        "fraction_of_store_all": r.peak_bytes / store_all if store_all else None,
        "store_all_peak_bytes": store_all,
        "found_by": r.method,
        "overhead_percent": 100 * plan.predicted.overhead if plan.predicted else None,
        "wall_seconds": round(r.wall_seconds, 3),
    }
    if output is not None:
        write_json(output, plan)
        summary["output"] = str(output)
    if as_json:
        print_json(summary)
        return
    rows = [
        ("least budget found", bytes_text(r.peak_bytes)),
        ("proven lower bound", bytes_text(r.lower_bound_bytes)
         + (" — proven optimal" if r.proven else " (frontier-advancing schedules)")),
        ("of store-all peak", f"{summary['fraction_of_store_all']:.4f}"),
        ("found by", r.method),
        ("time", f"{r.wall_seconds:.2f} s"),
    ]
    if output is not None:
        rows.append(("plan written to", str(output)))
    console.print(key_value_table(str(graph_path), rows))


def _min_budget_in_time(graph: Any, backend: str, time_limit_s: float, threads: int) -> Any:
    """planner.solvers.remat.min_budget within the time limit plus the engine's grace: when the
    search overruns, the least peak it had found answers (its incumbent), or the least-peak
    affordable baseline when that is lower or nothing was found, as `planner.engine.solve`
    does for methods."""
    import time

    from planner.engine.deadline import METHOD_GRACE_S, MethodRun, least_baseline
    from planner.sim.simulator import lower_bound_peak_bytes
    from planner.solvers.remat.min_budget import Incumbent, MinBudget, min_budget

    started = time.perf_counter()
    found = Incumbent()
    run = MethodRun(lambda _: min_budget(graph, backend=backend, time_limit_s=time_limit_s,
                                         threads=threads, incumbent=found), None).start()
    if run.wait(started + time_limit_s + METHOD_GRACE_S):
        return run.result()
    run.abandon()
    best = found.best()
    if best is None:
        least = least_baseline(graph, started + time_limit_s + 2 * METHOD_GRACE_S)
        if least is None:
            from planner.core.errors import InputError

            raise InputError(f"min-budget: no plan found within the time limit of "
                             f"{time_limit_s:g} s; give it more time (--time-limit)")
        best = (least.peak_bytes, least.actions, f"baseline:{least.name}")
    lower = min(lower_bound_peak_bytes(graph), best[0])
    return MinBudget(peak_bytes=best[0], lower_bound_bytes=lower, proven=best[0] == lower,
                     actions=best[1],
                     method=f"{best[2]} (the search overran its time limit)",
                     wall_seconds=time.perf_counter() - started)


def sweep_cmd(
    graph_path: GraphArg,
    budgets: Annotated[str, typer.Option(
        "--budgets", help="start:stop:step fractions of the store-all peak, or a comma list of "
        "budgets (80%, 0.8, 11GiB, or an integer: bytes, 1 is one byte)"
    )] = "0.3:1.0:0.05",
    method: Annotated[
        str, typer.Option("--method", "-m", help=METHOD_HELP)
    ] = "auto",
    option: OptionsOpt = None,
    resources: ResourcesOpt = None,
    host_memory: Annotated[
        str | None,
        typer.Option("--host-memory", help="Host memory for offloaded tensors, e.g. 256GiB "
                     "(sets host_memory_bytes of --resources)"),
    ] = None,
    time_limit: TimeLimitPerBudgetOpt = DEFAULT_SWEEP_TIME_LIMIT_S,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Parallel processes")] = 2,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Table as CSV")] = None,
    json_path: Annotated[Path | None, typer.Option("--json-out", help="Table as JSON")] = None,
    png_path: Annotated[
        Path | None, typer.Option("--png", help="Draw the Pareto plot (overhead vs budget) here")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Solve a range of budgets in parallel; overhead never rises with the budget.

    One request as `solve` makes it (method, --option, --resources, --host-memory), solved at
    each budget."""
    from rich.table import Table

    from planner.core.errors import InputError
    from planner.core.out_files import check_figure_path, check_output_path, write_text
    from planner.engine.inputs import load_graph
    from planner.engine.request import check_method, resolve_resources
    from planner.engine.sweep import parse_budgets, run_sweep, sweep_request
    from planner.solvers.baselines import store_all_peak_bytes

    options = method_options(option, method)
    check_method(method, options)  # unknown method or option: one line, before any process
    machine = resolve_resources(resources_input(resources))  # before the graph is read
    graph = load_graph(graph_path)
    check_output_path(csv_path, "CSV")  # bad output paths too, before the sweep's work
    check_output_path(json_path, "JSON table")
    check_figure_path(png_path, "Pareto plot")
    store_all = store_all_peak_bytes(graph)
    try:
        points_in = parse_budgets(budgets, store_all)
    except InputError as e:  # each budget of the list is said as the field `budget`
        raise e.renamed({"budget": "--budgets"}) from None
    request = sweep_request(graph, points_in, method=method, options=options, resources=machine,
                            host_memory=host_memory, time_limit=time_limit,
                            graph_where=str(graph_path))
    with sweep_progress(len(points_in), time_limit, jobs, quiet=as_json) as on_done:
        points = run_sweep(request, points_in, jobs=jobs, on_done=on_done)
    rows = _sweep_rows(points)
    if csv_path is not None:
        import csv
        import io

        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        write_text(csv_path, text.getvalue())
    if json_path is not None:
        import json

        write_text(json_path, json.dumps({"graph": str(graph_path), "method": method,
                                          "options": options,
                                          "resources": request.resources_document(),
                                          "store_all_peak_bytes": store_all, "points": rows},
                                         indent=1))
    if png_path is not None:
        _pareto_png(png_path, rows, str(graph_path))
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"{graph_path} — {method}, {time_limit:g} s per budget")
    for col in ("budget", "bytes", "status", "peak/budget", "overhead", "bound", "gap", "s"):
        table.add_column(col, justify="right")
    for r in rows:
        peak = r["peak_bytes"]
        table.add_row(
            "-" if r["fraction"] is None else f"{r['fraction']:.3f}",
            format_bytes(r["budget_bytes"]),
            str(r["status"]),
            "-" if peak is None else f"{peak / r['budget_bytes']:.3f}",
            _pct(r["overhead_percent"]), _pct(r["bound_overhead_percent"]),
            _pct(r["gap_percent"], signed=False), f"{r['wall_seconds']:.1f}",
        )
    console.print(table)


@contextmanager
def sweep_progress(total: int, time_limit_s: float, jobs: int, *, quiet: bool
                   ) -> Iterator[Callable[[int], None]]:
    """`run_sweep`'s on_done and its display: a bar with the elapsed time on a terminal, plain
    lines on stderr otherwise ('sweep: 12.0 s · 3/15 budgets done (20 s each, 2 at a time)')."""
    from planner.cli.output import progress_console
    from planner.cli.progress_view import work_status

    if quiet or not progress_console.is_terminal:
        done = [0]

        def say(detail_count: int) -> str:
            return (f"{detail_count}/{total} budgets done ({time_limit_s:g} s each, {jobs} at "
                    "a time)")

        with work_status("sweep", quiet=quiet, detail=say(0)) as status:

            def plain(_budget: int) -> None:
                done[0] += 1
                status.update(say(done[0]))

            yield plain
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(SpinnerColumn(), TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("budgets"), TimeElapsedColumn(), console=progress_console,
                  transient=True) as progress:
        task = progress.add_task("sweep", total=total)
        yield lambda _budget: progress.advance(task)


def _sweep_rows(points: list[Any]) -> list[dict[str, Any]]:
    """The sweep's table: one row per budget (planner.engine.sweep.SweepPoint)."""
    return [
        {
            "fraction": p.fraction,
            "budget_bytes": p.budget_bytes,
            "status": p.status,
            "peak_bytes": p.peak_bytes,
            "overhead_percent": None if p.overhead is None else 100 * p.overhead,
            "bound_overhead_percent": None if p.lower_bound_overhead is None
            else 100 * p.lower_bound_overhead,
            "gap_percent": None if p.gap is None else 100 * p.gap,
            "plan_from_budget_bytes": p.source_budget_bytes,
            "wall_seconds": round(p.wall_seconds, 3),
        }
        for p in points
    ]


def _pct(value: object, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f} %" if signed else f"{value:.3f} %"


def _pareto_png(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.engine.figures import save_figure
    from planner.engine.timeline_plot import byte_unit

    pts = [(r["budget_bytes"], r["overhead_percent"]) for r in rows
           if r["overhead_percent"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    size, unit = byte_unit(max((b for b, _ in pts), default=0))  # MiB for MiB-sized graphs
    if pts:
        xs = [float(b) / size for b, _ in pts]
        ax.step(xs, [o for _, o in pts], where="post", marker="o")
    ax.set_xlabel(f"memory budget ({unit})")
    ax.set_ylabel("compute overhead (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, 120)
