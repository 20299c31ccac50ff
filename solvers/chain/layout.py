"""Where a chain's stages live in a graph.json, and the graph of a chain given directly.

A `ChainLayout` says, per stage i (1-based), which graph nodes each chain operation runs:

- `forward[i]`: the nodes F_all runs, in order; `ck_forward[i]`: the nodes F_ck/F_∅ run.
- `joint[i]`: the nodes holding a^i (`joint[0]`: the input, possibly none).
- `saved[i]`: the nodes F_all leaves resident (ā^i, `joint[i]` included).
- `backward[i]`: the nodes B runs, in order; `grad_out[i]`: those of them that stay resident as
  δ^{i-1} for the next backward.

Graph of a chain given directly (`chain_graph`), node ids:

    0        input        a^0, input_bytes, not recomputable
    3i-2     stage i saved  x̄_i - x_i bytes, cost 0, workspace forward_all_tmp_bytes, reads
             a^{i-1}   (the part of ā^i beyond a^i)
    3i-1     stage i forward  x_i bytes, forward_ms, workspace forward_tmp_bytes, reads a^{i-1}
    3i       stage i backward  grad_input_bytes (δ^{i-1}), backward_ms, workspace
             backward_tmp_bytes; reads a^{i-1}, a^i, the saved node and δ^i (node 3(i+1))

F_all runs the forward node and then the saved node, so the simulator sees resident +
max(x + forward_tmp, x̄ + forward_all_tmp), exactly the chain model's peak; F_ck/F_∅ run the
forward node only; B runs the backward node. With `graph.order` set to input, (forward, saved)
per stage, then backward from L down to 1, store-all on this graph is the chain's
F_all-everything sequence. Fixed memory goes to `FixedMemory.other_bytes`; the chain document
itself is kept in `metadata.extra["chain"]` so that a solver can recover the exact chain.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.graph import CostSource, Edge, FixedMemory, Graph, GraphMetadata, Node, Phase
from planner.solvers.chain.model import Chain, chain_document


@dataclass(frozen=True)
class ChainLayout:
    forward: tuple[tuple[int, ...], ...]  # index 0 unused
    ck_forward: tuple[tuple[int, ...], ...]
    joint: tuple[tuple[int, ...], ...]  # index 0: the input
    saved: tuple[frozenset[int], ...]
    backward: tuple[tuple[int, ...], ...]
    grad_out: tuple[frozenset[int], ...]

    @property
    def length(self) -> int:
        return len(self.forward) - 1


def saved_node(i: int) -> int:
    return 3 * i - 2


def forward_node(i: int) -> int:
    return 3 * i - 1 if i > 0 else 0


def backward_node(i: int) -> int:
    return 3 * i


def chain_graph(chain: Chain) -> tuple[Graph, ChainLayout]:
    """The graph.json of a chain given directly (see the module doc) and its layout."""
    length = chain.length
    label = chain.name or "chain"
    nodes = [
        Node(
            id=0,
            name="input",
            op="input",
            output_bytes=chain.input_bytes,
            recomputable=False,
            module_path="input",
        )
    ]
    edges: list[Edge] = []
    for i, st in enumerate(chain.stages, start=1):
        stage_name = st.name or f"stage{i}"
        nodes.append(
            Node(
                id=saved_node(i),
                name=f"{stage_name}.saved",
                op="saved_for_backward",
                output_bytes=st.saved_bytes - st.output_bytes,
                workspace_bytes=st.all_tmp_bytes,
                module_path=stage_name,
            )
        )
        nodes.append(
            Node(
                id=forward_node(i),
                name=f"{stage_name}.forward",
                op="forward",
                compute_ms=st.forward_ms,
                cost_source=CostSource.imported,
                output_bytes=st.output_bytes,
                workspace_bytes=st.forward_tmp_bytes,
                module_path=stage_name,
            )
        )
        nodes.append(
            Node(
                id=backward_node(i),
                name=f"{stage_name}.backward",
                op="backward",
                phase=Phase.backward,
                compute_ms=st.backward_ms,
                cost_source=CostSource.imported,
                output_bytes=st.grad_input_bytes,
                workspace_bytes=st.backward_tmp_bytes,
                module_path=stage_name,
            )
        )
        prev = forward_node(i - 1)
        edges += [
            Edge(source=prev, target=forward_node(i)),
            Edge(source=prev, target=saved_node(i)),
            Edge(source=prev, target=backward_node(i)),
            Edge(source=forward_node(i), target=backward_node(i)),
            Edge(source=saved_node(i), target=backward_node(i)),
        ]
        if i < length:
            edges.append(Edge(source=backward_node(i + 1), target=backward_node(i)))
    order = [0]
    for i in range(1, length + 1):
        order += [forward_node(i), saved_node(i)]
    order += [backward_node(i) for i in range(length, 0, -1)]
    graph = Graph(
        nodes=nodes,
        edges=edges,
        fixed=FixedMemory(other_bytes=chain.fixed_bytes),
        order=order,
        metadata=GraphMetadata(
            model_name=label, source="chain.json", extra={"chain": chain_document(chain)}
        ),
    )
    rng = range(1, length + 1)
    layout = ChainLayout(
        forward=((),) + tuple((forward_node(i), saved_node(i)) for i in rng),
        ck_forward=((),) + tuple((forward_node(i),) for i in rng),
        joint=((0,),) + tuple((forward_node(i),) for i in rng),
        saved=(frozenset(),) + tuple(frozenset({saved_node(i), forward_node(i)}) for i in rng),
        backward=((),) + tuple((backward_node(i),) for i in rng),
        grad_out=(frozenset(),) + tuple(frozenset({backward_node(i)}) for i in rng),
    )
    return graph, layout


def chain_of_graph(graph: Graph) -> Chain | None:
    """The chain a graph was built from by `chain_graph`, when it is exactly that graph."""
    from planner.solvers.chain.model import chain_from_dict

    doc = graph.metadata.extra.get("chain")
    if not isinstance(doc, dict):
        return None
    try:
        chain = chain_from_dict(doc)
    except ValueError:
        return None
    rebuilt, _ = chain_graph(chain)
    return chain if rebuilt.content_hash() == graph.content_hash() else None
