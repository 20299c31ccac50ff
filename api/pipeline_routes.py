"""POST /v1/partitions: a pipeline partition and schedule, answered synchronously.

The partitioners are fast (the DP in milliseconds to a second; the ILP within its time limit,
capped at MAX_TIME_LIMIT_S), so the answer comes in the response: 200 with the plan
(kind pipeline), the stage table and the simulated figures; when nothing fits, 200 with
`fits: false`, no plan, the rank that overflows and the least device memory that works. Bad
input (0 devices, more stages than layers, micro-batches an interleaved schedule cannot divide,
a device memory below one layer's model state, a split naming an unknown layer) is 422 with one
line, as everywhere in the service (planner.service.errors).

`pipeline_router(dependencies)` builds the router; planner.service.app includes it with its identity
dependency (authentication and rate limits as for the other /v1 routes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from planner.core.errors import InputError, NoPlanFits

MAX_TIME_LIMIT_S = 30.0


class PartitionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    graph: dict[str, Any] = Field(description="graph.json (module-level or op-level with "
                                  "module paths).")
    resources: dict[str, Any] | StrictStr | None = Field(
        default=None, description="resources.json or a preset name; the fields below override it."
    )
    devices: StrictInt | None = Field(default=None, description="Pipeline ranks.")
    device_memory: StrictStr | StrictInt | None = Field(
        default=None, description="Memory per device: '80GiB', '40GB' or bytes."
    )
    microbatches: StrictInt | None = Field(default=None, description="Micro-batches per step.")
    schedule: StrictStr | None = Field(
        default=None, description="gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-h2 (default 1f1b)."
    )
    method: StrictStr = Field(default="dp", description="dp, ilp, param-balanced, "
                              "layer-balanced or compute-balanced.")
    chunks: StrictInt = Field(default=2, ge=2, le=16, description="Stages per rank "
                              "(interleaved).")
    split: list[StrictStr] | None = Field(default=None, description="Your own split: the layers "
                                          "that start stages 1.. (checked and simulated).")
    zero: StrictInt | None = Field(default=None, description="ZeRO stage 0-3.")
    dp: StrictInt | None = Field(default=None, description="Data-parallel degree ZeRO shards "
                                 "over.")
    time_limit: float = Field(default=10.0, gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False,
                              description="Seconds for the ILP.")


class StageView(BaseModel):
    stage_index: int
    rank: int
    modules: list[str]
    parameter_bytes: int
    model_state_bytes: int
    saved_bytes: int
    inflight: int
    recomputed: int
    compute_ms: float
    rank_peak_bytes: int


class PartitionResponse(BaseModel):
    fits: bool
    plan: dict[str, Any] | None = Field(default=None, description="plan.json (kind pipeline).")
    stages: list[StageView] = Field(default_factory=list)
    makespan_ms: float | None = None
    throughput_per_s: float | None = None
    bubble_fraction: float | None = None
    peak_bytes: int | None = None
    solve_seconds: float = 0.0
    message: str = ""
    least_memory_bytes: int | None = Field(
        default=None, description="When nothing fits: the least device memory that works."
    )


def pipeline_router(dependencies: Sequence[Any] = ()) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=list(dependencies))

    @router.post(
        "/partitions",
        response_model=PartitionResponse,
        summary="Split a model into pipeline stages that fit each device, with a schedule",
    )
    def create_partition(body: PartitionRequest) -> PartitionResponse:
        from planner.core.io import graph_from_dict
        from planner.core.resources import resources_from_dict
        from planner.engine.partition import parse_device_memory, partition_plan

        graph = graph_from_dict(body.graph, "graph")
        resources = (resources_from_dict(body.resources, "resources")
                     if body.resources is not None else None)
        if body.devices is not None and body.devices < 1:
            raise InputError(f"devices {body.devices}: a pipeline needs at least 1 device")
        try:
            report = partition_plan(
                graph, devices=body.devices,
                device_memory_bytes=parse_device_memory(body.device_memory, "device_memory"),
                microbatches=body.microbatches, schedule=body.schedule, method=body.method,
                chunks=body.chunks, resources=resources, zero_stage=body.zero, dp=body.dp,
                time_limit_s=body.time_limit, split=body.split,
            )
        except NoPlanFits as e:
            return PartitionResponse(fits=False, message=str(e),
                                     least_memory_bytes=e.smallest_feasible_bytes)
        p = report.plan.predicted
        assert p is not None
        return PartitionResponse(
            fits=report.fits,
            plan=report.plan.model_dump(mode="json"),
            stages=[StageView(**vars(r)) for r in report.rows],
            makespan_ms=p.makespan_ms,
            throughput_per_s=p.throughput_per_s,
            bubble_fraction=p.bubble_fraction,
            peak_bytes=p.peak_bytes,
            solve_seconds=report.solve_seconds,
            message="" if report.fits else "; ".join(report.notes),
        )

    return router


router = pipeline_router()
