"""Pipeline partitioning for the CLI, the service and `solve()`: validate, solve, simulate,
report.

`partition_plan` checks the request (one line per mistake, naming its field: 0 devices, more
stages than layers, micro-batches an interleaved schedule cannot divide, a split naming a
module the model does not have), runs a pipeline method from the registry
(planner.solvers.pipeline.methods: pipeline-dp, pipeline-ilp or a baseline; "dp", "ilp" and
the baseline names say the same), builds the plan (kind pipeline: partition + per-rank action
lists with SEND/RECV) and judges it with planner.sim.simulator. (`solve()` and the service run
it through planner.engine.pipeline_solve.) A plan whose ranks do not fit is never reported as
feasible: dp and ilp raise NoPlanFits naming the rank that overflows, by how much, and the
least memory any contiguous split needs (proven with one stage a rank, by the memory DP);
baselines come back with `fits` False so they can be compared. A device memory below one
layer's model state is a valid budget that nothing fits: NoPlanFits with the least memory
that works too (`check_model_state`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.core.budget import format_bytes, parse_budget_spec
from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.core.pipeline_actions import PipelineOp, PipelineStage
from planner.core.plan import Plan, PlanKind, PlanStatus, graph_reference, relative_gap
from planner.core.resources import Resources
from planner.engine.registry import method_spec, method_specs
from planner.sim.simulator import simulate
from planner.sim.stage_policies import apply_unit_policies
from planner.sim.step_memory import with_sharding
from planner.solvers.pipeline.dp import least_memory_split
from planner.solvers.pipeline.methods import PREFIX, partitioner_name
from planner.solvers.pipeline.problem import Candidate, PartitionOutcome, PipelineProblem, Split
from planner.solvers.pipeline.schedules import SCHEDULES, check_schedule, stages_per_rank
from planner.solvers.pipeline.units import UnitChain
from planner.solvers.request import SolveRequest
from planner.solvers.spec import MethodSpec

# The partitioners' short names (dp, ilp, the baselines): the pipeline methods less "pipeline-".
METHODS = tuple(partitioner_name(spec.name) for spec in method_specs() if spec.pipeline)


@dataclass(frozen=True)
class StageRow:
    stage_index: int
    rank: int
    modules: list[str]
    parameter_bytes: int
    model_state_bytes: int
    saved_bytes: int  # activations per micro-batch
    inflight: int
    recomputed: int  # micro-batches whose backward reruns forward work (whole stage or modules)
    compute_ms: float  # forward + backward per micro-batch
    rank_peak_bytes: int
    unit_policies: dict[str, str] = field(default_factory=dict)  # module -> recompute/offload
    host_bytes: int = 0  # offloaded activations per micro-batch
    saved_ops: dict[str, list[str]] = field(default_factory=dict)  # selective modules' kept calls
    offload_ops: dict[str, list[str]] = field(default_factory=dict)  # partial offloads' moved calls
    # other unit plans for some micro-batches (PipelineStage.variants): (micro-batches, module
    # -> recompute/offload)
    variants: list[tuple[list[int], dict[str, str]]] = field(default_factory=list)
    full_backward: bool = False  # zero-bubble: one B a micro-batch, not I and W
    microbatches: int = 0  # of the step (the denominators the table states)
    whole_rerun: list[int] = field(default_factory=list)  # micro-batches rerunning the whole
    # stage (PipelineStage.recompute_microbatches: only its input kept)


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


def parse_device_memory(value: str | int | None, name: str = "device_memory") -> int | None:
    """'80GiB', '40GB' or a byte count; None stays None (unbounded). `name` is how the entry
    point calls the field (the budget grammar says it in its messages)."""
    if value is None:
        return None
    spec = parse_budget_spec(value, name)
    if spec.needs_reference:
        raise InputError(f"{value!r}: give bytes with a unit (80GiB, 40GB), not a fraction",
                         field=name)
    assert spec.bytes is not None
    return spec.bytes


def machine(
    resources: Resources | None,
    devices: int | None,
    device_memory_bytes: int | None,
    microbatches: int | None,
    schedule: str | None,
) -> tuple[int, int | None, int, str, Resources]:
    """The request's fields over resources.json: (devices, memory, micro-batches, schedule,
    resources)."""
    base = resources or Resources()
    p = devices if devices is not None else (base.device_count if resources else None)
    if p is None:
        raise InputError("how many devices (pipeline ranks)? e.g. 4", field="devices")
    if p < 1:
        raise InputError(f"a pipeline needs at least 1 device (got {p})", field="devices")
    memory = device_memory_bytes if device_memory_bytes is not None else base.device_memory_bytes
    m = microbatches if microbatches is not None else base.microbatches
    if microbatches is None and (resources is None or resources.microbatches == 1):
        raise InputError("how many micro-batches a step? e.g. 8 (or microbatches in "
                         "resources.json)", field="microbatches")
    sched = schedule or base.pipeline_schedule or "1f1b"
    if m < 1:
        raise InputError(f"at least 1 (got {m})", field="microbatches")
    res = base.model_copy(update={"device_count": p, "device_memory_bytes": memory,
                                  "microbatches": m, "pipeline_schedule": _schedule_field(sched)})
    return p, memory, m, sched, res


def _schedule_field(schedule: str) -> str | None:
    return schedule if schedule in SCHEDULES else None


def sharded(graph: Graph, zero_stage: int | None, dp: int | None) -> Graph:
    if zero_stage is None and dp is None:
        return graph
    if graph.model_state is None:
        raise InputError("no model_state: ZeRO sharding (zero, dp) needs per-parameter bytes "
                         "(trace the model again)", field="graph")
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
            f"{', ...' if chain.length > 4 else ''}): use at most {chain.length // v} devices",
            field="devices",
        )
    return PipelineProblem(graph, chain, devices, microbatches, schedule, memory_bytes,
                           chunks=chunks, resources=resources)


def check_model_state(problem: PipelineProblem, method: str) -> None:
    """NoPlanFits when the device memory is below one layer's model state (a valid budget, too
    small: no split fits), with the least device memory that works for `method`, as every
    other no-fit case states it: every micro-batch recomputed (ilp, whole) or none (the rest)."""
    memory = problem.memory_bytes
    heavy = max(problem.chain.units, key=lambda u: u.model_state_bytes)
    if memory is None or memory >= heavy.model_state_bytes:
        return
    recomputes = partitioner_name(method) in ("ilp", "whole")
    least, _ = least_memory_split(problem, recompute=recomputes)
    how = "every micro-batch recomputed" if recomputes else "no recomputation"
    raise NoPlanFits(
        f"{format_bytes(memory)} is below the model state of layer {heavy.name!r} alone "
        f"({format_bytes(heavy.model_state_bytes)}: weights, gradients, optimizer state), so "
        f"no split fits; the least device memory that works is {format_bytes(least)} "
        f"({least} B; {how}), or shard the model state with ZeRO (zero, dp)", least)


def given_split(problem: PipelineProblem, starts: list[str]) -> Split:
    """A split from the module names that start stages 1.. (torch's split points)."""
    names = {k: u for u, group in enumerate(problem.chain.groups) for k in group}
    cuts = []
    for name in starts:
        if name not in names:
            known = ", ".join(list(names)[:6])
            raise InputError(f"{name!r}: the model has no such layer (layers: {known}, ...)",
                             field="split")
        cuts.append(names[name])
    if len(cuts) != problem.stage_count - 1:
        raise InputError(f"{len(cuts)} split points for {problem.stage_count} stages "
                         f"(give {problem.stage_count - 1})", field="split")
    if cuts != sorted(set(cuts)) or cuts[0] == 0:
        raise InputError("split points must be distinct layers in forward order, after the "
                         "first layer", field="split")
    edges = [0, *cuts, problem.length]
    return Split(tuple((edges[s], edges[s + 1]) for s in range(problem.stage_count)))


def pipeline_method(method: str) -> MethodSpec:
    """The spec of a pipeline method, by its name ("pipeline-dp") or its partitioner's ("dp")."""
    spec = method_spec(PREFIX + partitioner_name(method))
    if spec is None or not spec.pipeline:
        raise InputError(f"no partitioner {method!r}; use one of {', '.join(METHODS)}",
                         field="method")
    return spec


def run_method(problem: PipelineProblem, method: str, time_limit_s: float,
               split: list[str] | None = None, threads: int = 2) -> PartitionOutcome:
    """The partition `method` (a pipeline method of the registry) finds, or `split` checked."""
    if split is not None:
        start = time.perf_counter()
        cand = problem.candidate(given_split(problem, split))
        return PartitionOutcome("given", cand, "feasible" if cand.fits else "infeasible",
                                wall_seconds=time.perf_counter() - start)
    spec = pipeline_method(method)
    # budget_bytes is not read by partitioners: the problem holds the device memory
    request = SolveRequest(problem.graph, problem.memory_bytes or 0, time_limit_s=time_limit_s,
                           threads=threads, pipeline=problem)
    outcome = spec.run(request).partition
    if outcome is None:
        raise RuntimeError(f"pipeline method {spec.name} returned no partition")
    return outcome


def no_fit_message(problem: PipelineProblem, outcome: PartitionOutcome) -> tuple[str, int]:
    """Which rank overflows by how much, and the least memory a contiguous split needs."""
    recompute = outcome.method in ("ilp", "whole")
    least, split = least_memory_split(problem, recompute=recompute)
    if outcome.method == "whole":  # its candidates include the plain splits: the smaller least
        plain = least_memory_split(problem)
        if plain[0] < least:
            (least, split), recompute = plain, False
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
    if outcome.method == "whole":  # its per-module policies are a different space: no proof
        msg = msg.replace("the least device memory that works is", "without per-module "
                          "policies the least is") + "; no per-module recompute/offload " \
            "choice the whole-job planner tried fits either"
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
    time_limit_s: float = DEFAULT_PIPELINE_TIME_LIMIT_S,
    split: list[str] | None = None,
    threads: int = 2,
    problems: dict[tuple[object, ...], PipelineProblem] | None = None,
) -> PartitionReport:
    """Partition `graph` for the machine; raise InputError (naming its field) / NoPlanFits
    (dp, ilp, a split). `problems`: problems built by earlier calls of this process (job
    choice), so planning the same request again goes on from the first search's caches."""
    pipeline_method(method)
    if schedule is not None and schedule not in SCHEDULES:
        raise InputError(f"no schedule {schedule!r}; use one of {', '.join(SCHEDULES)}",
                         field="schedule")
    p, memory, m, sched, res = machine(resources, devices, device_memory_bytes, microbatches,
                                       schedule)
    # the graph by identity: the caller holds it for as long as the memo
    key = (id(graph), p, memory, m, sched, chunks, res.model_dump_json(), zero_stage, dp)
    problem = problems.get(key) if problems is not None else None
    if problem is None:
        problem = make_problem(sharded(graph, zero_stage, dp), devices=p, memory_bytes=memory,
                               microbatches=m, schedule=sched, chunks=chunks, resources=res)
        if problems is not None:
            problems[key] = problem
    graph = problem.graph
    check_model_state(problem, method)
    outcome = run_method(problem, method, time_limit_s, split, threads)
    cand = outcome.best
    if cand is None or (not cand.fits and outcome.method in ("dp", "ilp", "given")):
        msg, least = no_fit_message(problem, outcome)
        raise NoPlanFits(msg, least)
    return _report(graph, problem, outcome, cand, res)


