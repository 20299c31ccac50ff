"""A small training graph whose weight gradients are held to the end of the step, shaped like a
traced GPT with tied embeddings: the head's weight gradient (large, not held itself) is added to
the embedding's at the very last node, which holds the sum. Every layer's weight gradient is a
dead end held from its computation on, so list-scheduled orders meet them all at that node."""

from __future__ import annotations

from planner.core.graph import Edge, Graph, Node, Phase
from planner.core.model_state import ModelState, ParameterState

ACT = 1_000  # an activation or an activation's gradient
LOGITS = 4_000
EMBED = 8_000  # the tied embedding and each half of its gradient
WEIGHT = 3_000  # one layer's weight (and its gradient, held)


def tied_training_graph(layers: int = 4) -> Graph:
    nodes: list[Node] = []
    edges: list[Edge] = []

    def add(name: str, phase: Phase, out: int, ms: float, *inputs: int) -> int:
        nid = len(nodes)
        nodes.append(Node(id=nid, name=name, phase=phase, output_bytes=out, compute_ms=ms))
        edges.extend(Edge(source=u, target=nid) for u in inputs)
        return nid

    fwd = [add("embed", Phase.forward, ACT, 1.0)]
    for i in range(layers):
        fwd.append(add(f"layer{i}", Phase.forward, ACT, 2.0 + i % 2, fwd[-1]))
    logits = add("head", Phase.forward, LOGITS, 8.0, fwd[-1])
    loss = add("loss", Phase.loss, 4, 1.0, logits)
    grad_logits = add("loss_backward", Phase.backward, LOGITS, 2.0, loss, logits)
    head_grad = add("head_weight_grad", Phase.backward, EMBED, 8.0, grad_logits, fwd[-1])
    grad = add("head_input_grad", Phase.backward, ACT, 8.0, grad_logits)
    params = [ParameterState(name="embed.weight", bytes=EMBED)]
    for i in reversed(range(layers)):
        w = add(f"layer{i}_weight_grad", Phase.backward, WEIGHT, 2.0, grad, fwd[i])
        params.append(ParameterState(name=f"layer{i}.weight", bytes=WEIGHT, gradient_node=w))
        grad = add(f"layer{i}_input_grad", Phase.backward, ACT, 2.0, grad, fwd[i])
    embed_grad = add("embed_grad", Phase.backward, EMBED, 1.0, grad)
    tied = add("tied_grad_sum", Phase.backward, EMBED, 0.5, head_grad, embed_grad)
    params[0] = ParameterState(name="embed.weight", bytes=EMBED, gradient_node=tied)
    return Graph(nodes=nodes, edges=edges,
                 model_state=ModelState(parameters=params, gradient_lifetime="backward"))
