"""What a step holds besides its activations: fixed bytes and gradient buffers over time.

The simulator charges `StepMemory.start_bytes` for the whole step and adds
`held_from_node[v]` when node v is first computed, to the end of the step (gradient buffers under
gradient_lifetime 'backward'). A graph without model_state gives exactly today's figures:
`StepMemory(start_bytes=graph.fixed_bytes, held_from_node={})`.

`model_state_breakdown` says where the model-state bytes go (per device, per module), for reports
such as `planner-cli info`, and answers "what if" for another ZeRO stage or data-parallel degree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.model_state import ModelState, StateBytes


@dataclass(frozen=True)
class StepMemory:
    """Bytes a step holds outside its activations."""

    start_bytes: int  # resident for the whole step (graph.fixed_bytes)
    # node id -> bytes resident from the node's first computation to the end of the step
    held_from_node: Mapping[int, int] = field(default_factory=dict)

    @property
    def end_bytes(self) -> int:
        """Resident once every holding node has run (the optimizer step's view)."""
        return self.start_bytes + sum(self.held_from_node.values())

    def __str__(self) -> str:
        held = sum(self.held_from_node.values())
        return (
            f"{self.start_bytes} B from the start, {held} B held from "
            f"{len(self.held_from_node)} nodes on"
        )


def step_memory(graph: Graph) -> StepMemory:
    """The fixed and held bytes the simulator charges for `graph`."""
    if graph.model_state is None:
        return StepMemory(start_bytes=graph.fixed_bytes, held_from_node={})
    _, held = graph.index.model_state_resident
    return StepMemory(start_bytes=graph.fixed_bytes, held_from_node=MappingProxyType(dict(held)))


@dataclass(frozen=True)
class ModelStateBreakdown:
    """Model-state bytes on one device, in total and per module (module_path, '' = root)."""

    per_device: StateBytes
    per_module: Mapping[str, StateBytes]
    optimizer: str = ""
    precision: str = ""
    zero_stage: int = 0
    data_parallel_degree: int = 1
    gradient_lifetime: str = "step"
    derived: bool = True  # False: copied from FixedMemory (no model_state in the graph)

    @property
    def parameters_bytes(self) -> int:
        return self.per_device.parameters_bytes

    @property
    def gradients_bytes(self) -> int:
        return self.per_device.gradients_bytes

    @property
    def optimizer_bytes(self) -> int:
        return self.per_device.optimizer_bytes

    @property
    def master_weights_bytes(self) -> int:
        return self.per_device.master_weights_bytes

    @property
    def total_bytes(self) -> int:
        return self.per_device.total_bytes

    def lines(self) -> list[str]:
        """A text form, one line each: the settings, the totals, then each module."""
        if not self.derived:
            return [f"model state (from fixed memory): {self.per_device}"]
        head = (
            f"model state per device: {self.optimizer}, {self.precision}, ZeRO-{self.zero_stage} "
            f"over {self.data_parallel_degree} data-parallel ranks, gradients held "
            f"{'all step' if self.gradient_lifetime == 'step' else 'from backward on'}"
        )
        out = [head, f"  total: {self.per_device}"]
        out += [f"  {m or '(root)'}: {b}" for m, b in self.per_module.items()]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def model_state_breakdown(
    graph: Graph, zero_stage: int | None = None, dp: int | None = None
) -> ModelStateBreakdown:
    """Per-device model-state bytes of `graph`, optionally for another ZeRO stage / dp degree."""
    ms = graph.model_state
    if ms is None:
        if zero_stage is not None or dp is not None:
            raise InputError(
                "the graph has no model_state: a ZeRO stage or data-parallel degree needs "
                "per-parameter bytes (trace the model again)"
            )
        f = graph.fixed
        return ModelStateBreakdown(
            per_device=StateBytes(f.parameters_bytes, f.gradients_bytes, f.optimizer_bytes),
            per_module={},
            derived=False,
        )
    ms = with_sharding(ms, zero_stage, dp)
    per_module: dict[str, StateBytes] = {}
    for p, b in ms.per_parameter():
        per_module[p.module_path] = per_module.get(p.module_path, StateBytes()) + b
    total = StateBytes()
    for b in per_module.values():
        total = total + b
    return ModelStateBreakdown(
        per_device=total,
        per_module=MappingProxyType(per_module),
        optimizer=ms.optimizer,
        precision=ms.precision,
        zero_stage=ms.zero_stage,
        data_parallel_degree=ms.data_parallel_degree,
        gradient_lifetime=ms.gradient_lifetime,
    )


def with_sharding(ms: ModelState, zero_stage: int | None, dp: int | None) -> ModelState:
    """`ms` with another ZeRO stage and/or data-parallel degree (validated: one-line errors)."""
    if zero_stage is None and dp is None:
        return ms
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise InputError(f"zero stage {zero_stage}: use 0, 1, 2 or 3")
    if dp is not None and dp < 1:
        raise InputError(f"data-parallel degree {dp}: must be at least 1")
    update: dict[str, int] = {}
    if zero_stage is not None:
        update["zero_stage"] = zero_stage
    if dp is not None:
        update["data_parallel_degree"] = dp
    return ModelState.model_validate({**ms.model_dump(), **update})
