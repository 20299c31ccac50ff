"""`partition --schedule auto / --global-batch`: plan every option (planner.engine.job_choice),
print the options' table and the chosen plan's stages, write the chosen plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from planner.cli.output import console, print_json
from planner.core.errors import InputError

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.engine.job_choice import JobChoice


def choose_and_print(
    graphs: Sequence[tuple[str, Graph]],
    *,
    schedule: str | None,
    global_batch: int | None,
    microbatches: int | None,
    output: Path | None,
    as_json: bool,
    flags: Mapping[str, str],
    **kwargs: object,
) -> None:
    """Choose, print, write; exit 3 when the chosen plan does not fit (a baseline method)."""
    from planner.engine.job_choice import AUTO, AUTO_SCHEDULES, choose_job

    if schedule is None or schedule == AUTO:
        schedules: Sequence[str] = AUTO_SCHEDULES
    else:
        schedules = [s.strip() for s in schedule.split(",") if s.strip()]
    try:
        choice = choose_job(graphs, global_batch=global_batch, microbatches=microbatches,
                            schedules=schedules, **kwargs)  # type: ignore[arg-type]
    except InputError as e:
        raise e.renamed({**flags, "graph": "GRAPH"}) from None
    report = choice.report
    if output is not None:
        from planner.core.io import write_json

        write_json(output, report.plan)
    if as_json:
        print_json({"plan": report.plan.model_dump(mode="json"), "fits": report.fits,
                    "stages": [vars(r) for r in report.rows],
                    "choice": report.plan.details["choice"], "choice_proven": choice.proven})
    else:
        from planner.cli.pipeline_cmds import _print_report

        _print_choice(choice)
        _print_report(report)
        if output is not None:
            console.print(f"wrote plan to {output}")
    if not report.fits:
        raise typer.Exit(3)


def _print_choice(choice: JobChoice) -> None:
    from rich.table import Table

    from planner.core.budget import format_bytes

    best_ms = choice.best.step_ms or 0.0
    table = Table(title=f"options: {len(choice.results)}, chosen in {choice.wall_seconds:.1f} s"
                  + (" (proven fastest)" if choice.proven else ""), title_justify="left")
    for col in ("", "graph", "micro-batch", "m", "schedule", "fits", "step (ms)", "x best",
                "peak", "solve (s)", "note"):
        table.add_column(col, no_wrap=col not in ("note", "graph"))
    for r in choice.results:
        o, step = r.option, r.step_ms
        peak = r.report.plan.predicted.peak_bytes if r.report and r.report.plan.predicted \
            else None
        table.add_row(
            "*" if r.option == choice.best.option else "", o.graph_label,
            str(o.micro_batch_size or "-"), str(o.microbatches), o.schedule,
            "yes" if r.fits else "no", f"{step:.4g}" if step else "-",
            f"{step / best_ms:.3f}" if step and best_ms else "-",
            format_bytes(peak) if peak else "-", f"{r.solve_seconds:.2f}",
            ("proven; " if r.proven else "") + r.note)
    console.print(table)
