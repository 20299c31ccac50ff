"""Module-level chain graphs built from layer figures: synthetic heterogeneous chains and
transformers from their configuration (for tests and benchmarks; torch-free).

Each layer i becomes a forward node `<name>` (its internal saved activations, its forward time)
and a forward node `<name>.out` (its output, the boundary a stage sends on); two backward nodes
reading its input, its saved activations and the next layer's input gradient: `.grad_input`
(I, the gradient it sends back) and `.grad_weight` (W, the gradient node of its parameters in
the graph's model_state), sharing the backward time by `weight_fraction`. The loss follows the
last layer.

`transformer_layers` sizes a GPT: token/position embedding, L decoder blocks, final norm +
vocabulary head (+ the cross-entropy's fp32 logits), activations per Korthikanti et al. 2022
(s*b*h*(34 + 5*a*s/h) bytes a block at 16-bit), times from FLOPs at a given throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.graph import Edge, Graph, GraphMetadata, ModelState, Node, ParameterState, Phase


@dataclass(frozen=True)
class LayerSpec:
    name: str
    forward_ms: float
    backward_ms: float
    saved_bytes: int  # internal activations kept for the backward (the output excluded)
    output_bytes: int  # what the next layer receives
    parameter_bytes: int
    workspace_bytes: int = 0
    weight_fraction: float = 0.5  # of backward_ms spent on weight gradients (W)


def chain_graph(
    layers: Sequence[LayerSpec],
    *,
    input_bytes: int = 0,
    optimizer: str = "adam",
    precision: str = "bf16-mixed",
    name: str = "chain",
) -> Graph:
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []
    n = len(layers)
    act = [2 * i for i in range(n)]  # internal activations node of layer i
    out = [2 * i + 1 for i in range(n)]  # output node of layer i
    loss = 2 * n
    grad_in = [2 * n + 1 + 2 * (n - 1 - i) for i in range(n)]  # I of layer i
    grad_w = [g + 1 for g in grad_in]  # W of layer i
    for i, layer in enumerate(layers):
        nodes.append(Node(id=act[i], name=layer.name, op="module.forward", phase=Phase.forward,
                          compute_ms=layer.forward_ms, output_bytes=layer.saved_bytes,
                          workspace_bytes=layer.workspace_bytes, module_path=layer.name))
        nodes.append(Node(id=out[i], name=f"{layer.name}.out", op="module.output",
                          phase=Phase.forward, output_bytes=layer.output_bytes,
                          module_path=layer.name))
        edges.append((act[i], out[i]))
        edges += [(act[i], grad_in[i]), (act[i], grad_w[i])]
        if i > 0:
            edges += [(out[i - 1], act[i]), (out[i - 1], grad_in[i]), (out[i - 1], grad_w[i])]
    nodes.append(Node(id=loss, name="loss", op="loss", phase=Phase.loss, output_bytes=4))
    edges += [(out[n - 1], loss), (loss, grad_in[n - 1]), (loss, grad_w[n - 1])]
    for i in reversed(range(n)):
        layer = layers[i]
        w_ms = layer.backward_ms * layer.weight_fraction
        nodes.append(Node(id=grad_in[i], name=f"{layer.name}.grad_input", op="module.backward",
                          phase=Phase.backward, compute_ms=layer.backward_ms - w_ms,
                          output_bytes=layers[i - 1].output_bytes if i else input_bytes,
                          workspace_bytes=layer.workspace_bytes, module_path=layer.name))
        nodes.append(Node(id=grad_w[i], name=f"{layer.name}.grad_weight", op="module.backward",
                          phase=Phase.backward, compute_ms=w_ms, output_bytes=0,
                          workspace_bytes=layer.workspace_bytes, module_path=layer.name))
        if i + 1 < n:
            edges += [(grad_in[i + 1], grad_in[i]), (grad_in[i + 1], grad_w[i])]
    params = [
        ParameterState(name=f"{layer.name}.weight", module_path=layer.name,
                       bytes=layer.parameter_bytes, gradient_node=grad_w[i])
        for i, layer in enumerate(layers) if layer.parameter_bytes
    ]
    return Graph(
        nodes=nodes,
        edges=[Edge(source=u, target=v) for u, v in edges],
        model_state=ModelState(parameters=params, optimizer=optimizer,  # type: ignore[arg-type]
                               precision=precision),  # type: ignore[arg-type]
        metadata=GraphMetadata(model_name=name, source="planner.solvers.pipeline.chains"),
    )


def transformer_layers(
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    sequence: int,
    micro_batch: int,
    *,
    tflops: float = 300.0,
    bytes_per_value: int = 2,
) -> list[LayerSpec]:
    """A GPT as LayerSpecs: 'tok' (embeddings), 'h.0'..'h.{L-1}', 'head' (norm + vocabulary
    projection + loss inputs). Forward time = 2 x FLOPs-per-token x tokens / throughput,
    backward twice the forward."""
    s, b, h, a = sequence, micro_batch, hidden, heads
    tokens = s * b
    boundary = tokens * h * bytes_per_value

    def ms(flops: float) -> float:
        return flops / (tflops * 1e12) * 1e3

    block_flops = tokens * (24 * h * h + 4 * s * h)
    block_saved = s * b * h * (34 + 5 * a * s // h) - boundary  # the output is `.out`
    emb_params = (vocab + s) * h * bytes_per_value
    head_flops = tokens * 2 * h * vocab
    out = [LayerSpec("tok", ms(tokens * h), ms(2 * tokens * h), boundary, boundary, emb_params,
                     weight_fraction=1.0)]
    for i in range(layers):
        out.append(LayerSpec(f"h.{i}", ms(block_flops), ms(2 * block_flops), block_saved,
                             boundary, 12 * h * h * bytes_per_value, workspace_bytes=boundary))
    logits = tokens * vocab * (bytes_per_value + 4)  # 16-bit logits and fp32 softmax
    out.append(LayerSpec("head", ms(head_flops), ms(2 * head_flops), logits, tokens * 4,
                         vocab * h * bytes_per_value, workspace_bytes=tokens * vocab * 4))
    return out
