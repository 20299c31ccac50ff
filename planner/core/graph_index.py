"""The derived index of a graph, built once per (immutable) graph: adjacency, positions, the
topological order with the ordering rule (backward after the loss), outputs and storage.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from planner.core.graph_parts import Node, Phase
from planner.core.graph_structure import generation_order, reachable

if TYPE_CHECKING:
    from planner.core.graph import Graph


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
