"""graph.json: the joint forward+backward training graph (schema version 1).

A graph is data: nodes are operations of one training step, edges are data dependencies.
Validation happens on construction, so any `Graph` instance is a well-formed DAG.

The document's parts are defined in `graph_parts`, the derived index in `graph_index` and the
structure checks in `graph_structure`; every name is importable from here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from planner.core.graph_index import GraphIndex
from planner.core.graph_parts import (
    MAX_BYTES,
    MAX_NODE_ID,
    NODE_REQUIRED_FIELDS,
    CostSource,
    Edge,
    FixedMemory,
    GraphMetadata,
    Node,
    Phase,
)
from planner.core.graph_structure import (
    check_structure,
    generation_order,
    paused_gc,
    reachable,
)
from planner.core.model_state import ModelState, ParameterState, StateBytes

__all__ = [
    "GRAPH_SCHEMA_VERSION", "MAX_BYTES", "MAX_NODE_ID", "NODE_REQUIRED_FIELDS", "CostSource",
    "Edge", "FixedMemory", "Graph", "GraphIndex", "GraphMetadata", "ModelState", "Node",
    "ParameterState", "Phase", "StateBytes", "check_structure", "generation_order",
    "graph_from_document", "paused_gc", "reachable",
]

GRAPH_SCHEMA_VERSION: Literal["1"] = "1"


class Graph(BaseModel):
    """The graph.json document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal["1"] = GRAPH_SCHEMA_VERSION
    nodes: list[Node]
    edges: list[Edge] = Field(default_factory=list)
    fixed: FixedMemory = Field(default_factory=FixedMemory)
    order: list[int] | None = Field(
        default=None, description="A topological order to use as the reference schedule."
    )
    outputs: list[int] | None = Field(
        default=None,
        description="Nodes the step must produce (loss, gradients). Default: every sink.",
    )
    metadata: GraphMetadata = Field(default_factory=GraphMetadata)
    model_state: ModelState | None = Field(
        default=None,
        description="Parameters, optimizer, precision, ZeRO stage and gradient lifetime; absent: "
        "`fixed` alone says what is resident (schema version 1 files).",
    )
    _index: GraphIndex | None = PrivateAttr(default=None)
    _hash: str | None = PrivateAttr(default=None)

    @field_validator("nodes")
    @classmethod
    def _non_empty(cls, nodes: list[Node]) -> list[Node]:
        if not nodes:
            raise ValueError("a graph needs at least one node")
        return nodes

    @model_validator(mode="after")
    def _check_structure(self) -> Graph:
        with paused_gc():
            check_structure(self)
        return self

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Graph:
        """A copy whose derived caches (index, hash) are rebuilt, since `update` may change it."""
        copy = super().model_copy(update=update, deep=deep)
        copy._index = None
        copy._hash = None
        return copy

    def __eq__(self, other: object) -> bool:
        # Fields only: the derived caches (index, hash) must not make equal graphs differ.
        if not isinstance(other, Graph):
            return NotImplemented
        return self.__dict__ == other.__dict__

    # -- derived views ----------------------------------------------------------------------
    @property
    def index(self) -> GraphIndex:
        if self._index is None:
            with paused_gc():
                self._index = GraphIndex(self)
        return self._index

    @property
    def fixed_bytes(self) -> int:
        """Bytes resident for the whole step: `fixed`, plus with model_state its weights,
        optimizer state and (gradient_lifetime 'step') gradients; see planner.sim.step_memory."""
        if self.model_state is None:
            return self.fixed.total_bytes
        return self.fixed.total_bytes + self.index.model_state_resident[0]

    @property
    def total_compute_ms(self) -> float:
        return math.fsum(n.compute_ms for n in self.nodes)

    @property
    def trace_options(self) -> dict[str, Any] | None:
        """The options planner.tracing.trace shaped this graph with (`metadata.extra
        ["trace_options"]`: optimizer, gradient lifetime, dropout masks, autocast, level, loss
        ...); None for graphs from elsewhere or traced before they were recorded."""
        options = self.metadata.extra.get("trace_options")
        return dict(options) if isinstance(options, dict) else None

    def node(self, node_id: int) -> Node:
        return self.index.node(node_id)

    def describe(self, node_id: int) -> str:
        """'node 12 (conv1)': how messages name a node."""
        if node_id not in self.index.position:
            return f"node {node_id}"
        name = self.index.node(node_id).name
        return f"node {node_id} ({name})" if name else f"node {node_id}"

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of everything but metadata: same graph, same hash. The
        one part of metadata that is planned with, an FSDP block profile
        (`metadata.extra["fsdp_model"]`), is hashed too (graphs without one keep their hash)."""
        if self._hash is None:  # frozen model: computed once
            with paused_gc():
                body = self.model_dump(mode="json", exclude={"metadata"})
            if body.get("model_state") is None:  # graphs without it keep their v1 hash
                body.pop("model_state", None)
            if (fsdp_model := self.metadata.extra.get("fsdp_model")) is not None:
                body["fsdp_model"] = fsdp_model
            for node in body["nodes"]:  # likewise nodes with the default offloadable
                if node.get("offloadable", True):
                    node.pop("offloadable", None)
            text = json.dumps(body, sort_keys=True, separators=(",", ":"))
            self._hash = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return self._hash

    # -- networkx ----------------------------------------------------------------------------
    def to_networkx(self) -> nx.DiGraph:
        g = nx.DiGraph(
            fixed=self.fixed.model_dump(),
            order=self.order,
            outputs=self.outputs,
            metadata=self.metadata.model_dump(),
        )
        if self.model_state is not None:
            g.graph["model_state"] = self.model_state.model_dump(mode="json")
        for n in self.nodes:
            g.add_node(n.id, **n.model_dump(exclude={"id"}, mode="json"))
        # networkx lists edges grouped by source: `index` restores the file order on the way
        # back, so a round trip keeps the content hash.
        g.add_edges_from((e.source, e.target, {"index": i}) for i, e in enumerate(self.edges))
        return g

    @classmethod
    def from_networkx(cls, g: nx.DiGraph) -> Graph:
        nodes = [Node(id=int(i), **attrs) for i, attrs in g.nodes(data=True)]
        pairs = list(g.edges(data="index"))
        if all(isinstance(i, int) for _, _, i in pairs):
            pairs.sort(key=lambda e: e[2])
        edges = [Edge(source=int(u), target=int(v)) for u, v, _ in pairs]
        return cls(
            nodes=nodes,
            edges=edges,
            fixed=FixedMemory(**g.graph.get("fixed", {})),
            order=g.graph.get("order"),
            outputs=g.graph.get("outputs"),
            metadata=GraphMetadata(**g.graph.get("metadata", {})),
            model_state=g.graph.get("model_state"),
        )



def graph_from_document(data: Mapping[str, Any]) -> Graph:
    """A graph.json document (parsed JSON) as a Graph, strictly: every node states
    NODE_REQUIRED_FIELDS, and every field has its JSON type ("12" is not a number of bytes,
    12.0 not an integer, "false" not a boolean). Raises ValueError naming the node and field
    for a missing field, pydantic's ValidationError for the rest (planner.core.io makes both one
    line). Python code building Node(...) is not affected."""
    nodes = data.get("nodes")
    if isinstance(nodes, list):
        for i, node in enumerate(nodes):
            if not isinstance(node, Mapping):
                continue
            missing = [f for f in NODE_REQUIRED_FIELDS if f not in node]
            if missing:
                name = node.get("name")
                who = ""
                if "id" in node:
                    who = f" (id {node['id']}{', ' + str(name) if name else ''})"
                raise ValueError(
                    f"nodes[{i}]{who}: missing {', '.join(missing)}; every node states "
                    f"{', '.join(NODE_REQUIRED_FIELDS)} (see `planner-cli schema graph`)"
                )
    # JSON mode: strict types that still read enum values ("forward") from their text.
    with paused_gc():
        return Graph.model_validate_json(json.dumps(data), strict=True)
