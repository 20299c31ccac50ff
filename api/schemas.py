"""Request and response bodies of the /v1 API (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from planner.api.caps import MAX_SWEEP_BUDGETS
from planner.api.request_documents import (
    BUDGET_SCHEMA,
    DEVICE_MEMORY_SCHEMA,
    GraphBody,
    PresetName,
    ResourcesDocument,
    int_options,
    resources_as_json_schema_reads,
)
from planner.core.budget import parse_budget_spec
from planner.core.errors import InputError
from planner.core.limits import MAX_TIME_LIMIT_S
from planner.engine.options import METHOD_OPTIONS, describe_options
from planner.engine.request_fields import request_field


def _budget(value: object) -> int | float | str:
    """A budget as the body gives it, its JSON type kept (1 and 1.0 differ): a JSON integer is
    bytes (1 is one byte), a number with a point a fraction of the store-all peak in (0, 1],
    a string the grammar. Only the type is checked here, in one line (never the union of the
    validation library's complaints); the one budget grammar (planner.core.budget) reads the
    value when the request is resolved, its error naming the field (`budget`, `budgets[2]`)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        try:
            parse_budget_spec(value, "budget")
        except InputError as e:
            raise ValueError(e.detail) from None
    assert isinstance(value, int | float | str)
    return value


# The schema states the grammar's accepted forms (BUDGET_SCHEMA); validation is the grammar's.
Budget = Annotated[int | float | str, PlainValidator(_budget), WithJsonSchema(BUDGET_SCHEMA)]
BUDGET_DESCRIPTION = (
    "A JSON integer is bytes (12000000000; 1 is one byte; at most 2**60); a number with a "
    "point is a fraction of the graph's store-all peak in (0, 1] (0.8; 1.0 is all of it); or "
    "a string: '80%' (of the store-all peak), '11GiB' / '900MB' (bytes with a unit), '0.8' or "
    "'12000000000'. A whole byte count written with a point or an exponent (4e9, 4.0) is "
    "refused: write it as an integer."
)

def _device_memory(value: object) -> int | str:
    """Memory per device as the body gives it: bytes in the one budget grammar (a JSON integer,
    1 is one byte, or a string such as '80GiB'); a fraction of the store-all peak is refused."""
    try:
        spec = parse_budget_spec(value, "device_memory")
    except InputError as e:
        raise ValueError(e.detail) from None
    if spec.needs_reference:
        raise ValueError(f"{value!r}: device memory is bytes, not a fraction of the store-all "
                         "peak; give an integer (bytes) or a size with its unit such as '80GiB'")
    assert isinstance(value, int | str)
    return value


DeviceMemory = Annotated[int | str, PlainValidator(_device_memory),
                         WithJsonSchema(DEVICE_MEMORY_SCHEMA)]
DEVICE_MEMORY_DESCRIPTION = (
    "Memory per device: a JSON integer is bytes (1 is one byte; at most 2**60), or a string "
    "'80GiB', '40GB', '12000000000'."
)
# graph and graph_id exclude each other: exactly one is given (null counts as absent).
GRAPH_XOR_GRAPH_ID: dict[str, Any] = {
    "oneOf": [
        {"required": ["graph"], "properties": {"graph": {"type": "object"}}},
        {"required": ["graph_id"], "properties": {"graph_id": {"type": "string"}}},
    ]
}
# A plan needs a budget, or resources that name a device (its memory is the budget).
BUDGET_OR_DEVICE: dict[str, Any] = {
    "anyOf": [
        {"required": ["budget"], "properties": {"budget": {"not": {"type": "null"}}}},
        {"required": ["resources"], "properties": {"resources": {"anyOf": [
            {"type": "string"},
            {"type": "object", "anyOf": [
                {"required": ["preset"],  # and no device_memory_bytes: null over it
                 "properties": {"device_memory_bytes": {"type": "integer"}}},
                {"required": ["device_memory_bytes"],
                 "properties": {"device_memory_bytes": {"type": "integer"}}},
            ]},
        ]}}},
    ]
}
GRAPH_DESCRIPTION = (
    "A graph.json document (`planner-cli schema graph`; a Checkmate node-link graph is "
    "accepted too). Give exactly one of graph and graph_id."
)
GRAPH_ID_DESCRIPTION = "Id of a graph uploaded with POST /v1/graphs (instead of graph)."
# Each field's description starts with the one table's help (planner.engine.request_fields),
# as the CLI's --help does; what differs here (the server's cap, the cache) is said after it.
TIME_LIMIT_DESCRIPTION = (
    request_field("time_limit").text() + " (the server's setting when it sets one), capped "
    "by the server. A finished plan that is not proven optimal answers only requests with at "
    "most the time limit it was solved with."
)
RESOURCES_DESCRIPTION = request_field("resources").help + "."
METHOD_DESCRIPTION = request_field("method").help + "."
# The engine's bound; the server states its own cap (max_time_limit_s) in its document.
TIME_LIMIT_SCHEMA: dict[str, Any] = {"maximum": MAX_TIME_LIMIT_S}
FORCE_DESCRIPTION = "Solve again even when a finished answer to the same question is stored."
OPTIONS_DESCRIPTION = (
    request_field("options").help + " (a 422); the built-in methods not listed take none. "
    + "; ".join(
        f"{method}: " + ", ".join(f"{name} ({text})" for name, text in
                                  describe_options(method).items())
        for method in METHOD_OPTIONS
    )
)
EXAMPLE_GRAPH: dict[str, Any] = {
    "nodes": [
        {"id": 0, "name": "layer0", "phase": "forward", "compute_ms": 2.0, "output_bytes": 4096},
        {"id": 1, "name": "loss", "phase": "loss", "compute_ms": 1.0, "output_bytes": 4},
        {"id": 2, "name": "layer0_backward", "phase": "backward", "compute_ms": 4.0,
         "output_bytes": 1024},
    ],
    "edges": [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}],
}


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. 'invalid_input'.")
    message: str = Field(description="One line: what is wrong, where, and what to do.")
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """The one error shape of the whole API."""

    error: ErrorDetail


class PlanRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"graph": EXAMPLE_GRAPH, "budget": 0.8, "method": "auto"},
                {"graph_id": "sha256:0123abcd", "budget": "11GiB", "method": "chen-greedy"},
            ],
            **GRAPH_XOR_GRAPH_ID,
            **BUDGET_OR_DEVICE,
        },
    )

    graph: GraphBody | None = Field(default=None, description=GRAPH_DESCRIPTION)
    graph_id: str | None = Field(default=None, max_length=80, description=GRAPH_ID_DESCRIPTION)
    budget: Budget | None = Field(
        default=None, description=BUDGET_DESCRIPTION + " Optional when resources name a device."
    )
    resources: ResourcesDocument | PresetName | None = Field(
        default=None, description=RESOURCES_DESCRIPTION)
    method: str = Field(default="auto", max_length=64, description=METHOD_DESCRIPTION)
    time_limit: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description=TIME_LIMIT_DESCRIPTION,
        json_schema_extra=TIME_LIMIT_SCHEMA,
    )
    options: dict[str, Any] = Field(default_factory=dict, description=OPTIONS_DESCRIPTION)
    force: StrictBool = Field(default=False, description=FORCE_DESCRIPTION)

    _resources = field_validator("resources", mode="before")(resources_as_json_schema_reads)

    @model_validator(mode="after")
    def _int_options(self) -> PlanRequest:  # 4.0 as 4 where the method takes an integer
        int_options(self.method, self.options)
        return self


class SweepRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"graph": EXAMPLE_GRAPH, "budgets": [0.6, 0.8, 1.0], "method": "auto"}],
            **GRAPH_XOR_GRAPH_ID,
        },
    )

    graph: GraphBody | None = Field(default=None, description=GRAPH_DESCRIPTION)
    graph_id: str | None = Field(default=None, max_length=80, description=GRAPH_ID_DESCRIPTION)
    budgets: list[Budget] = Field(min_length=1, max_length=MAX_SWEEP_BUDGETS,
                                  description=BUDGET_DESCRIPTION + " At most "
                                  f"{MAX_SWEEP_BUDGETS} (or the server's max_sweep_budgets).")
    resources: ResourcesDocument | PresetName | None = Field(
        default=None, description=RESOURCES_DESCRIPTION)
    method: str = Field(default="auto", max_length=64, description=METHOD_DESCRIPTION)
    time_limit: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description=TIME_LIMIT_DESCRIPTION,
        json_schema_extra=TIME_LIMIT_SCHEMA,
    )
    options: dict[str, Any] = Field(default_factory=dict, description=OPTIONS_DESCRIPTION)
    force: StrictBool = Field(default=False, description=FORCE_DESCRIPTION)

    _resources = field_validator("resources", mode="before")(resources_as_json_schema_reads)

    @model_validator(mode="after")
    def _int_options(self) -> SweepRequest:  # 4.0 as 4 where the method takes an integer
        int_options(self.method, self.options)
        return self


