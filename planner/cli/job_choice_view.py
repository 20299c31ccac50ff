"""`partition --schedule auto / --global-batch`: plan every option (planner.engine.job_choice)
and print the options' table; `partition` writes and prints the chosen plan as any other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from planner.cli.output import console
from planner.core.errors import InputError

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.engine.job_choice import JobChoice
    from planner.engine.partition import PartitionReport


def choose(
    graphs: Sequence[tuple[str, Graph]],
    *,
    schedule: str | None,
    global_batch: int | None,
    microbatches: int | None,
    as_json: bool,
    flags: Mapping[str, str],
    **kwargs: object,
) -> tuple[Graph, PartitionReport]:
    """The chosen option's graph and report; the options' table printed (not with --json:
    the plan's details.choice carries it)."""
    from planner.engine.job_choice import choose_job
    from planner.engine.job_options import AUTO, parse_schedules

    try:
        choice = choose_job(graphs, global_batch=global_batch, microbatches=microbatches,
                            schedules=parse_schedules(schedule or AUTO),
                            **kwargs)  # type: ignore[arg-type]
    except InputError as e:
        raise e.renamed({**flags, "graph": "GRAPH", "schedules": "--schedule"}) from None
    if not as_json:
        _print_choice(choice)
    return graphs[choice.best.option.graph_index][1], choice.report


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
