"""Pipeline commands: `partition` (a split over P devices with a schedule; --sweep over
micro-batch counts and schedules) and `memory` (model state per device under ZeRO, per rank of
a pipeline plan)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, get_args

import typer

from planner.cli.options import OptionsOpt, ResourcesOpt, method_options, resolve_resources
from planner.cli.output import console, key_value_table, print_json
from planner.core.budget import format_bytes
from planner.core.errors import InputError
from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.core.model_state import Optimizer, Precision
from planner.core.resources import PipelineSchedule

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.engine.partition import PartitionReport, StageRow
    from planner.engine.partition_sweep import SweepRow

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
GraphArg = Annotated[Path, typer.Argument(metavar="GRAPH", help="graph.json")]
ZeroOpt = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0-3 (shards over --dp)")]
DpOpt = Annotated[int | None, typer.Option("--dp", help="Data-parallel degree ZeRO shards over")]

# The engine names request fields; the CLI says them as its flags (InputError.renamed).
FLAGS = {"global_batch": "--global-batch", "devices": "--devices", "microbatches": "--microbatches",
         "device_memory": "--device-memory", "split": "--split", "method": "--method",
         "schedule": "--schedule", "chunks": "--chunks", "zero": "--zero", "dp": "--dp",
         "optimizer": "--optimizer", "precision": "--precision", "plan": "--plan",
         "host_memory": "--host-memory"}


def _flags(graph_path: Path) -> dict[str, str]:
    return {**FLAGS, "graph": str(graph_path)}


def register(app: typer.Typer) -> None:
    app.command("partition")(partition_cmd)
    app.command("memory")(memory_cmd)


def _csv(value: str, name: str, cast: type = str) -> list:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise InputError(f"{name} {value!r}: give a comma-separated list")
    try:
        return [cast(v) for v in items]
    except ValueError:
        raise InputError(f"{name} {value!r}: expected numbers, e.g. 4,8,16") from None


def _schedule_choice(value: str | None) -> str | None:
    """--schedule: one schedule, a comma list or auto (typer's own refusal wording)."""
    if value is None:
        return None
    from planner.solvers.pipeline.schedules import SCHEDULES

    names = [v.strip() for v in value.split(",")] if value != "auto" else []
    bad = [n for n in names if n not in SCHEDULES]
    if bad:
        raise typer.BadParameter(f"{bad[0]!r} is not one of "
                                 + ", ".join(f"'{c}'" for c in SCHEDULES)
                                 + " (or a comma list of them, or auto)")
    return value


SCHEDULE_METAVAR = "<" + "|".join(get_args(PipelineSchedule)) + ">[,...]|auto"


def partition_cmd(
    graph_paths: Annotated[
        list[Path], typer.Argument(metavar="GRAPH", help="graph.json; with --global-batch, "
                                   "one per micro-batch size (the count is chosen)")],
    devices: Annotated[int | None, typer.Option("--devices", "-p", help="Pipeline ranks")] = None,
    device_memory: Annotated[
        str | None, typer.Option("--device-memory", help="Memory per device: 80GiB, 40GB, bytes")
    ] = None,
    microbatches: Annotated[
        int | None, typer.Option("--microbatches", help="Micro-batches a step")
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option("--schedule", metavar=SCHEDULE_METAVAR, callback=_schedule_choice,
                     help="The pipeline schedule (default: that of --resources, else 1f1b); "
                     "auto or a comma list: the fastest (planned and simulated for each)"),
    ] = None,
    global_batch: Annotated[
        int | None,
        typer.Option("--global-batch", help="Samples a step: each GRAPH (traced at its batch "
                     "size b) runs global batch / b micro-batches; the fastest is chosen"),
    ] = None,
    method: Annotated[
        str, typer.Option("--method", "-m", help="dp, ilp, whole (split + per-stage "
                          "remat/offload), param-balanced, layer-balanced, compute-balanced "
                          "(or pipeline-dp, ...)")
    ] = "dp",
    option: OptionsOpt = None,
    chunks: Annotated[int | None, typer.Option(
        "--chunks", help="Stages per rank (interleaved; default 2): --option chunks=...")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option("--split", help="Your own split: the layers that start stages 1.., "
                     "e.g. h.4,h.8,h.12 (checked and simulated): --option split=..."),
    ] = None,
    resources: ResourcesOpt = None,
    zero: ZeroOpt = None,
    dp: DpOpt = None,
    time_limit: Annotated[float | None, typer.Option(
        "--time-limit", help=f"Solver seconds (default {DEFAULT_PIPELINE_TIME_LIMIT_S:g}; "
        "choosing the schedule or micro-batch count: for the whole choice, default 2 an "
        "option)")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="plan.json")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Schedule grid picture")] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Action lists as torch.distributed.pipelining's "
                                  "CSV")
    ] = None,
    sweep: Annotated[bool, typer.Option("--sweep", help="Sweep micro-batches x schedules")] = False,
    sweep_microbatches: Annotated[str, typer.Option("--sweep-microbatches")] = "4,8,16,32",
    sweep_schedules: Annotated[str, typer.Option("--sweep-schedules")] = "gpipe,1f1b,zb-h1",
    sweep_methods: Annotated[str | None, typer.Option("--sweep-methods")] = None,
    host_memory: Annotated[
        str | None,
        typer.Option("--host-memory", help="Host memory every rank may offload to, e.g. 256GiB "
                     "(with --resources naming the host links; method whole)"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Split a model into contiguous stages over devices so every rank fits its memory and the
    simulated step is fastest; prints the stage table (exit 3 when nothing fits).

    The graph is one micro-batch's training step: trace the model at the micro-batch size
    (batch / --microbatches). With --schedule auto (or a list) the schedule is chosen too; with
    --global-batch and one graph per micro-batch size, the micro-batch count as well.

    The method's options (`planner-cli methods`, pipeline-<method>) may be given with --option
    KEY=VALUE as for `solve`: chunks, split (comma-separated), schedules (as --schedule)."""
    from planner.core.out_files import check_figure_path, check_output_path
    from planner.engine.inputs import load_graph
    from planner.engine.partition import parse_device_memory, partition_plan
    from planner.engine.partition_sweep import sweep_partitions
    from planner.engine.request import with_host_memory

    for path, what in ((output, "plan"), (csv_out, "CSV")):
        check_output_path(path, what)  # before the search, not after it
    check_figure_path(plot, "schedule grid")
    graph_path = graph_paths[0]
    chunks, split, schedule = _with_options(method, option, chunks, split, schedule)
    graphs = [(str(path), load_graph(path)) for path in graph_paths]
    graph = graphs[0][1]
    memory = parse_device_memory(device_memory, "device_memory")
    try:
        machine = with_host_memory(resolve_resources(resources), host_memory)
    except InputError as e:
        raise e.renamed(_flags(graph_path)) from None
    common: dict[str, object] = dict(devices=devices, device_memory_bytes=memory,
                  chunks=chunks, resources=machine, zero_stage=zero, dp=dp)
    choosing = len(graphs) > 1 or global_batch is not None or \
        (schedule is not None and schedule not in get_args(PipelineSchedule))
    if choosing:
        if sweep or split:
            raise InputError("--sweep and --split take one graph and one schedule",
                             field="--sweep" if sweep else "--split")
        from planner.cli.job_choice_view import choose

        graph, report = choose(graphs, schedule=schedule, global_batch=global_batch,
                               microbatches=microbatches, method=method, as_json=as_json,
                               flags=_flags(graph_path), time_limit_s=time_limit, **common)
        _write_and_print(graph, report, output, csv_out, plot, as_json)
        return
    common["time_limit_s"] = time_limit if time_limit is not None else \
        DEFAULT_PIPELINE_TIME_LIMIT_S
    if sweep:
        rows = sweep_partitions(
            graph, microbatch_counts=_csv(sweep_microbatches, "--sweep-microbatches", int),
            schedules=_csv(sweep_schedules, "--sweep-schedules"),
            methods=_csv(sweep_methods, "--sweep-methods") if sweep_methods else [method],
            **common,
        )
        _print_sweep(rows, as_json)
        return
    try:
        report = partition_plan(graph, microbatches=microbatches, schedule=schedule,
                                method=method, split=_csv(split, "--split") if split else None,
                                **common)  # type: ignore[arg-type]
    except InputError as e:
        raise e.renamed(_flags(graph_path)) from None
    _write_and_print(graph, report, output, csv_out, plot, as_json)


def _with_options(method: str, items: list[str] | None, chunks: int | None, split: str | None,
                  schedule: str | None) -> tuple[int, str | None, str | None]:
    """(chunks, split, schedule) from their flags and `--option` items, typed from the
    pipeline method's spec (planner.engine.options); an option its own flag gives too, or a
    `schedules` no schedule list allows, is one line naming it."""
    from planner.engine.partition import pipeline_method

    try:
        spec = pipeline_method(method)
    except InputError as e:
        raise e.renamed(FLAGS) from None
    flags = {"chunks": ("--chunks", chunks), "split": ("--split", split),
             "schedules": ("--schedule", schedule)}
    options = method_options(items, spec.name, flags)
    defaults = {o.name: o.default for o in spec.option_specs()}
    chosen = options.get("schedules")
    if chosen is not None and schedule is None:  # --schedule's own callback checked that one
        try:
            _schedule_choice(chosen)
        except typer.BadParameter as e:
            raise InputError(str(e), field="options.schedules") from None
    return (int(options.get("chunks", defaults.get("chunks", 2))), options.get("split"),
            chosen)


def _write_and_print(graph: Graph, report: PartitionReport, output: Path | None,
                     csv_out: Path | None, plot: Path | None, as_json: bool) -> None:
    """plan.json, the action lists' CSV and the grid picture as asked; the stage table (or
    JSON, with the options when the schedule or count was chosen); exit 3 when it overflows."""
    plan = report.plan
    if output is not None:
        from planner.core.io import write_json

        write_json(output, plan)
    if csv_out is not None:
        from planner.core.out_files import write_text
        from planner.core.pipeline_actions import rank_actions_to_csv

        assert plan.rank_actions is not None
        write_text(csv_out, rank_actions_to_csv(plan.rank_actions))
    if plot is not None:
        from planner.engine.pipeline_plot import plot_schedule

        plot_schedule(graph, plan, plot)
    if as_json:
        chosen = {k: plan.details[k] for k in ("choice", "choice_proven") if k in plan.details}
        print_json({"plan": plan.model_dump(mode="json"), "fits": report.fits,
                    "stages": [vars(r) for r in report.rows], **chosen})
    else:
        _print_report(report)
        for path, what in ((output, "plan"), (csv_out, "CSV"), (plot, "schedule grid")):
            if path is not None:
                console.print(f"wrote {what} to {path}")
    if not report.fits:
        raise typer.Exit(3)


def _redo(row: StageRow) -> str:
    """What the stage reruns and offloads: micro-batches rerunning the whole stage (of all m),
    the modules its own unit plan recomputes (whole, or selectively: some calls' outputs
    kept) or offloads (all it saves, or some calls' outputs) and in how many micro-batches;
    its variants' plans and micro-batches; "-" only when it keeps everything."""
    parts = []
    of_m = f" of {row.microbatches}" if row.microbatches else ""
    if row.whole_rerun:
        parts.append(f"whole stage rerun in {len(row.whole_rerun)}{of_m} mb")
    elif row.recomputed and not row.unit_policies and not row.variants:
        parts.append(f"{row.recomputed}{of_m} mb")  # rows made without the stage's lists
    own = _module_parts(row.unit_policies, row.saved_ops, row.offload_ops)
    if own:
        varied = sum(len(mbs) for mbs, _ in row.variants)
        count = f"{row.microbatches - varied}{of_m}" if row.microbatches else "each"
        parts.append("; ".join(own) + f" (in {count} mb)")
    if row.host_bytes:
        parts.append(f"host {format_bytes(row.host_bytes)} x {row.inflight}")
    if row.full_backward:
        parts.append("B, not I and W")
    for microbatches, policies in row.variants:  # another unit plan in these micro-batches
        named = ", ".join(f"{m} {p}" for m, p in list(policies.items())[:3])
        more = " .." if len(policies) > 3 else ""
        parts.append(f"in mb {','.join(map(str, microbatches))}: {named or 'keep'}{more}")
    return "; ".join(parts) or "-"


def _module_parts(policies: dict[str, str], saved_ops: dict[str, list[str]],
                  offload_ops: dict[str, list[str]]) -> list[str]:
    """The modules a unit plan recomputes or offloads, by kind: 'recompute 2: a, b'."""
    kinds = {m: "selective" if p == "recompute" and saved_ops.get(m)
             else "offload part" if p == "offload" and offload_ops.get(m) else p
             for m, p in policies.items()}
    parts = []
    for policy in ("recompute", "selective", "offload", "offload part"):
        mods = [m for m, p in kinds.items() if p == policy]
        if mods:
            more = " .." if len(mods) > 3 else ""
            parts.append(f"{policy} {len(mods)}: {', '.join(mods[:3])}{more}")
    return parts


def _print_report(report: PartitionReport) -> None:
    from rich.table import Table

    plan = report.plan
    limit = report.memory_bytes
    d = plan.details
    table = Table(title=f"{plan.method}: {d['layers']} layers, {len(report.rows)} stages, "
                  f"{d['schedule']}, {d['microbatches']} micro-batches", title_justify="left")
    for col in ("stage", "rank", "modules", "params", "activations x in-flight",
                "recomputed / offloaded", "peak / limit", "compute ms/mb"):
        table.add_column(col, justify="left" if col == "modules" else "right", no_wrap=True)
    for r in report.rows:
        mods = r.modules[0] if len(r.modules) == 1 else f"{r.modules[0]} .. {r.modules[-1]}"
        mods += f" ({len(r.modules)})"
        over = limit is not None and r.rank_peak_bytes > limit
        peak = f"{format_bytes(r.rank_peak_bytes)} / {format_bytes(limit)}"
        table.add_row(str(r.stage_index), str(r.rank), mods, format_bytes(r.parameter_bytes),
                      f"{format_bytes(r.saved_bytes)} x {r.inflight}",
                      _redo(r),
                      f"[red]{peak} OVER[/red]" if over else peak, f"{r.compute_ms:.3f}")
    console.print(table)
    p = plan.predicted
    assert p is not None
    rows: list[tuple[str, object]] = [
        ("fits", "yes" if report.fits else "NO"),
        ("step time (simulated)", f"{p.makespan_ms:.4g} ms"),
        ("throughput", f"{p.throughput_per_s:.4g} micro-batches/s"),
        ("bubble", f"{100 * (p.bubble_fraction or 0):.1f}%"),
        ("largest rank peak", format_bytes(p.peak_bytes)),
        ("status", plan.status.value + (f", gap {100 * plan.gap:.2f}%" if plan.gap is not None
                                        else "")),
        ("solve time", f"{report.solve_seconds:.3f} s"),
    ]
    rows += [("note", n) for n in report.notes]
    console.print(key_value_table("predicted", rows))


def _print_sweep(rows: list[SweepRow], as_json: bool) -> None:
    if as_json:
        print_json([vars(r) for r in rows])
        return
    from rich.table import Table

    table = Table(title="partition sweep", title_justify="left")
    for col in ("schedule", "m", "method", "fits", "peak", "step (ms)", "mb/s", "bubble",
                "solve (s)", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.schedule, str(r.microbatches), r.method, "yes" if r.fits else "no",
            format_bytes(r.peak_bytes), f"{r.makespan_ms:.4g}" if r.makespan_ms else "-",
            f"{r.throughput_per_s:.4g}" if r.throughput_per_s else "-",
            f"{100 * r.bubble_fraction:.1f}%" if r.bubble_fraction is not None else "-",
            f"{r.solve_seconds:.3f}", r.note)
    console.print(table)


def memory_cmd(
    graph_path: GraphArg,
    zero: ZeroOpt = None,
    dp: DpOpt = None,
    optimizer: Annotated[Optimizer | None, typer.Option("--optimizer")] = None,
    precision: Annotated[Precision | None, typer.Option("--precision")] = None,
    plan_path: Annotated[
        Path | None, typer.Option("--plan", help="A pipeline plan: the breakdown per rank")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Model-state memory per device (parameters, gradients, optimizer state) under an
    optimizer, precision and ZeRO stage over a data-parallel degree; per rank with --plan."""
    from planner.engine.inputs import load_graph
    from planner.engine.pipeline_memory import device_breakdown, rank_breakdown, with_training_setup

    try:
        graph = with_training_setup(load_graph(graph_path), optimizer, precision, zero, dp)
        state = device_breakdown(graph)
        ranks = None
        if plan_path is not None:
            from planner.core.io import load_plan

            changed = any(x is not None for x in (optimizer, precision, zero, dp))
            ranks = rank_breakdown(graph, load_plan(plan_path), check_hash=not changed)
    except InputError as e:
        raise e.renamed(_flags(graph_path)) from None
    if as_json:
        print_json({
            "per_device": vars(state.per_device) | {"total_bytes": state.total_bytes},
            "optimizer": state.optimizer, "precision": state.precision,
            "zero_stage": state.zero_stage, "data_parallel_degree": state.data_parallel_degree,
            "per_module": {m or "(root)": b.total_bytes for m, b in state.per_module.items()},
            "ranks": [vars(r) | {"state": vars(r.state)} for r in ranks] if ranks else None,
        })
        return
    s = state.per_device
    title = ("model state per device" if not state.derived else
             f"model state per device: {state.optimizer}, {state.precision}, "
             f"ZeRO-{state.zero_stage} over {state.data_parallel_degree} data-parallel ranks")
    console.print(key_value_table(title, [
        ("parameters", format_bytes(s.parameters_bytes)),
        ("gradients", format_bytes(s.gradients_bytes)),
        ("optimizer state", f"{format_bytes(s.optimizer_bytes)} (fp32 master copy "
                            f"{format_bytes(s.master_weights_bytes)})"),
        ("total", f"{format_bytes(s.total_bytes)} ({s.total_bytes} B)"),
    ]))
    if ranks:
        from rich.table import Table

        table = Table(title="per pipeline rank", title_justify="left")
        for col in ("rank", "stages", "parameters", "gradients", "optimizer", "other",
                    "activations + transient", "peak"):
            table.add_column(col, justify="right")
        for r in ranks:
            table.add_row(str(r.rank), ",".join(map(str, r.stages)),
                          format_bytes(r.state.parameters_bytes),
                          format_bytes(r.state.gradients_bytes),
                          format_bytes(r.state.optimizer_bytes), format_bytes(r.other_bytes),
                          format_bytes(r.activations_bytes), format_bytes(r.peak_bytes))
        console.print(table)
