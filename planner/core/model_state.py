"""Model state in graph.json: parameters, gradients and optimizer state, and who holds what.

`ModelState` lists each parameter tensor (bytes, owning module, the graph node that computes its
gradient) with the optimizer, the precision, the ZeRO stage and the data-parallel degree; the
gradient and optimizer bytes follow from them (DESIGN.md, Resources):

- `bytes` is the parameter as the model computes with it: fp32 (4 bytes an element) under
  "fp32", 16-bit (2 bytes) under "bf16-mixed" / "fp16-mixed".
- gradients have the weights' dtype: `bytes` per trainable parameter.
- optimizer state is fp32: 0 (sgd), 1 (sgd-momentum) or 2 (adam, adamw) states of 4 bytes an
  element; mixed precision adds an fp32 master copy of each trainable weight (4 bytes an element).
  Adam under bf16-mixed: 2 + 2 + 4 + 8 = 16 bytes an element; under fp32: 4 + 4 + 8 = 16.
- ZeRO with data-parallel degree d keeps 1/d (rounded up, per parameter) on each device: stage 1
  of the optimizer state (master copy included, as in the ZeRO paper), stage 2 also of the
  gradients, stage 3 also of the weights.

"fp32" means no mixed precision: gradients and states in the parameters' own dtype, so a model
trained under `torch.autocast` (fp32 weights) is "fp32" here, and a model cast to bf16 and trained
with a torch optimizer (bf16 states, no master copy) is "fp32" with 2-byte `bytes`.

This module imports nothing of the project (a contract); planner.core.graph re-exports its classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Optimizer = Literal["sgd", "sgd-momentum", "adam", "adamw"]
Precision = Literal["fp32", "bf16-mixed", "fp16-mixed"]
GradientLifetime = Literal["step", "backward"]

# fp32 state tensors per parameter element, by optimizer
OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
_FP32_BYTES = 4
_HALF_BYTES = 2


class ParameterState(BaseModel):
    """One parameter tensor of the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        min_length=1, description="Fully qualified name, e.g. 'blocks.0.attn.qkv.weight'."
    )
    module_path: str = Field(
        default="", description="Owning module, e.g. 'blocks.0.attn' (matches Node.module_path)."
    )
    bytes: int = Field(
        ge=0,
        le=2**60,  # planner.core.graph.MAX_BYTES (not imported: graph imports this module)
        description="Bytes of the weights as the model computes with them (fp32 under 'fp32', "
        "16-bit under the mixed precisions), unsharded.",
    )
    trainable: bool = Field(
        default=True, description="False: frozen, no gradient and no optimizer state."
    )
    gradient_node: int | None = Field(
        default=None,
        ge=0,
        description="Id of the node whose output is this parameter's gradient; with "
        "gradient_lifetime 'backward' the gradient buffer is resident from that node on.",
    )


@dataclass(frozen=True)
class StateBytes:
    """Per-device bytes of model state (after ZeRO sharding)."""

    parameters_bytes: int = 0
    gradients_bytes: int = 0
    optimizer_bytes: int = 0  # optimizer states plus the fp32 master copy
    master_weights_bytes: int = 0  # the master copy alone (part of optimizer_bytes)

    @property
    def total_bytes(self) -> int:
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes

    def __add__(self, other: StateBytes) -> StateBytes:
        return StateBytes(
            self.parameters_bytes + other.parameters_bytes,
            self.gradients_bytes + other.gradients_bytes,
            self.optimizer_bytes + other.optimizer_bytes,
            self.master_weights_bytes + other.master_weights_bytes,
        )

    def __str__(self) -> str:
        return (
            f"parameters {self.parameters_bytes} B, gradients {self.gradients_bytes} B, "
            f"optimizer {self.optimizer_bytes} B (master copy {self.master_weights_bytes} B)"
        )


class ModelState(BaseModel):
    """Parameters, optimizer, precision and sharding: the model-state part of a step's memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parameters: list[ParameterState] = Field(description="Every parameter tensor, names unique.")
    optimizer: Optimizer = Field(
        default="sgd",
        description="Optimizer: fp32 state tensors per element: sgd 0, sgd-momentum 1, adam 2, "
        "adamw 2.",
    )
    precision: Precision = Field(
        default="fp32",
        description="'fp32': no mixed precision (gradients and states in the weights' dtype). "
        "'bf16-mixed' / 'fp16-mixed': 16-bit weights and gradients, fp32 master copy and states.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=0,
        description="ZeRO stage: 1 shards optimizer state (and master copy) over the "
        "data-parallel ranks, 2 also gradients, 3 also parameters.",
    )
    data_parallel_degree: int = Field(
        default=1, ge=1, description="Data-parallel ranks the ZeRO stage shards over."
    )
    gradient_lifetime: GradientLifetime = Field(
        default="step",
        description="'step': gradient buffers resident for the whole step (kept across steps, "
        "gradient accumulation). 'backward': each appears when its gradient_node is computed and "
        "stays until the optimizer step (zero_grad(set_to_none=True), torch's default; what "
        "planner.tracing writes by default). Absent: 'step', as files written before the "
        "tracer stated it meant.",
    )

    @field_validator("parameters")
    @classmethod
    def _unique_names(cls, parameters: list[ParameterState]) -> list[ParameterState]:
        seen: dict[str, int] = {}
        for i, p in enumerate(parameters):
            if p.name in seen:
                raise ValueError(
                    f"duplicate parameter name {p.name!r} (entries {seen[p.name]} and {i})"
                )
            seen[p.name] = i
        return parameters

    # -- arithmetic --------------------------------------------------------------------------
    def _shard(self, nbytes: int, from_stage: int) -> int:
        d = self.data_parallel_degree
        return -(-nbytes // d) if self.zero_stage >= from_stage and d > 1 else nbytes

    def parameter_bytes(self, p: ParameterState) -> StateBytes:
        """What parameter `p` costs on one device."""
        weights = self._shard(p.bytes, 3)
        if not p.trainable:
            return StateBytes(parameters_bytes=weights)
        mixed = self.precision != "fp32"
        elements_fp32 = p.bytes * (_FP32_BYTES // _HALF_BYTES) if mixed else p.bytes
        master = elements_fp32 if mixed else 0
        states = OPTIMIZER_STATES[self.optimizer] * elements_fp32
        return StateBytes(
            parameters_bytes=weights,
            gradients_bytes=self._shard(p.bytes, 2),
            optimizer_bytes=self._shard(master + states, 1),
            master_weights_bytes=self._shard(master, 1),
        )

    def per_parameter(self) -> Iterator[tuple[ParameterState, StateBytes]]:
        for p in self.parameters:
            yield p, self.parameter_bytes(p)

    def total(self) -> StateBytes:
        out = StateBytes()
        for _, b in self.per_parameter():
            out = out + b
        return out

    def resident_bytes(self) -> tuple[int, dict[int, int]]:
        """(bytes resident all step, node id -> gradient bytes held from that node on).

        Under gradient_lifetime 'backward' a trainable parameter's gradient is held from its
        gradient_node; one without a gradient_node is charged for the whole step (we cannot
        place it, and the safe side is to count it from the start).
        """
        start = 0
        held: dict[int, int] = {}
        for p, b in self.per_parameter():
            start += b.parameters_bytes + b.optimizer_bytes
            g = b.gradients_bytes
            if self.gradient_lifetime == "backward" and p.gradient_node is not None:
                if g:
                    held[p.gradient_node] = held.get(p.gradient_node, 0) + g
            else:
                start += g
        return start, held
