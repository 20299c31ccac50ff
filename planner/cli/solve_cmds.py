"""Commands that make plans: solve, demo, methods.

With a machine that has a host tier (`--resources`), plans may copy activations to the host:
the summary then shows the bytes moved each way, the copy time hidden behind compute and
exposed (compute waiting), the host peak against the host budget and the makespan
(planner.engine.transfer_report)."""

from __future__ import annotations

import sys
from importlib import resources as package_files
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from planner.cli.options import (
    BUDGET_HELP,
    METHOD_HELP,
    OptionsOpt,
    RequestTimeLimitOpt,
    ResourcesOpt,
    SeedOpt,
    ThreadsOpt,
    TimeLimitOpt,
    method_options,
    resources_input,
)
from planner.cli.output import console, key_value_table, print_json
from planner.core.budget import format_bytes
from planner.core.errors import InputError, NoPlanFits

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.core.plan import Plan
    from planner.core.resources import Resources
    from planner.engine.request import ResolvedRequest
    from planner.engine.transfer_report import TransferFigures

EXIT_SOLVER_ERROR = 1  # the README's exit codes: 0 ok, 1 solver error, 2 bad input, 3 no plan
JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
BUNDLED_EXAMPLE = "resnet24.json"


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("demo")(demo)
    app.command("methods")(methods)


def run_solve(
    request: ResolvedRequest, where: str, output: Path | None = None, as_json: bool = False
) -> None:
    """Solve a resolved request (planner.engine.request), print its summary (or --json), write
    the plan, and exit as the README says: 1 solver error, 3 no plan fits."""
    from planner.cli.progress_view import solve_progress
    from planner.core.io import write_json
    from planner.core.plan import PlanStatus
    from planner.engine.reports import plan_summary

    graph, method = request.graph, request.method
    with solve_progress(graph.total_compute_ms, quiet=as_json, label=method,
                        time_limit_s=request.time_limit_s) as progress:
        plan = request.solve(progress=progress)
    summary = plan_summary(plan, graph)  # transfer figures included (transfer_summary)
    fits = plan.status in (PlanStatus.optimal, PlanStatus.feasible)
    known = None if fits else _smallest_known(
        plan, method, None if plan.fsdp is not None else _least_baseline(graph))
    if known is not None:
        summary["smallest_known_budget_bytes"], summary["smallest_known_budget_by"] = known
    written = output if fits else None
    if written is not None:
        write_json(written, plan)
        summary["output"] = str(written)
    if as_json:
        print_json(summary)
    else:
        _print_plan(where, plan, request, written)
    if plan.status is PlanStatus.error:
        # The judge refused the method's answer (an invalid plan, or a bound that a known plan
        # contradicts): a solver fault, not "no plan fits".
        reason = plan.notes[-1] if plan.notes else "the method's answer was refused"
        print(f"error: solver error ({method}/{plan.backend}): {reason}", file=sys.stderr)
        raise typer.Exit(EXIT_SOLVER_ERROR)
    if not fits:
        _check_host_budget(plan, method, request.resources)
        assert known is not None
        raise _no_plan_fits(where, plan, method, request.budget_bytes, known)


def _print_plan(where: str, plan: Plan, request: ResolvedRequest, written: Path | None) -> None:
    """The summary table and the plan's notes."""
    from planner.engine.transfer_report import transfer_figures
    from planner.solvers.baselines import store_all_peak_bytes

    budget_bytes = request.budget_bytes
    peak = plan.predicted.peak_bytes if plan.predicted else None
    ratio = f" ({peak / budget_bytes:.3f})" if peak and budget_bytes else ""
    overhead = plan.predicted.overhead if plan.predicted else None
    rows = [
        ("status", plan.status.value),
        ("method / backend", f"{plan.method} / {plan.backend}"),
        ("peak vs budget", f"{format_bytes(peak)} / {format_bytes(budget_bytes)}{ratio}"),
        ("store-all peak", format_bytes(store_all_peak_bytes(request.graph))),
        ("compute overhead", "-" if overhead is None else f"{100 * overhead:+.3f} %"),
        ("gap to bound", "-" if plan.gap is None else f"{100 * plan.gap:.3f} %"),
        ("time", f"{plan.wall_seconds:.2f} s"),
    ]
    if request.resources is not None:
        rows.insert(3, ("resources", str(request.resources)))
    if plan.fsdp is not None:  # one FSDP2 rank: its settings and simulated step
        step = plan.predicted.makespan_ms if plan.predicted else None
        rows[2] = ("peak per rank vs budget", rows[2][1])
        del rows[3]  # the one-device store-all peak says nothing of a rank
        rows[3:3] = [("fsdp plan", f"{plan.fsdp.text} ({plan.fsdp.ranks} ranks, "
                                   f"{plan.fsdp.collectives})"),
                     ("step (simulated)", "-" if step is None else f"{step:.3f} ms")]
    transfers = transfer_figures(plan, request.graph)
    if transfers is not None:
        rows[-1:-1] = transfer_rows(transfers)
    if written is not None:
        rows.append(("plan written to", str(written)))
    console.print(key_value_table(where, rows))
    for note in plan.notes:
        console.print(f"note: {note}")