class GraphCreated(BaseModel):
    id: str = Field(description="The graph's content hash; use it as graph_id.")
    nodes: int
    edges: int
    created: bool = Field(description="False when the same graph was stored before.")
    url: str


class GraphDocument(BaseModel):
    id: str
    graph: dict[str, Any]


class JobAccepted(BaseModel):
    id: str
    status: str = Field(description="queued or running (an identical request is in progress).")
    url: str


class Progress(BaseModel):
    best_objective: float | None = None
    best_bound: float | None = None


class JobView(BaseModel):
    id: str
    status: str = Field(description="queued, running, done, infeasible, failed or cancelled.")
    url: str
    graph_id: str
    budget_bytes: int
    method: str
    options: dict[str, Any]
    resources: dict[str, Any] | None = Field(
        default=None, description="The machine planned for (resources.json); null: a bare budget."
    )
    time_limit_s: float
    attempts: int
    cached: bool = Field(description="True when this answer came from the store at once.")
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    solve_seconds: float | None = None
    worker_pid: int | None = Field(default=None, description="Solver process while running.")
    instance: str | None = Field(
        default=None, description="The service instance running it (see GET /readyz)."
    )
    progress: Progress | None = None
    plan: dict[str, Any] | None = Field(default=None, description="plan.json when finished.")
    report: dict[str, Any] | None = Field(default=None, description="The solver's summary.")
    error: str | None = Field(default=None, description="Why it failed, was re-queued, ...")
    timeline_url: str | None = None


class JobSummary(BaseModel):
    """A job in a list: the job view without its plan and report."""

    id: str
    status: str
    url: str
    graph_id: str
    budget_bytes: int
    method: str
    time_limit_s: float
    attempts: int
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    solve_seconds: float | None = None
    progress: Progress | None = None
    error: str | None = None
    instance: str | None = None
    peak_bytes: int | None = Field(
        default=None, description="A finished plan's peak device memory (its report's)."
    )
    overhead_percent: float | None = Field(
        default=None, description="A finished plan's extra compute in % (its report's)."
    )
    # The list route builds a summary from the job's view: its report is read for the two
    # figures above and never sent (lists stay small).
    report: SkipJsonSchema[dict[str, Any] | None] = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _figures_from_report(self) -> JobSummary:
        if self.report:
            if self.peak_bytes is None:
                self.peak_bytes = self.report.get("peak_bytes")
            if self.overhead_percent is None:
                self.overhead_percent = self.report.get("overhead_percent")
        return self


class JobList(BaseModel):
    plans: list[JobSummary] = Field(description="Newest first.")


class SweepSummary(BaseModel):
    id: str
    url: str
    graph_id: str
    method: str
    created_at: str
    plans: int = Field(description="Number of budgets (plans) in the sweep.")
    finished: int | None = Field(
        default=None, description="How many of its plans are finished (done, infeasible, ...)."
    )


class SweepList(BaseModel):
    sweeps: list[SweepSummary] = Field(description="Newest first.")


class SweepEntry(BaseModel):
    id: str
    url: str
    status: str
    budget_bytes: int
    peak_bytes: int | None = None
    overhead_percent: float | None = None
    answered_by: str | None = Field(
        default=None,
        description="Id of the plan reported for this budget: this job's own, or a smaller "
        "budget's cheaper plan (overhead never rises with the budget).",
    )


class SweepView(BaseModel):
    id: str
    url: str
    graph_id: str
    method: str
    plans: list[SweepEntry]


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    database: str
    workers: int
    running: int
    instance: str = Field(description="This instance's id (it owns the jobs it runs).")
    lease_s: float = Field(description="Its lease: others take its jobs over once it lapses.")
