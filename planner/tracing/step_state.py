"""What a traced step holds besides its ops: the result type, the model state of its
parameters, its fixed memory, batch size and dtype (shared by op- and module-level tracing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.core.graph import FixedMemory, Graph, ModelState, ParameterState

# state tensors per parameter
OPTIMIZER_STATES = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class TraceResult:
    """A traced step. For level "op" the joint fx graph and how graph nodes map onto it."""

    graph: Graph
    level: str
    joint: Any = None  # torch.fx.GraphModule of the joint forward+backward (op level)
    node_fx_names: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # the fx node whose output storage the graph node's output_bytes measure
    owner_fx_names: dict[int, str] = field(default_factory=dict)
    # fx name -> parameter/buffer/input
    primal_kinds: dict[str, str] = field(default_factory=dict)
    primal_names: dict[str, str] = field(default_factory=dict)  # fx name -> FQN / "inputs.K"
    tangent_fx_names: tuple[str, ...] = ()
    loss_fx_name: str = ""
    gradient_fx_names: dict[str, str] = field(default_factory=dict)  # param FQN -> fx name
    nodes_before_fusion: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # module level: per-block quantities
    capture: Any = None  # planner.tracing.capture.JointCapture (op level)

    @property
    def fx_to_node(self) -> dict[str, int]:
        return {name: nid for nid, names in self.node_fx_names.items() for name in names}


def tensor_bytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if hasattr(t, "element_size") else 0


def fixed_memory(
    model: Any,
    inputs: tuple[Any, ...],
    cap: Any,
    optimizer: str,
    model_state: ModelState | None = None,
) -> tuple[FixedMemory, dict[str, Any]]:
    """Parameters, gradients (one per trainable parameter), optimizer state, inputs, buffers.

    With `model_state` (op-level traces) parameters, gradients and optimizer state are its to
    charge and stay 0 here (one source of truth); the totals are the same either way. Gradient
    nodes also carry their real output bytes; the gradient bytes stand for the .grad buffers
    (held all step by default: the simulator frees sink outputs).
    """
    state = model_state or model_state_of(model, optimizer, {})
    totals = state.total()
    trainable_bytes = sum(p.bytes for p in state.parameters if p.trainable)
    buffers_bytes = sum(tensor_bytes(b) for b in model.buffers())
    inputs_bytes = sum(tensor_bytes(x) for x in inputs if hasattr(x, "element_size"))
    extra = {
        "buffers_bytes": buffers_bytes,
        "trainable_parameters_bytes": trainable_bytes,
    }
    if model_state is not None:
        return FixedMemory(inputs_bytes=inputs_bytes, other_bytes=buffers_bytes), extra
    fixed = FixedMemory(
        parameters_bytes=totals.parameters_bytes,
        gradients_bytes=totals.gradients_bytes,
        optimizer_bytes=totals.optimizer_bytes,
        inputs_bytes=inputs_bytes,
        other_bytes=buffers_bytes,
    )
    return fixed, extra


def model_state_of(model: Any, optimizer: str, gradient_nodes: dict[str, int]) -> ModelState:
    """One ParameterState per parameter (named as `named_parameters` does), its gradient node
    from `gradient_nodes` (FQN -> graph node id). The weights' own dtype, no mixed precision:
    gradients and optimizer state in that dtype, as torch optimizers keep them."""
    params = [
        ParameterState(
            name=fqn,
            module_path=fqn.rpartition(".")[0],
            bytes=tensor_bytes(p),
            trainable=bool(p.requires_grad),
            gradient_node=gradient_nodes.get(fqn) if p.requires_grad else None,
        )
        for fqn, p in model.named_parameters()
    ]
    return ModelState(parameters=params, optimizer=optimizer)  # type: ignore[arg-type]


def batch_size(inputs: tuple[Any, ...]) -> int | None:
    for x in inputs:
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) > 0 and int(shape[0]) >= 1:
            return int(shape[0])
    return None


def dtype_name(model: Any) -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return ""
