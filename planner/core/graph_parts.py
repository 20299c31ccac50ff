"""The parts of a graph.json document: nodes (operations), edges (data dependencies), the memory
resident for the whole step and metadata. `planner.core.graph.Graph` assembles them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Fields that decide memory, order and cost: a graph.json node must state them (a default would
# silently plan a forgotten size as 0 bytes or a backward op as forward). Python code building
# Node(...) keeps the defaults; documents are checked by `graph_from_document`.
NODE_REQUIRED_FIELDS = ("id", "phase", "compute_ms", "output_bytes")
MAX_BYTES = 2**60  # 1 EiB per field: far above any tensor, and sums stay far below int64
MAX_NODE_ID = 2**63 - 1  # ids are stored in int64 columns


def _node_schema(schema: dict[str, Any]) -> None:
    """graph.json's JSON Schema: what `graph_from_document` requires of every node."""
    schema["required"] = list(NODE_REQUIRED_FIELDS)


class Phase(StrEnum):
    forward = "forward"
    loss = "loss"
    backward = "backward"


class CostSource(StrEnum):
    measured = "measured"  # timed on a device
    estimated = "estimated"  # roofline or other model
    imported = "imported"  # taken from another project's file (units may be arbitrary)
    unknown = "unknown"


class Node(BaseModel):
    """One operation of the training step."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra=_node_schema
    )

    id: int = Field(ge=0, le=MAX_NODE_ID, description="Stable id, unique in the graph.")
    name: str = Field(default="", description="Readable name.")
    op: str = Field(default="", description="Operator, e.g. 'aten.mm' or 'Conv2D'.")
    phase: Phase = Field(
        default=Phase.forward, description="forward, loss or backward (required in graph.json)."
    )
    compute_ms: float = Field(
        default=0.0,
        ge=0,
        description="Compute cost in milliseconds (imported: source units); required in "
        "graph.json (0 for free ops).",
    )
    cost_source: CostSource = CostSource.unknown
    output_bytes: int = Field(
        default=0,
        ge=0,
        le=MAX_BYTES,
        description="Bytes of the node's output; required in graph.json (0 for a view).",
    )
    workspace_bytes: int = Field(
        default=0,
        ge=0,
        le=MAX_BYTES,
        description="Transient bytes needed only while the node runs (default 0).",
    )
    module_path: str = Field(default="", description="Owning module, e.g. 'encoder.layer.3'.")
    recomputable: bool = Field(default=True, description="False: must never run twice.")
    offloadable: bool = Field(
        default=True, description="False: the output must stay on the device (never copied to "
        "the host)."
    )
    random: bool = Field(
        default=False, description="Random op: recomputation must replay its RNG state."
    )
    alias_of: int | None = Field(
        default=None,
        ge=0,
        le=MAX_NODE_ID,
        description="Id of the node whose storage this view shares: costs no memory of its own "
        "and keeps that storage alive while resident.",
    )


class Edge(BaseModel):
    """Data dependency: `target` reads the output of `source`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: int
    target: int


class FixedMemory(BaseModel):
    """Bytes resident for the whole step, independent of the schedule.

    With `Graph.model_state` given, parameters, gradients and optimizer state follow from it and
    `parameters_bytes`, `gradients_bytes` and `optimizer_bytes` here must be 0 (one source of
    truth); inputs and other bytes (buffers) stay here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    parameters_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)
    gradients_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)
    optimizer_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)
    inputs_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)
    other_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)

    @property
    def total_bytes(self) -> int:
        return (
            self.parameters_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.inputs_bytes
            + self.other_bytes
        )


class GraphMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str = ""
    batch_size: int | None = Field(default=None, ge=1)
    dtype: str = ""
    device_profile: str = ""
    source: str = Field(default="", description="Where the graph came from (tracer, importer).")
    extra: dict[str, Any] = Field(default_factory=dict)

