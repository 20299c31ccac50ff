"""POST /v1/partitions: a pipeline partition and schedule, as a plan job: a thin alias of
POST /v1/plans.

The body says the pipeline in its own words (devices, device_memory, microbatches, schedule,
method dp / ilp / a balanced split, chunks, split, ZeRO sharding, and the method's `options` as
/v1/plans takes them); the route translates it into a plan request (method `pipeline-<method>`,
the machine as resources, the device memory as the budget, chunks and split as options, beside
the options given; with `zero`/`dp` the graph's model state is sharded first,
so the plan is for the sharded graph) and submits it as /v1/plans does: 202 with the job's url,
or 200 with the plan (kind pipeline, simulated per rank) once it is done or solved before
(`?wait=`). When nothing fits, the plan's status is infeasible and its
`details.smallest_feasible_bytes` the least device memory that works. Bad input (0 devices, more
stages than layers, micro-batches an interleaved schedule cannot divide, a device memory below
one layer's model state, a split naming an unknown layer) is a 422 at submission naming this
body's field, as is a number over its cap (planner.api.caps: devices, micro-batches, dp,
bytes; stated in the schema).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from planner.api.caps import MAX_DATA_PARALLEL, MAX_DEVICES, MAX_MICROBATCHES
from planner.api.deps import Identity, Parts
from planner.api.request_documents import (
    GraphBody,
    PresetName,
    ResourcesDocument,
    integral,
    resources_as_json_schema_reads,
)
from planner.api.routers.plans import MAX_WAIT_S, SUBMIT_RESPONSES, submit_plan
from planner.api.schemas import (
    DEVICE_MEMORY_DESCRIPTION,
    DeviceMemory,
    JobAccepted,
    PlanRequest,
)
from planner.core.errors import InputError
from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S
from planner.engine.options import with_option_fields
from planner.solvers.pipeline.schedules import SCHEDULES

MAX_TIME_LIMIT_S = 30.0
# A pipeline plan's default (planner.core.limits), or the server's cap when that is lower.
DEFAULT_TIME_LIMIT_S = DEFAULT_PIPELINE_TIME_LIMIT_S
MAX_CHUNKS = 16
PARTITIONERS = ("dp", "ilp", "param-balanced", "layer-balanced", "compute-balanced")
# Names the schema lists; validation keeps plain strings, so a wrong one gets the route's own
# message with the list (`method: no partitioner ...`).
PartitionerName = Annotated[StrictStr, WithJsonSchema(
    {"type": "string", "enum": [*PARTITIONERS, *(f"pipeline-{p}" for p in PARTITIONERS)]})]
ScheduleName = Annotated[StrictStr, WithJsonSchema(
    {"type": "string", "enum": [*SCHEDULES, "auto"]})]

def _given_or_in_resources(field: str, resources_field: str,
                           preset_says_it: bool) -> dict[str, Any]:
    """Schema: `field` is given, or the resources document says it (a preset names devices
    and device memory, never micro-batches)."""
    # 1 micro-batch is the document's default: it says none.
    least = 2 if resources_field == "microbatches" else 1
    document: dict[str, Any] = {"type": "object", "required": [resources_field], "properties": {
        resources_field: {"type": "integer", "minimum": least}}}
    preset: dict[str, Any] = {"type": "string"}  # a preset by name names it (or an override)
    named = [preset, document] if preset_says_it else [document]
    return {"anyOf": [
        {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
        {"required": ["resources"], "properties": {"resources": {"anyOf": named}}},
    ]}


# What the route needs from the body or its resources (else a 422 naming the field).
NEEDED: dict[str, Any] = {"allOf": [
    _given_or_in_resources("devices", "device_count", preset_says_it=True),
    _given_or_in_resources("microbatches", "microbatches", preset_says_it=False),
    _given_or_in_resources("device_memory", "device_memory_bytes", preset_says_it=True),
    {  # ZeRO sharding (zero, dp) needs the graph's model state (per-parameter bytes)
        "if": {"anyOf": [{"required": [f], "properties": {f: {"type": "integer"}}}
                         for f in ("zero", "dp")]},
        "then": {"properties": {"graph": {"required": ["model_state"],
                                          "properties": {"model_state": {"type": "object"}}}}},
    },
]}


class PartitionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=NEEDED)

    graph: GraphBody = Field(description="graph.json (module-level or op-level with module "
                             "paths).")
    resources: ResourcesDocument | PresetName | None = Field(
        default=None, description="resources.json or a preset name; the fields below override it."
    )
    devices: StrictInt | None = Field(default=None, ge=1, le=MAX_DEVICES,
                                      description="Pipeline ranks.")
    device_memory: DeviceMemory | None = Field(default=None,
                                               description=DEVICE_MEMORY_DESCRIPTION)
    # At least 2: one micro-batch is what resources.json says by default, i.e. "not given".
    microbatches: StrictInt | None = Field(default=None, ge=2, le=MAX_MICROBATCHES,
                                           description="Micro-batches per step (2 or more).")
    schedule: ScheduleName | None = Field(
        default=None, description=f"{', '.join(SCHEDULES)} (default 1f1b), or auto: each "
        "planned and simulated, the fastest step that fits wins (the plan's details.choice "
        "lists them)."
    )
    method: PartitionerName = Field(default="dp", description="dp, ilp, param-balanced, "
                              "layer-balanced or compute-balanced (or the method's own name: "
                              "pipeline-dp, ...).")
    chunks: StrictInt = Field(default=2, ge=2, le=MAX_CHUNKS, description="Stages per rank "
                              "(interleaved).")
    split: list[StrictStr] | None = Field(default=None, description="Your own split: the layers "
                                          "that start stages 1.. (checked and simulated).")
    zero: StrictInt | None = Field(default=None, ge=0, le=3, description="ZeRO stage 0-3.")
    dp: StrictInt | None = Field(default=None, ge=1, le=MAX_DATA_PARALLEL,
                                 description="Data-parallel degree ZeRO shards over.")
    time_limit: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, le=MAX_TIME_LIMIT_S,
                              allow_inf_nan=False, description="Seconds for the ILP (default "
                              f"{DEFAULT_TIME_LIMIT_S:g}, or the server's cap when lower).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The pipeline method's options, as in POST /v1/plans "
        "(GET /v1/methods: chunks, split, schedules), checked at submission by the same "
        "resolution; one the body's own field gives too (chunks, split, schedule auto) is a "
        "422.")

    _resources = field_validator("resources", mode="before")(resources_as_json_schema_reads)
    # 4.0 is 4 (a JSON Schema integer); 4.5, "4" and true are still refused.
    _integral = field_validator("devices", "microbatches", "zero", "dp", "chunks",
                                mode="before")(integral)

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, value: str | None) -> str | None:
        # The schema's enum, enforced here: an unknown one failed later, inside the plan
        # request this body becomes (a 500).
        if value is not None and value not in (*SCHEDULES, "auto"):
            raise ValueError(f"{value!r}: no such schedule; choose one of "
                             f"{', '.join(SCHEDULES)} or auto")
        return value


# Fields of the plan request this body becomes, as this body calls them.
BODY_FIELDS = {"resources.device_count": "devices", "resources.microbatches": "microbatches",
               "resources.pipeline_schedule": "schedule", "budget": "device_memory",
               "options.split": "split", "options.chunks": "chunks", "method": "method",
               "schedules": "schedule"}

router = APIRouter(prefix="/v1")


@router.post(
    "/partitions",
    status_code=202,
    response_model=JobAccepted,
    responses=SUBMIT_RESPONSES,
    summary="Split a model into pipeline stages that fit each device, with a schedule",
)
async def submit_partition(
    body: PartitionRequest,
    parts: Parts,
    who: Identity,
    wait: float = Query(default=0, ge=0, le=MAX_WAIT_S,
                        description="Seconds to hold the request for the plan (as /v1/plans)."),
) -> Response:
    if "time_limit" not in body.model_fields_set:  # the default, within this server's cap
        body = body.model_copy(update={"time_limit": min(
            DEFAULT_TIME_LIMIT_S, parts.settings.max_time_limit_s)})
    try:  # parsing and sharding the graph is CPU work: never on the event loop
        plan_body = await run_in_threadpool(plan_request, body)
        return await submit_plan(plan_body, parts, who, wait)
    except InputError as e:
        raise in_body_words(e) from None


def in_body_words(err: InputError) -> InputError:
    """`err` naming this body's field: the resources' own validation says "resources:
    device_count: ..." for what this body calls devices."""
    field, detail = err.field or "", err.detail
    key, sep, rest = detail.partition(": ")
    if field == "resources" and sep and f"resources.{key}" in BODY_FIELDS:
        field, detail = f"resources.{key}", rest
    return InputError(detail, field=BODY_FIELDS.get(field, err.field))