def split_layers(text: str | None) -> list[str] | None:
    """The `split` option ("h.2,h.4": the layers that start stages 2..) as a list."""
    return None if text is None else [name.strip() for name in text.split(",") if name.strip()]


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
        **graph_reference(graph),
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
    """Per stage what it holds; under a whole-job plan's unit policies the effective figures
    (planner.sim.stage_policies, the simulator's own rule)."""
    plain = [problem.costs(i, j, s) for s, (i, j) in enumerate(cand.split.bounds)]
    effective = apply_unit_policies(problem.graph, cand.partition, plain, problem.resources)
    full = {a.stage_index for row in cand.rank_actions for a in row
            if a.op is PipelineOp.backward} if problem.plan_schedule.split_backward else set()
    rows = []
    m = problem.microbatches
    for s, (i, j) in enumerate(cand.split.bounds):
        c, e = plain[s], effective[s]
        rank = cand.partition.rank_of(s)
        stage = cand.partition.stage(s)
        rows.append(StageRow(
            stage_index=s,
            rank=rank,
            modules=problem.chain.modules(i, j),
            parameter_bytes=sum(u.parameter_bytes for u in problem.chain.units[i:j]),
            model_state_bytes=c.model_state_bytes,
            saved_bytes=e.costs.saved_bytes,
            inflight=problem.inflight[s],
            recomputed=len(_rerunning(stage, m)),
            compute_ms=e.costs.compute_ms,
            rank_peak_bytes=cand.peaks[rank],
            unit_policies={k: v for k, v in stage.unit_policies.items() if v != "keep"},
            host_bytes=e.host_bytes,
            saved_ops=dict(stage.unit_saved_ops),
            offload_ops=dict(stage.unit_offload_ops),
            variants=[(list(v.microbatches), {k: p for k, p in v.unit_policies.items()
                                              if p != "keep"})
                      for v in stage.variants],
            full_backward=s in full,
            microbatches=m,
            whole_rerun=sorted(stage.recompute_microbatches),
        ))
    return rows


def _rerunning(stage: PipelineStage, microbatches: int) -> set[int]:
    """The micro-batches whose backward reruns some forward work: the whole stage (its
    recompute_microbatches), or modules its own unit plan or a variant's recomputes."""
    out = set(stage.recompute_microbatches)
    varied = {mb for v in stage.variants for mb in v.microbatches}
    if "recompute" in stage.unit_policies.values():
        out |= set(range(microbatches)) - varied
    for v in stage.variants:
        if "recompute" in v.unit_policies.values():
            out |= set(v.microbatches)
    return out
