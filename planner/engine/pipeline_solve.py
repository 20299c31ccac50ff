"""A pipeline method run by `solve()` and the service: the machine from the resources, the
partition by `partition_plan` (planner.engine.partition), or with the `schedules` option the
fastest of those schedules (planner.engine.job_choice); and the checks at submission."""

from __future__ import annotations

import time
from collections.abc import Mapping

from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.core.plan import Plan, PlanStatus, graph_reference
from planner.core.resources import Resources
from planner.engine.job_choice import choose_job
from planner.engine.job_options import parse_schedules
from planner.engine.partition import (
    given_split,
    machine,
    make_problem,
    partition_plan,
    pipeline_method,
    split_layers,
)
from planner.solvers.pipeline.methods import partitioner_name


def check_pipeline_request(graph: Graph, budget_bytes: int, method: str,
                           options: Mapping[str, object] | None,
                           resources: Resources | None) -> None:
    """At submission, what `solve_pipeline` would refuse before searching: the machine (devices,
    micro-batches, schedule), the problem (more stages than layers, a device below one layer's
    model state) and a given split; InputError naming the field."""
    chosen = pipeline_method(method).parse_options(options or {})
    p, memory, m, sched, res = machine(resources, None, budget_bytes, None, None)
    schedules = chosen_schedules(chosen)
    if schedules is not None:
        sched = schedules[0]  # each is checked when it is planned
    problem = make_problem(graph, devices=p, memory_bytes=memory, microbatches=m,
                           schedule=sched, chunks=chosen.chunks, resources=res)
    split = split_layers(chosen.split)
    if split is not None:
        given_split(problem, split)


def chosen_schedules(chosen: object) -> tuple[str, ...] | None:
    """The `schedules` option of a pipeline method's options (None: the resources' schedule);
    InputError when it names a wrong schedule or comes with a given split."""
    text = getattr(chosen, "schedules", None)
    if text is None:
        return None
    if getattr(chosen, "split", None) is not None:
        raise InputError("a given split runs one schedule: name one, or drop the split",
                         field="schedules")
    return parse_schedules(text)


def solve_pipeline(
    graph: Graph,
    budget_bytes: int,
    method: str,
    *,
    time_limit_s: float = DEFAULT_PIPELINE_TIME_LIMIT_S,
    threads: int = 2,
    options: Mapping[str, object] | None = None,
    resources: Resources | None = None,
) -> Plan:
    """`solve()` for a pipeline method: `budget_bytes` is each device's memory; devices,
    micro-batches and schedule come from `resources`, `chunks` from the options (and with the
    `schedules` option, the fastest of those schedules, planner.engine.job_choice). The plan
    `partition_plan` builds (kind pipeline, simulated); when no split fits, status infeasible
    with the least device memory that works in `details["smallest_feasible_bytes"]`."""
    spec = pipeline_method(method)
    chosen = spec.parse_options(options or {})
    started = time.perf_counter()
    try:
        schedules = chosen_schedules(chosen)
        if schedules is not None:  # the schedule chosen with the split
            m = machine(resources, None, budget_bytes, None, None)[2]
            return choose_job([("graph", graph)], microbatches=m, schedules=schedules,
                              device_memory_bytes=budget_bytes, method=spec.name,
                              chunks=chosen.chunks, resources=resources,
                              time_limit_s=time_limit_s, threads=threads).report.plan
        return partition_plan(graph, device_memory_bytes=budget_bytes, method=spec.name,
                              chunks=chosen.chunks, resources=resources,
                              time_limit_s=time_limit_s, threads=threads,
                              split=split_layers(chosen.split)).plan
    except NoPlanFits as e:
        _, _, _, _, machine_resources = machine(resources, None, budget_bytes, None, None)
        return Plan(graph_hash=graph.content_hash(), budget_bytes=budget_bytes,
                    resources=machine_resources, method=partitioner_name(spec.name),
                    status=PlanStatus.infeasible, wall_seconds=time.perf_counter() - started,
                    notes=[str(e)], details={"smallest_feasible_bytes": e.smallest_feasible_bytes},
                    **graph_reference(graph))
