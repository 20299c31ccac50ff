"""A sweep of partition plans: micro-batch counts x schedules x methods, one row each
(`planner-cli partition --sweep`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.core.budget import format_bytes
from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.engine.partition import partition_plan


@dataclass(frozen=True)
class SweepRow:
    schedule: str
    microbatches: int
    method: str
    fits: bool
    peak_bytes: int | None  # the largest rank's
    makespan_ms: float | None
    throughput_per_s: float | None
    bubble_fraction: float | None
    solve_seconds: float
    note: str = ""


def sweep_partitions(
    graph: Graph,
    *,
    microbatch_counts: list[int],
    schedules: list[str],
    methods: list[str],
    **kwargs: object,
) -> list[SweepRow]:
    """partition_plan over micro-batch counts x schedules x methods; a row per combination
    (bad combinations, e.g. an interleaved schedule m cannot divide, say why in `note`)."""
    rows = []
    for schedule in schedules:
        for m in microbatch_counts:
            for method in methods:
                start = time.perf_counter()
                try:
                    r = partition_plan(graph, microbatches=m, schedule=schedule, method=method,
                                       **kwargs)  # type: ignore[arg-type]
                except NoPlanFits as e:
                    rows.append(SweepRow(schedule, m, method, False, None, None, None, None,
                                         time.perf_counter() - start,
                                         f"least memory {format_bytes(e.smallest_feasible_bytes)}"))
                    continue
                except InputError as e:
                    rows.append(SweepRow(schedule, m, method, False, None, None, None, None, 0.0,
                                         str(e)))
                    continue
                pred = r.plan.predicted
                assert pred is not None
                rows.append(SweepRow(schedule, m, method, r.fits, pred.peak_bytes,
                                     pred.makespan_ms, pred.throughput_per_s,
                                     pred.bubble_fraction, r.solve_seconds,
                                     "" if r.fits else (r.notes[0] if r.notes else "overflows")))
    return rows
