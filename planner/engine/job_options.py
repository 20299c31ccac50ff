"""The options a job choice plans (planner.engine.job_choice): each graph (one micro-batch
size) under each schedule, with its micro-batch count from the global batch; and the work bound
and textbook-bubble estimate that order them and rule them out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.budget import format_bytes
from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.solvers.pipeline.schedules import SCHEDULES
from planner.solvers.pipeline.units import UnitChain

AUTO = "auto"
# The schedules `auto` tries (zb-h2 keeps up to twice 1F1B's in-flight micro-batches: a
# choice for the memory-rich, tried too).
AUTO_SCHEDULES: tuple[str, ...] = SCHEDULES


def parse_schedules(text: str) -> tuple[str, ...]:
    """'auto' (every schedule) or a comma list of schedule names; InputError naming a wrong
    one."""
    if text.strip() == AUTO:
        return AUTO_SCHEDULES
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if name not in SCHEDULES:
            raise InputError(f"no schedule {name!r}; use auto or one of {', '.join(SCHEDULES)}",
                             field="schedules")
    if not names:
        raise InputError("give auto or schedules comma-separated, e.g. 1f1b,zb-h1",
                         field="schedules")
    return names


@dataclass(frozen=True)
class JobOption:
    """A way to run the step: which graph (its micro-batch size), how many micro-batches a step
    and the schedule."""

    graph_index: int
    graph_label: str
    micro_batch_size: int | None
    microbatches: int
    schedule: str

    def text(self) -> str:
        size = f"micro-batch {self.micro_batch_size} x " if self.micro_batch_size else ""
        return f"{size}{self.microbatches} micro-batches, {self.schedule}"


def job_options(
    graphs: Sequence[tuple[str, Graph]],
    *,
    global_batch: int | None,
    microbatches: int | None,
    schedules: Sequence[str],
) -> tuple[list[JobOption], list[str]]:
    """Every (graph, schedule) option with its micro-batch count; and notes on the graphs no
    count fits (the global batch not a multiple of their micro-batch size). InputError (naming
    the field) when the request cannot say the counts."""
    for s in schedules:
        if s not in SCHEDULES:
            raise InputError(f"no schedule {s!r}; use auto or one of {', '.join(SCHEDULES)}",
                             field="schedule")
    if global_batch is None and len(graphs) > 1:
        raise InputError(f"{len(graphs)} graphs, one per micro-batch size: give the global "
                         "batch (each graph runs global batch / its batch size micro-batches)",
                         field="global_batch")
    if global_batch is not None and global_batch < 1:
        raise InputError(f"at least 1 sample a step (got {global_batch})", field="global_batch")
    if global_batch is not None and microbatches is not None:
        raise InputError("give the micro-batch count or the global batch, not both (the count "
                         "is global batch / the graph's batch size)", field="microbatches")
    _check_same_model(graphs)
    counts, notes = [], []
    sizes: dict[int, str] = {}
    for k, (label, graph) in enumerate(graphs):
        b = graph.metadata.batch_size
        if global_batch is None:
            counts.append((k, b, microbatches))
            continue
        if b is None:
            raise InputError(f"{label}: no batch size recorded (metadata.batch_size): trace it "
                             "with planner-cli trace --batch-size, or give --microbatches",
                             field="graph")
        if b in sizes:
            raise InputError(f"{label} and {sizes[b]} are both traced at micro-batch size {b}: "
                             "give one graph per size", field="graph")
        sizes[b] = label
        if global_batch % b:
            notes.append(f"{label}: micro-batch size {b} does not divide the global batch "
                         f"{global_batch}; skipped")
            continue
        counts.append((k, b, global_batch // b))
    if not counts:
        raise InputError(f"no graph's micro-batch size divides the global batch {global_batch}",
                         field="global_batch")
    options = [JobOption(k, graphs[k][0], b, m, s)  # type: ignore[arg-type]
               for k, b, m in counts for s in schedules]
    return options, notes


def _check_same_model(graphs: Sequence[tuple[str, Graph]]) -> None:
    """The graphs must be one model at several micro-batch sizes: same parameters."""
    def params(graph: Graph) -> int:
        state = graph.model_state
        if state is None:
            return graph.fixed.parameters_bytes
        return sum(p.bytes for p in state.parameters)

    first_label, first = graphs[0]
    for label, graph in graphs[1:]:
        if params(graph) != params(first):
            raise InputError(
                f"{label}: {format_bytes(params(graph))} of parameters where {first_label} has "
                f"{format_bytes(params(first))}: give graphs of one model at several micro-batch "
                "sizes", field="graph")


def work_bound_ms(graph: Graph, microbatches: int, ranks: int) -> float:
    """No schedule or plan steps faster than every rank busy all step with an equal share of
    the m micro-batches' compute (recomputation and copies only add)."""
    units = UnitChain(graph).units
    return microbatches * sum(u.forward_ms + u.backward_ms for u in units) / ranks


# Idle slots of a pipeline step, in one micro-batch's stage time, by schedule (P ranks, v
# chunks): the textbook bubbles (GPipe and 1F1B P - 1, interleaved (P - 1) / v, ZB-H1 about a
# third of 1F1B's, ZB-H2 about none). Only the order options are tried in comes from them.
BUBBLE_SLOTS = {"gpipe": lambda p, v: p - 1, "1f1b": lambda p, v: p - 1,
                "interleaved-1f1b": lambda p, v: (p - 1) / v, "zb-h1": lambda p, v: (p - 1) / 3,
                "zb-h2": lambda p, v: 0.0}


def estimated_step_ms(option: JobOption, work_ms: float, ranks: int, chunks: int) -> float:
    """The work bound with the schedule's textbook bubble: which options to try first (memory,
    recomputation and copies left out)."""
    slots = BUBBLE_SLOTS.get(option.schedule, lambda p, v: p - 1)(ranks, chunks)
    return work_ms * (option.microbatches + slots) / option.microbatches