def transfer_rows(t: TransferFigures) -> list[tuple[str, str]]:
    """Summary rows of a plan with host copies."""
    host_budget = "" if t.host_memory_bytes is None else f" / {format_bytes(t.host_memory_bytes)}"
    share = f" ({100 * t.transfer_hidden_ms / t.transfer_ms:.0f} % hidden)" if t.transfer_ms else ""
    return [
        ("moved d2h / h2d", f"{format_bytes(t.d2h_bytes)} in {t.offloads} offloads / "
                            f"{format_bytes(t.h2d_bytes)} in {t.prefetches} prefetches"),
        ("transfers hidden / exposed", f"{t.transfer_hidden_ms:.3f} ms / "
                                       f"{t.transfer_exposed_ms:.3f} ms{share}"),
        ("host peak / host budget", f"{format_bytes(t.host_peak_bytes)}{host_budget}"),
        ("makespan", f"{t.makespan_ms:.3f} ms"),
    ]


def _check_host_budget(plan: Plan, method: str, resources: Resources | None) -> None:
    """Bad input (exit 2): the method's plan fits the device but parks more on the host at once
    than the host budget holds."""
    need = plan.details.get("least_host_memory_bytes")
    if need is None or resources is None or resources.host_memory_bytes is None:
        return
    have = resources.host_memory_bytes
    if int(need) > have:
        raise InputError(
            f"--resources: host_memory_bytes {have} ({format_bytes(have)}) is smaller than what "
            f"method {method}'s plan parks on the host at once, {int(need)} bytes "
            f"({format_bytes(int(need))}): give --host-memory of at least that, or a larger "
            "--budget"
        )


def _least_baseline(graph: Graph) -> tuple[int, str]:
    """(peak, name) of the baseline that fits the least budget: a budget known to work."""
    import time

    from planner.engine.deadline import least_baseline
    from planner.solvers.baselines import store_all_peak_bytes

    least = least_baseline(graph, time.perf_counter() + 2.0)
    return (least.peak_bytes, least.name) if least is not None else (
        store_all_peak_bytes(graph), "store-all")


def _smallest_known(plan: Plan, method: str,
                    baseline: tuple[int, str] | None) -> tuple[int, str]:
    """(bytes, who): the least budget known to work, from the method's report or a baseline
    (None: no one-device baseline applies, as for an FSDP rank)."""
    own = plan.details.get("smallest_feasible_bytes")
    if baseline is None:
        return (0 if own is None else int(own)), f"method {method}"
    least, name = baseline
    if own is not None and int(own) < least:
        return int(own), f"method {method}"
    return least, f"baseline {name}"


def _no_plan_fits(
    where: str, plan: Plan, method: str, budget_bytes: int, known: tuple[int, str]
) -> NoPlanFits:
    """One line: the method's own best plan (when it made one) and the least budget known to
    work, named as in the --json summary (peak_bytes, smallest_known_budget_bytes)."""
    parts = [
        f"{where}: no plan within {budget_bytes} bytes ({format_bytes(budget_bytes)}) from "
        f"method {method} ({plan.status.value})"
    ]
    peak = plan.predicted.peak_bytes if plan.predicted is not None else None
    if peak is not None and peak > budget_bytes:
        parts.append(f"its best plan peaks at {peak} bytes ({format_bytes(peak)})")
    smallest, by = known
    parts.append(
        f"the smallest budget known to work is {smallest} bytes ({format_bytes(smallest)}, "
        f"found by {by})"
    )
    return NoPlanFits("; ".join(parts), smallest)


