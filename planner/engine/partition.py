"""Pipeline partitioning for the CLI and the service: validate, solve, simulate, report.

`partition_plan` checks the request (one line per mistake: 0 devices, more stages than layers,
micro-batches an interleaved schedule cannot divide, a device memory below one layer's model
state, a split naming a module the model does not have), runs a partitioner
(planner.solvers.pipeline: dp, ilp, or a baseline), builds the plan (kind pipeline: partition +
per-rank action lists with SEND/RECV) and judges it with planner.sim.simulator. A plan whose
ranks do not fit is never reported as feasible: dp and ilp raise NoPlanFits naming the rank
that overflows, by how much, and the least memory any contiguous split needs (proven with one
stage a rank, by the memory DP); baselines come back with `fits` False so they can be compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.core.budget import format_bytes, parse_budget_spec
from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.plan import Plan, PlanKind, PlanStatus, relative_gap
from planner.core.resources import Resources
from planner.sim.simulator import simulate
from planner.sim.step_memory import with_sharding
from planner.solvers.pipeline.baselines import BASELINES, baseline_partition
from planner.solvers.pipeline.dp import PartitionOutcome, dp_partition, least_memory_split
from planner.solvers.pipeline.ilp import ilp_partition
from planner.solvers.pipeline.problem import Candidate, PipelineProblem, Split
from planner.solvers.pipeline.schedules import SCHEDULES, check_schedule, stages_per_rank
from planner.solvers.pipeline.units import UnitChain

METHODS = ("dp", "ilp", *BASELINES)


@dataclass(frozen=True)
class StageRow:
    stage_index: int
    rank: int
    modules: list[str]
    parameter_bytes: int
    model_state_bytes: int
    saved_bytes: int  # activations per micro-batch
    inflight: int
    recomputed: int  # micro-batches recomputed (of all m)
    compute_ms: float  # forward + backward per micro-batch
    rank_peak_bytes: int


@dataclass(frozen=True)
class PartitionReport:
    plan: Plan
    rows: list[StageRow]
    fits: bool
    memory_bytes: int | None
    solve_seconds: float
    units: int
    notes: list[str] = field(default_factory=list)

    @property
    def makespan_ms(self) -> float:
        p = self.plan.predicted
        return p.makespan_ms or 0.0 if p is not None else 0.0


def parse_device_memory(value: str | int | None, name: str = "--device-memory") -> int | None:
    """'80GiB', '40GB' or a byte count; None stays None (unbounded)."""
    if value is None:
        return None
    spec = parse_budget_spec(value, name)
    if spec.needs_reference:
        raise InputError(f"{name} {value!r}: give bytes with a unit (80GiB, 40GB), not a fraction")
    assert spec.bytes is not None
    return spec.bytes


def machine(
    resources: Resources | None,
    devices: int | None,
    device_memory_bytes: int | None,
    microbatches: int | None,
    schedule: str | None,
) -> tuple[int, int | None, int, str, Resources]:
    """Flags over resources.json: (devices, memory, micro-batches, schedule, resources)."""
    base = resources or Resources()
    p = devices if devices is not None else (base.device_count if resources else None)
    if p is None:
        raise InputError("--devices: how many devices (pipeline ranks)? e.g. --devices 4")
    if p < 1:
        raise InputError(f"--devices {p}: a pipeline needs at least 1 device")
    memory = device_memory_bytes if device_memory_bytes is not None else base.device_memory_bytes
    m = microbatches if microbatches is not None else base.microbatches
    if microbatches is None and (resources is None or resources.microbatches == 1):
        raise InputError("--microbatches: how many micro-batches a step? e.g. --microbatches 8 "
                         "(or microbatches in resources.json)")
    sched = schedule or base.pipeline_schedule or "1f1b"
    if m < 1:
        raise InputError(f"--microbatches {m}: at least 1")
    res = base.model_copy(update={"device_count": p, "device_memory_bytes": memory,
                                  "microbatches": m, "pipeline_schedule": _schedule_field(sched)})
    return p, memory, m, sched, res


def _schedule_field(schedule: str) -> str | None:
    return schedule if schedule in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2") \
        else None


def sharded(graph: Graph, zero_stage: int | None, dp: int | None) -> Graph:
    if zero_stage is None and dp is None:
        return graph
    if graph.model_state is None:
        raise InputError("the graph has no model_state: --zero/--dp need per-parameter bytes "
                         "(trace the model again)")
    return graph.model_copy(update={"model_state": with_sharding(graph.model_state, zero_stage,
                                                                 dp)})


def make_problem(
    graph: Graph,
    *,
    devices: int,
    memory_bytes: int | None,
    microbatches: int,
    schedule: str,
    chunks: int = 2,
    resources: Resources | None = None,
) -> PipelineProblem:
    check_schedule(schedule, devices, microbatches, chunks)
    chain = UnitChain(graph)
    v = stages_per_rank(schedule, chunks)
    stages = devices * v
    if stages > chain.length:
        raise InputError(
            f"{stages} stages ({devices} devices x {v} a device) but the model has "
            f"{chain.length} layers ({', '.join(u.name for u in chain.units[:4])}"
            f"{', ...' if chain.length > 4 else ''}): use at most {chain.length // v} devices"
        )
    if memory_bytes is not None:
        heavy = max(chain.units, key=lambda u: u.model_state_bytes)
        if memory_bytes < heavy.model_state_bytes:
            raise InputError(
                f"device memory {format_bytes(memory_bytes)} is below the model state of layer "
                f"{heavy.name!r} alone ({format_bytes(heavy.model_state_bytes)}: weights, "
                "gradients, optimizer state): no split can fit; use larger devices or --zero/--dp"
            )
    return PipelineProblem(graph, chain, devices, microbatches, schedule, memory_bytes,
                           chunks=chunks, resources=resources)


def given_split(problem: PipelineProblem, starts: list[str]) -> Split:
    """A split from the module names that start stages 1.. (torch's split points)."""
    names = {k: u for u, group in enumerate(problem.chain.groups) for k in group}
    cuts = []
    for name in starts:
        if name not in names:
            known = ", ".join(list(names)[:6])
            raise InputError(f"--split {name!r}: the model has no such layer (layers: {known}, "
                             "...)")
        cuts.append(names[name])
    if len(cuts) != problem.stage_count - 1:
        raise InputError(f"--split: {len(cuts)} split points for {problem.stage_count} stages "
                         f"(give {problem.stage_count - 1})")
    if cuts != sorted(set(cuts)) or cuts[0] == 0:
        raise InputError("--split: split points must be distinct layers in forward order, after "
                         "the first layer")
    edges = [0, *cuts, problem.length]
    return Split(tuple((edges[s], edges[s + 1]) for s in range(problem.stage_count)))


def run_method(problem: PipelineProblem, method: str, time_limit_s: float,
               split: list[str] | None = None) -> PartitionOutcome:
    if split is not None:
        start = time.perf_counter()
        cand = problem.candidate(given_split(problem, split))
        return PartitionOutcome("given", cand, "feasible" if cand.fits else "infeasible",
                                wall_seconds=time.perf_counter() - start)
    if method == "dp":
        return dp_partition(problem)
    if method == "ilp":
        return ilp_partition(problem, time_limit_s=time_limit_s)
    if method in BASELINES:
        return baseline_partition(problem, method)
    raise InputError(f"--method {method}: use one of {', '.join(METHODS)}")


def no_fit_message(problem: PipelineProblem, outcome: PartitionOutcome) -> tuple[str, int]:
    """Which rank overflows by how much, and the least memory a contiguous split needs."""
    recompute = outcome.method == "ilp"
    least, split = least_memory_split(problem, recompute=recompute)
    cand = outcome.best if outcome.best is not None else problem.candidate(split, simulate=False)
    limit = problem.memory_bytes or 0
    worst = max(range(len(cand.peaks)), key=lambda r: cand.peaks[r])
    how = "every micro-batch recomputed" if recompute else "no recomputation"
    proof = "proven over all contiguous splits" if problem.stage_count == problem.ranks else \
        "the least found (interleaved)"
    msg = (
        f"no split of the {problem.length} layers over {problem.ranks} devices of "
        f"{format_bytes(limit)} fits under {problem.schedule} with {problem.microbatches} "
        f"micro-batches: rank {worst} needs {format_bytes(cand.peaks[worst])}, "
        f"{format_bytes(cand.peaks[worst] - limit)} over; the least device memory that works is "
        f"{format_bytes(least)} ({least} B; {how}, {proof})"
    )
    return msg, least


def partition_plan(
    graph: Graph,
    *,
    devices: int | None = None,
    device_memory_bytes: int | None = None,
    microbatches: int | None = None,
    schedule: str | None = None,
    method: str = "dp",
    chunks: int = 2,
    resources: Resources | None = None,
    zero_stage: int | None = None,
    dp: int | None = None,
    time_limit_s: float = 10.0,
    split: list[str] | None = None,
) -> PartitionReport:
    """Partition `graph` for the machine; raise InputError / NoPlanFits (dp, ilp, a split)."""
    if method not in METHODS:
        raise InputError(f"--method {method}: use one of {', '.join(METHODS)}")
    if schedule is not None and schedule not in SCHEDULES:
        raise InputError(f"--schedule {schedule}: use one of {', '.join(SCHEDULES)}")
    p, memory, m, sched, res = machine(resources, devices, device_memory_bytes, microbatches,
                                       schedule)
    graph = sharded(graph, zero_stage, dp)
    problem = make_problem(graph, devices=p, memory_bytes=memory, microbatches=m,
                           schedule=sched, chunks=chunks, resources=res)
    outcome = run_method(problem, method, time_limit_s, split)
    cand = outcome.best
    if cand is None or (not cand.fits and outcome.method in ("dp", "ilp", "given")):
        msg, least = no_fit_message(problem, outcome)
        raise NoPlanFits(msg, least)
    return _report(graph, problem, outcome, cand, res)


def _report(graph: Graph, problem: PipelineProblem, outcome: PartitionOutcome, cand: Candidate,
            resources: Resources) -> PartitionReport:
    status = PlanStatus(outcome.status) if cand.fits else PlanStatus.infeasible
    notes = list(outcome.notes)
    if graph.model_state is not None and graph.model_state.zero_stage:
        ms = graph.model_state
        notes.append(f"model state sharded: ZeRO-{ms.zero_stage} over {ms.data_parallel_degree} "
                     "data-parallel ranks (the plan's graph hash is of the sharded graph)")
    plan = Plan(
        kind=PlanKind.pipeline,
        graph_hash=graph.content_hash(),
        budget_bytes=problem.memory_bytes,
        resources=resources,
        method=outcome.method,
        backend=outcome.backend,
        status=status,
        objective=outcome.objective,
        lower_bound=outcome.lower_bound,
        gap=relative_gap(outcome.objective, outcome.lower_bound),
        wall_seconds=outcome.wall_seconds,
        partition=cand.partition,
        rank_actions=cand.rank_actions,
        notes=notes,
        details={"schedule": problem.schedule, "microbatches": problem.microbatches,
                 "chunks": problem.stage_count // problem.ranks, "layers": problem.length},
    )
    sim = simulate(graph, plan)  # the judge: the plan as written, replayed
    fits = problem.memory_bytes is None or sim.peak_bytes <= problem.memory_bytes
    if fits != cand.fits:  # the partitioner's exact peaks disagree with the simulator
        raise RuntimeError(f"per-rank peaks {cand.peaks} disagree with the simulator's "
                           f"{sim.per_rank_peak_bytes}")
    plan = plan.model_copy(update={"predicted": sim.predicted()})
    return PartitionReport(plan, stage_rows(problem, cand), fits, problem.memory_bytes,
                           outcome.wall_seconds, problem.length, notes)


def stage_rows(problem: PipelineProblem, cand: Candidate) -> list[StageRow]:
    rows = []
    for s, (i, j) in enumerate(cand.split.bounds):
        c = problem.costs(i, j, s)
        rank = cand.partition.rank_of(s)
        rows.append(StageRow(
            stage_index=s,
            rank=rank,
            modules=problem.chain.modules(i, j),
            parameter_bytes=sum(u.parameter_bytes for u in problem.chain.units[i:j]),
            model_state_bytes=c.model_state_bytes,
            saved_bytes=c.saved_bytes,
            inflight=problem.inflight[s],
            recomputed=len(problem.recomputed(s, cand.split.stored_of(s))),
            compute_ms=c.compute_ms,
            rank_peak_bytes=cand.peaks[rank],
        ))
    return rows


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
