"""Pipeline partitioners as planning methods, with their specs (planner.solvers.spec):
`pipeline-dp`, `pipeline-ilp`, `pipeline-whole` (split and per-stage remat/offload together)
and `pipeline-<baseline>` for each balanced split of planner.solvers.pipeline.baselines.

Each runs on the problem the engine built and checked (`SolveRequest.pipeline`: ranks,
micro-batches, schedule, device memory; planner.engine.partition) and hands back the
partitioner's outcome in `MethodResult.partition`; the engine builds the plan (kind pipeline)
from it and judges it with the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.core.errors import InputError
from planner.core.plan import PlanStatus
from planner.solvers.request import MethodFn, MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option

if TYPE_CHECKING:  # the partitioners load when a method runs: listing the specs needs none
    from planner.solvers.pipeline.problem import PartitionOutcome, PipelineProblem

PREFIX = "pipeline-"


@dataclass(frozen=True)
class PipelineOptions:
    chunks: int = option(2, "stages per rank under an interleaved schedule", minimum=2)
    split: str | None = option(None, "your own split instead of a search: the layers that "
                               "start stages 2.., comma-separated (checked and simulated)")
    schedules: str | None = option(None, "auto, or schedules comma-separated: each planned and "
                                   "simulated, the fastest step that fits wins (instead of the "
                                   "resources' schedule)")


def _problem(request: SolveRequest, method: str) -> PipelineProblem:
    if request.pipeline is None:
        raise InputError(f"{method} partitions a model over pipeline ranks: it needs the "
                         "devices, micro-batches and schedule (resources)", field="method")
    return request.pipeline


def _result(outcome: PartitionOutcome) -> MethodResult:
    """The outcome as a MethodResult; the engine reads the partition from it."""
    return MethodResult(actions=None, status=PlanStatus(outcome.status), backend=outcome.backend,
                        objective=outcome.objective, lower_bound=outcome.lower_bound,
                        notes=list(outcome.notes), partition=outcome)


def pipeline_dp(request: SolveRequest) -> MethodResult:
    """The memory-aware DP over (layer prefix, stages); the fastest simulated split wins."""
    from planner.solvers.pipeline.dp import dp_partition

    return _result(dp_partition(_problem(request, "pipeline-dp"),
                                time_limit_s=request.time_limit_s))


def pipeline_ilp(request: SolveRequest) -> MethodResult:
    """CP-SAT over ranges and per-stage recomputation, within the time limit."""
    from planner.solvers.pipeline.ilp import ilp_partition

    problem = _problem(request, "pipeline-ilp")
    return _result(ilp_partition(problem, time_limit_s=request.time_limit_s,
                                 threads=request.threads))


def pipeline_whole(request: SolveRequest) -> MethodResult:
    """The split and every stage's per-module remat/offload, chosen together."""
    from planner.solvers.pipeline.whole_job import whole_job_partition

    problem = _problem(request, "pipeline-whole")
    return _result(whole_job_partition(problem, time_limit_s=request.time_limit_s,
                                       threads=request.threads))


def _baseline_method(name: str) -> MethodFn:
    def run(request: SolveRequest) -> MethodResult:
        from planner.solvers.pipeline.baselines import baseline_partition

        return _result(baseline_partition(_problem(request, PREFIX + name), name))

    run.__name__ = run.__qualname__ = "pipeline_" + name.replace("-", "_")
    run.__doc__ = f"The {name} split (whatever memory it needs; the engine says if it fits)."
    return run


# The balanced splits, in `pipeline.baselines.BASELINES` order
# (tests/tracing/test_torch_side_speed.py holds the two equal): their names and summaries here,
# so that the specs load without them.
_BASELINE_SUMMARIES = {
    "param-balanced": "contiguous stages balancing parameters (DeepSpeed "
                      "partition_method='parameters'); memory not considered",
    "layer-balanced": "the same number of layers per stage (DeepSpeed "
                      "partition_method='uniform'); memory not considered",
    "compute-balanced": "contiguous stages balancing forward+backward time (torch, GPipe); "
                        "memory not considered",
}

_PIPELINE = ("pipeline",)
SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="pipeline-dp", run=pipeline_dp, options=PipelineOptions,
               plan_kinds=_PIPELINE, claims_bounds=True,
               summary="every contiguous split simulated where that is cheap (proven fastest), "
               "else memory-aware DP proposals and boundary moves; fits every rank"),
    MethodSpec(name="pipeline-ilp", run=pipeline_ilp, options=PipelineOptions,
               plan_kinds=_PIPELINE,
               summary="CP-SAT over stage ranges and per-stage recomputation of micro-batches "
               "(its gap is on a proxy, not the simulated step)"),
    MethodSpec(name="pipeline-whole", run=pipeline_whole, options=PipelineOptions,
               plan_kinds=_PIPELINE, claims_bounds=True,
               summary="the split and each stage's per-module recompute/offload decided "
               "together (host tier from resources); never slower than dp and ilp"),
    *(MethodSpec(name=PREFIX + name, run=_baseline_method(name), options=PipelineOptions,
                 plan_kinds=_PIPELINE,
                 summary=_BASELINE_SUMMARIES[name])
      for name in _BASELINE_SUMMARIES),
)


def partitioner_name(method: str) -> str:
    """The partitioner a pipeline method runs: 'pipeline-dp' and 'dp' both name 'dp'."""
    return method[len(PREFIX):] if method.startswith(PREFIX) else method