def plan_request(body: PartitionRequest) -> PlanRequest:
    """The plan request this partition request is."""
    from planner.engine.partition import pipeline_method

    resources: dict[str, Any] = ({"preset": body.resources} if isinstance(body.resources, str)
                 else dict(body.resources or {}))
    auto = body.schedule == "auto"
    for key, value in (("device_count", body.devices), ("microbatches", body.microbatches),
                       ("pipeline_schedule", None if auto else body.schedule)):
        if value is not None:
            resources[key] = value
    if "device_count" not in resources and "preset" not in resources:
        raise InputError("how many devices (pipeline ranks)? e.g. 4", field="devices")
    options = _options(body, auto)
    try:
        return PlanRequest(graph=_sharded(body), budget=body.device_memory, resources=resources,
                           method=pipeline_method(body.method).name, time_limit=body.time_limit,
                           options=options)
    except ValidationError as e:  # whatever this body let through: a 422 naming its field
        first = e.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise InputError(message, field=field or "body") from None


def _options(body: PartitionRequest, auto: bool) -> dict[str, Any]:
    """The plan request's options: the body's `options` with chunks, split and schedule auto of
    its own fields (chunks always: the request's key is as before); an option given both ways
    is an error naming it."""
    given = {"chunks": ("chunks", body.chunks if "chunks" in body.model_fields_set else None),
             "split": ("split", None if body.split is None else ",".join(body.split)),
             "schedules": ("schedule", "auto" if auto else None)}
    options = with_option_fields(body.options, given, "options.{key}")
    options.setdefault("chunks", body.chunks)
    chunks = options["chunks"]
    if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > MAX_CHUNKS:
        raise InputError(f"{chunks} is above {MAX_CHUNKS}", field="options.chunks")
    return options


def _sharded(body: PartitionRequest) -> dict[str, Any]:
    if body.zero is None and body.dp is None:
        return body.graph
    from planner.core.io import graph_from_dict
    from planner.engine.partition import sharded

    return sharded(graph_from_dict(body.graph, "graph"), body.zero, body.dp).model_dump(
        mode="json")
