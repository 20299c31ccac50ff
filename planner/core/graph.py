"""graph.json: the joint forward+backward training graph (schema version 1).

A graph is data: nodes are operations of one training step, edges are data dependencies.
Validation happens on construction, so any `Graph` instance is a well-formed DAG.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from planner.core.model_state import ModelState, ParameterState, StateBytes

__all__ = [
    "MAX_BYTES", "MAX_NODE_ID", "NODE_REQUIRED_FIELDS", "CostSource", "Edge", "FixedMemory",
    "Graph", "GraphIndex", "GraphMetadata", "ModelState", "Node", "ParameterState", "Phase",
    "StateBytes", "check_structure", "generation_order", "graph_from_document", "paused_gc",
]

GRAPH_SCHEMA_VERSION: Literal["1"] = "1"
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
        optimizer state and (gradient_lifetime 'step') gradients; see memory_model.step_memory."""
        if self.model_state is None:
            return self.fixed.total_bytes
        return self.fixed.total_bytes + self.index.model_state_resident[0]

    @property
    def total_compute_ms(self) -> float:
        return math.fsum(n.compute_ms for n in self.nodes)

    def node(self, node_id: int) -> Node:
        return self.index.node(node_id)

    def describe(self, node_id: int) -> str:
        """'node 12 (conv1)': how messages name a node."""
        if node_id not in self.index.position:
            return f"node {node_id}"
        name = self.index.node(node_id).name
        return f"node {node_id} ({name})" if name else f"node {node_id}"

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of everything but metadata: same graph, same hash."""
        if self._hash is None:  # frozen model: computed once
            with paused_gc():
                body = self.model_dump(mode="json", exclude={"metadata"})
            if body.get("model_state") is None:  # graphs without it keep their v1 hash
                body.pop("model_state", None)
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


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside (restored after, when it was on). Building a large
    graph or plan allocates hundreds of thousands of acyclic objects, and each automatic
    collection on the way walks all of them: half the time of loading a 20,000-node graph."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


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


class GraphIndex:
    """Adjacency and order of a graph, built once; node positions follow `topological_order`."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.position: dict[int, int] = {n.id: i for i, n in enumerate(graph.nodes)}
        # Other derived values of this (immutable) graph, computed once by whoever needs them
        # (e.g. planner.solvers.baselines.store_all_peak_bytes): keyed by a name of the value.
        self.memo: dict[str, Any] = {}
        self.predecessors: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
        self.successors: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
        for e in graph.edges:
            self.predecessors[e.target].append(e.source)
            self.successors[e.source].append(e.target)

    def node(self, node_id: int) -> Node:
        return self.graph.nodes[self.position[node_id]]

    @cached_property
    def topological_order(self) -> list[int]:
        """`graph.order` when given (accepted as is, for old files), else networkx's topological
        sort in file order respecting `order_predecessors` (backward after the loss)."""
        if self.graph.order is not None:
            return list(self.graph.order)
        successors = self.successors
        control = self.control_predecessors
        if control:  # control edges only where there are some, so others keep today's order
            successors = {v: list(ws) for v, ws in successors.items()}
            for v, us in control.items():
                for u in us:
                    successors[u].append(v)
        order = generation_order([n.id for n in self.graph.nodes], successors)
        assert order is not None  # control edges never close a cycle (see control_predecessors)
        return order

    @cached_property
    def model_state_resident(self) -> tuple[int, dict[int, int]]:
        """`ModelState.resident_bytes()` of the graph's model state, (0, {}) without one."""
        ms = self.graph.model_state
        return ms.resident_bytes() if ms is not None else (0, {})

    # -- the ordering rule -------------------------------------------------------------------
    @cached_property
    def loss_nodes(self) -> list[int]:
        """Loss-phase nodes that feed no other loss-phase node (normally the loss itself)."""
        loss = {n.id for n in self.graph.nodes if n.phase == Phase.loss}
        return [
            n.id
            for n in self.graph.nodes
            if n.id in loss and not any(s in loss for s in self.successors[n.id])
        ]

    @cached_property
    def control_predecessors(self) -> dict[int, list[int]]:
        """Backward node -> the loss nodes it must follow without a data path from them.

        The runtime runs backward ops only after the loss, so a backward node that needs no
        gradient input (e.g. a weight's transpose precomputed for its gradient) still waits for
        the loss. A backward node upstream of the loss (a mislabelled graph) gets no such
        dependency: it could never satisfy it. One forward and one reverse sweep per loss node.
        """
        backward = [n.id for n in self.graph.nodes if n.phase == Phase.backward]
        out: dict[int, list[int]] = {}
        if not backward:
            return out
        for loss in self.loss_nodes:
            after = reachable(loss, self.successors)
            before = reachable(loss, self.predecessors)
            for b in backward:
                if b not in after and b not in before:
                    out.setdefault(b, []).append(loss)
        return out

    @cached_property
    def order_predecessors(self) -> dict[int, list[int]]:
        """Data predecessors plus `control_predecessors`: what must run before each node.

        Read-only: nodes without control dependencies share their list with `predecessors`.
        """
        control = self.control_predecessors
        if not control:
            return self.predecessors
        merged = dict(self.predecessors)
        for v, extra in control.items():
            merged[v] = self.predecessors[v] + [u for u in extra if u not in self.predecessors[v]]
        return merged

    @cached_property
    def outputs(self) -> list[int]:
        if self.graph.outputs is not None:
            return list(self.graph.outputs)
        return [n.id for n in self.graph.nodes if not self.successors[n.id]]

    def storage_root(self, node_id: int) -> int:
        """The node that owns the storage `node_id` reads (itself unless it is a view)."""
        return self.storage_roots[node_id]

    @cached_property
    def storage_roots(self) -> dict[int, int]:
        """`storage_root` of every node, each alias chain walked once (linear time)."""
        alias = {n.id: n.alias_of for n in self.graph.nodes}
        roots: dict[int, int] = {}
        for start in alias:
            path = []
            v = start
            while v not in roots and alias[v] is not None:
                path.append(v)
                v = alias[v]  # type: ignore[assignment]
            root = roots.get(v, v)
            roots[v] = root
            for u in path:
                roots[u] = root
        return roots

    @cached_property
    def storage_bytes(self) -> dict[int, int]:
        """Bytes each node adds when it becomes resident. Views add none, and so does a gradient
        node whose output *is* its parameter's .grad (gradient_lifetime 'backward', unsharded:
        the held bytes equal the output's): the memory model holds those bytes from the node's
        first computation to the end of the step, so counting the output too would count the
        gradient twice. A sharded gradient (ZeRO-2/3) keeps its full output as a transient."""
        held = self.model_state_resident[1]
        return {
            n.id: 0
            if n.alias_of is not None or (n.output_bytes and held.get(n.id) == n.output_bytes)
            else n.output_bytes
            for n in self.graph.nodes
        }


