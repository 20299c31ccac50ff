"""Commands that make plans: solve, demo, methods."""

from __future__ import annotations

from importlib import resources as package_files
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from planner.budget import format_bytes, parse_budget
from planner.cli.options import ResourcesOpt, resolve_resources
from planner.cli.output import console, key_value_table, print_json
from planner.errors import InputError, NoPlanFits

if TYPE_CHECKING:
    from planner.graph import Graph
    from planner.resources import Resources

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
BUNDLED_EXAMPLE = "resnet24.json"


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("demo")(demo)
    app.command("methods")(methods)


def run_solve(
    graph_path: Path | None,
    graph: Graph,
    budget: str | None,
    method: str,
    output: Path | None,
    time_limit: float,
    threads: int,
    seed: int,
    as_json: bool,
    options: dict[str, object] | None = None,
    resources: Resources | None = None,
) -> None:
    from planner.engine.reports import plan_summary, smallest_budget_tried
    from planner.engine.solve import solve
    from planner.io import write_json
    from planner.plan import PlanStatus
    from solvers.baselines import store_all_peak_bytes

    if budget is not None:
        budget_bytes = parse_budget(budget, store_all_peak_bytes(graph))
    elif resources is not None:
        budget_bytes = resources.require_device_memory_bytes("--resources")
    else:
        raise InputError("--budget: missing; give a budget (0.8, 11GiB) or --resources")
    plan = solve(graph, budget_bytes, method, time_limit_s=time_limit, threads=threads, seed=seed,
                 options=options, resources=resources)
    summary = plan_summary(plan, graph)
    fits = plan.status in (PlanStatus.optimal, PlanStatus.feasible)
    if fits and output is not None:
        write_json(output, plan)
        summary["output"] = str(output)
    if as_json:
        print_json(summary)
    else:
        peak = plan.predicted.peak_bytes if plan.predicted else None
        ratio = f" ({peak / budget_bytes:.3f})" if peak and budget_bytes else ""
        overhead = plan.predicted.overhead if plan.predicted else None
        rows = [
            ("status", plan.status.value),
            ("method / backend", f"{plan.method} / {plan.backend}"),
            ("peak vs budget", f"{format_bytes(peak)} / {format_bytes(budget_bytes)}{ratio}"),
            ("store-all peak", format_bytes(store_all_peak_bytes(graph))),
            ("compute overhead", "-" if overhead is None else f"{100 * overhead:+.3f} %"),
            ("gap to bound", "-" if plan.gap is None else f"{100 * plan.gap:.3f} %"),
            ("time", f"{plan.wall_seconds:.2f} s"),
        ]
        if resources is not None:
            rows.insert(3, ("resources", str(resources)))
        if fits and output is not None:
            rows.append(("plan written to", str(output)))
        console.print(key_value_table(str(graph_path or "graph"), rows))
        for note in plan.notes:
            console.print(f"note: {note}")
    if not fits:
        smallest = smallest_budget_tried(graph, plan)
        raise NoPlanFits(
            f"{graph_path or 'graph'}: no plan within {budget_bytes} bytes "
            f"({format_bytes(budget_bytes)}) from method {method} ({plan.status.value}); the "
            f"smallest budget that works for the methods tried is {smallest} bytes "
            f"({format_bytes(smallest)})",
            smallest,
        )


def solve_cmd(
    graph_path: Annotated[
        Path, typer.Argument(metavar="GRAPH", help="graph.json or a Checkmate node-link file")
    ],
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            "-b",
            help="Bytes, units (11.3GiB) or a fraction of the store-all peak (0.8); "
            "default: the device memory of --resources",
        ),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="See `planner-cli methods`")
    ] = "auto",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="plan.json to write")
    ] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Seconds")] = 60.0,
    threads: Annotated[int, typer.Option("--threads", min=1)] = 2,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: JsonFlag = False,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Solver for milp (cpsat, scip, highs, cbc, pulp-cbc) or lp-rounding "
            "(highs-lp, glop, pdlp)",
        ),
    ] = None,
    resources: ResourcesOpt = None,
) -> None:
    """Find a plan within the budget; exit 3 when none fits (with the smallest budget that does)."""
    from planner.engine.inputs import load_graph

    machine = resolve_resources(resources)
    graph = load_graph(graph_path)
    options: dict[str, object] | None = {"backend": backend} if backend else None
    run_solve(
        graph_path, graph, budget, method, output, time_limit, threads, seed, as_json, options,
        machine,
    )


def bundled_example_path() -> Path:
    return Path(str(package_files.files("planner") / "examples" / BUNDLED_EXAMPLE))


def demo(
    budget: Annotated[str, typer.Option("--budget", "-b")] = "0.7",
    method: Annotated[str, typer.Option("--method", "-m")] = "auto",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit")] = 20.0,
    as_json: JsonFlag = False,
) -> None:
    """Solve the bundled example graph (a 24-layer residual network) and print the plan summary."""
    from planner.engine.inputs import load_graph

    path = bundled_example_path()
    run_solve(path, load_graph(path), budget, method, output, time_limit, 2, 0, as_json)


def methods(as_json: JsonFlag = False) -> None:
    """List the planning methods."""
    from planner.engine.registry import method_names, method_target

    if as_json:
        print_json({name: method_target(name) for name in method_names()})
    else:
        for name in method_names():
            console.print(f"{name:16} {method_target(name)}")