def solve_cmd(
    graph_path: Annotated[
        Path, typer.Argument(metavar="GRAPH", help="graph.json or a Checkmate node-link file")
    ],
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            "-b",
            help=BUDGET_HELP + "; default: the device memory of --resources",
        ),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help=METHOD_HELP)
    ] = "auto",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="plan.json to write")
    ] = None,
    time_limit: RequestTimeLimitOpt = None,
    threads: ThreadsOpt = 2,
    seed: SeedOpt = 0,
    as_json: JsonFlag = False,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Solver for milp (cpsat, scip, highs, cbc, pulp-cbc), lp-rounding "
            "(highs-lp, glop, pdlp) or offload-milp (scip, highs, cbc, cpsat): the same as "
            "--option backend=...",
        ),
    ] = None,
    option: OptionsOpt = None,
    fsdp: Annotated[
        int | None,
        typer.Option(
            "--fsdp", min=1,
            help="Plan an FSDP2 job over N ranks (--budget per rank): the same as --method "
            "fsdp --option ranks=N; the graph needs its FSDP block profile (trace --fsdp-ranks)",
        ),
    ] = None,
    resources: ResourcesOpt = None,
    host_memory: Annotated[
        str | None,
        typer.Option(
            "--host-memory",
            help="Host memory for offloaded tensors, e.g. 256GiB (sets host_memory_bytes of "
            "--resources; presets leave it unset)",
        ),
    ] = None,
) -> None:
    """Find a plan within the budget; exit 3 when none fits (with the smallest budget that does).

    The method's options (`planner-cli methods`) are given with --option KEY=VALUE, e.g.
    `--method auto --option space=compiled`."""
    from planner.core.out_files import check_output_path
    from planner.engine.inputs import load_graph
    from planner.engine.request import resolve_request, resolve_resources

    check_output_path(output, "plan")  # said before the solve, not after it
    if fsdp is not None:
        if method not in ("auto", "fsdp"):
            raise InputError(f"--fsdp plans with method fsdp, not {method!r}: drop --method",
                             field="--fsdp")
        method = "fsdp"
    try:
        options = method_options(option, method, {"backend": ("--backend", backend)})
        if fsdp is not None:
            if options.get("ranks", fsdp) != fsdp:
                raise InputError(f"--fsdp {fsdp} and --option ranks={options['ranks']} differ",
                                 field="--fsdp")
            options = {**options, "ranks": fsdp}
        machine = resolve_resources(resources_input(resources))  # before the graph is read
        request = resolve_request(
            load_graph(graph_path), budget, resources=machine, host_memory=host_memory,
            method=method, options=options, time_limit=time_limit, threads=threads, seed=seed,
            graph_where=str(graph_path),
        )
    except InputError as e:  # options.backend given by --backend: said as that flag
        if backend is not None and e.field == "options.backend":
            raise InputError(e.detail, field="--backend") from None
        raise
    run_solve(request, str(graph_path), output, as_json)


def bundled_example_path() -> Path:
    return Path(str(package_files.files("planner") / "examples" / BUNDLED_EXAMPLE))


def demo(
    budget: Annotated[str, typer.Option("--budget", "-b", help=BUDGET_HELP)] = "70%",
    method: Annotated[str, typer.Option("--method", "-m", help=METHOD_HELP)] = "auto",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    time_limit: TimeLimitOpt = 20.0,
    as_json: JsonFlag = False,
) -> None:
    """Solve the bundled example graph (a 24-layer residual network) and print the plan summary."""
    from planner.engine.inputs import load_graph
    from planner.engine.request import resolve_request

    path = bundled_example_path()
    request = resolve_request(load_graph(path), budget, method=method, time_limit=time_limit,
                              graph_where=str(path))
    run_solve(request, str(path), output, as_json)


def methods(as_json: JsonFlag = False) -> None:
    """List the planning methods: what each does, the plans it returns, its options."""
    from planner.engine.registry import describe_methods, method_names, method_spec, method_target

    if as_json:  # each built-in method's spec (what /v1/methods serves); plugins by target
        print_json(describe_methods())
        return
    for name in method_names():
        spec = method_spec(name)
        if spec is None:
            console.print(f"{name}  plugin {method_target(name)}", highlight=False, markup=False)
            continue
        needs = (", needs a host tier" if spec.needs_host_tier else "") + (
            ", claims bounds" if spec.claims_bounds else "")
        console.print(f"{name}  {spec.summary} (plans: {', '.join(spec.plan_kinds)}{needs})",
                      highlight=False, markup=False)
        for option_name, text in spec.option_help().items():
            console.print(f"    {option_name}: {text}", highlight=False, markup=False)
