"""Request and response bodies of the /v1 API (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

Budget = StrictInt | StrictFloat | StrictStr
BUDGET_DESCRIPTION = (
    "Bytes (12000000000), a string with units ('11GiB', '900MB'), or a fraction of the "
    "graph's store-all peak (0.8 or '80%')."
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
                {"graph": EXAMPLE_GRAPH, "budget": 0.8, "method": "auto", "time_limit": 60},
                {"graph_id": "sha256:0123abcd", "budget": "11GiB", "method": "chen-greedy"},
            ]
        },
    )

    graph: dict[str, Any] | None = Field(
        default=None, description="A graph.json document (or a Checkmate node-link graph)."
    )
    graph_id: str | None = Field(
        default=None, max_length=80, description="Id of a graph uploaded with POST /v1/graphs."
    )
    budget: Budget | None = Field(
        default=None, description=BUDGET_DESCRIPTION + " Optional when resources name a device."
    )
    resources: dict[str, Any] | StrictStr | None = Field(
        default=None,
        description="The machine: a resources.json document (see `planner-cli schema "
        "resources`) or a preset name such as 'h100-pcie-gen5'. Without a budget, the "
        "device memory it names is the budget.",
    )
    method: str = Field(default="auto", max_length=64, description="See GET /v1/methods.")
    time_limit: float | None = Field(
        default=None, gt=0, description="Seconds for the solver (capped by the server)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Method options (JSON values only)."
    )


class SweepRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"graph": EXAMPLE_GRAPH, "budgets": [0.6, 0.8, 1.0], "method": "auto"}]
        },
    )

    graph: dict[str, Any] | None = None
    graph_id: str | None = Field(default=None, max_length=80)
    budgets: list[Budget] = Field(min_length=1, description=BUDGET_DESCRIPTION)
    resources: dict[str, Any] | StrictStr | None = Field(
        default=None,
        description="The machine: a resources.json document (see `planner-cli schema "
        "resources`) or a preset name such as 'h100-pcie-gen5'. Without a budget, the "
        "device memory it names is the budget.",
    )
    method: str = Field(default="auto", max_length=64)
    time_limit: float | None = Field(default=None, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)


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
    progress: Progress | None = None
    plan: dict[str, Any] | None = Field(default=None, description="plan.json when finished.")
    report: dict[str, Any] | None = Field(default=None, description="The solver's summary.")
    error: str | None = Field(default=None, description="Why it failed, was re-queued, ...")
    timeline_url: str | None = None


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