def generation_order(ids: list[int], successors: Mapping[int, list[int]]) -> list[int] | None:
    """networkx's topological_sort, exactly, without building a networkx graph: generation by
    generation (nodes whose inputs are all in earlier ones), each in the order its nodes became
    ready, the first in `ids` order. None when the edges close a cycle. Linear time."""
    indegree = dict.fromkeys(ids, 0)
    for v in ids:
        for w in successors[v]:
            indegree[w] += 1
    ready = [v for v in ids if indegree[v] == 0]
    order: list[int] = []
    while ready:
        generation, ready = ready, []
        for v in generation:
            for w in successors[v]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    ready.append(w)
        order.extend(generation)
    return order if len(order) == len(ids) else None


def reachable(start: int, adjacency: Mapping[int, Sequence[int]]) -> set[int]:
    """`start` and every node reachable from it through `adjacency`."""
    seen = {start}
    stack = [start]
    while stack:
        for w in adjacency[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return seen


def check_structure(graph: Graph) -> None:
    """Raise ValueError naming the node or edge when the graph is not a well-formed DAG."""
    ids: set[int] = set()
    for i, n in enumerate(graph.nodes):
        if n.id in ids:
            raise ValueError(f"nodes[{i}]: duplicate node id {n.id}")
        ids.add(n.id)
    names = {n.id: n.name for n in graph.nodes}

    def label(node_id: int) -> str:
        return f"node {node_id} ({names[node_id]})" if names.get(node_id) else f"node {node_id}"

    seen_edges: set[tuple[int, int]] = set()
    for i, e in enumerate(graph.edges):
        for end in (e.source, e.target):
            if end not in ids:
                raise ValueError(
                    f"edges[{i}]: {e.source} -> {e.target} refers to missing node {end}"
                )
        if e.source == e.target:
            raise ValueError(f"edges[{i}]: self-loop on {label(e.source)}")
        if (e.source, e.target) in seen_edges:
            raise ValueError(f"edges[{i}]: duplicate edge {e.source} -> {e.target}")
        seen_edges.add((e.source, e.target))
    successors: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
    for e in graph.edges:
        successors[e.source].append(e.target)
    cycle = None
    if generation_order(list(successors), successors) is None:  # linear; networkx names it
        g = nx.DiGraph()
        g.add_nodes_from(ids)
        g.add_edges_from(seen_edges)
        cycle = nx.find_cycle(g)
    if cycle:
        path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        raise ValueError(f"the graph has a cycle through {label(cycle[0][0])}: {path}")
    for n in graph.nodes:
        if n.alias_of is None:
            continue
        if n.alias_of not in ids:
            raise ValueError(f"{label(n.id)}: alias_of refers to missing node {n.alias_of}")
        if (n.alias_of, n.id) not in seen_edges:
            raise ValueError(
                f"{label(n.id)}: alias_of {n.alias_of} must also be an edge {n.alias_of} -> {n.id}"
            )
    if graph.order is not None:
        _check_order(graph.order, ids, seen_edges, label)
    if graph.outputs is not None:
        for o in graph.outputs:
            if o not in ids:
                raise ValueError(f"outputs: refers to missing node {o}")
    if graph.model_state is not None:
        _check_model_state(graph, ids)


def _check_model_state(graph: Graph, ids: set[int]) -> None:
    for name in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
        if getattr(graph.fixed, name):
            raise ValueError(
                f"fixed.{name}: must be 0 when model_state is given (parameter, gradient and "
                "optimizer bytes follow from model_state)"
            )
    assert graph.model_state is not None
    for i, p in enumerate(graph.model_state.parameters):
        where = f"model_state.parameters[{i}] ({p.name}).gradient_node"
        if p.gradient_node is None:
            continue
        if p.gradient_node not in ids:
            raise ValueError(f"{where}: refers to missing node {p.gradient_node}")
        if not p.trainable:
            raise ValueError(f"{where}: a frozen parameter (trainable false) has no gradient")


def _check_order(
    order: Iterable[int], ids: set[int], edges: set[tuple[int, int]], label: Any
) -> None:
    order = list(order)
    if len(order) != len(ids) or set(order) != ids:
        missing = sorted(ids - set(order))[:3]
        extra = sorted(set(order) - ids)[:3]
        raise ValueError(
            f"order: must list every node exactly once (missing {missing}, unknown {extra}, "
            f"{len(order)} entries for {len(ids)} nodes)"
        )
    pos = {v: i for i, v in enumerate(order)}
    for u, v in edges:
        if pos[u] > pos[v]:
            raise ValueError(f"order: {label(v)} comes before its input {label(u)}")
