"""The chain model of Rotor (Beaumont et al. 2019) and chain.json, its file form.

A chain is stages 1..L; stage i reads a^{i-1} and writes a^i. Per stage:

- `forward_ms`, `backward_ms`: compute costs (graph cost units).
- `output_bytes` (x_i): bytes of a^i.
- `saved_bytes` (x̄_i ≥ x_i): bytes resident after the forward when it is run with full saving
  (F_all): a^i plus everything the backward pass needs.
- `forward_tmp_bytes`: transient bytes while the forward runs (on top of its outputs).
- `forward_all_tmp_bytes`: the same when run with full saving (default `forward_tmp_bytes`):
  F_all peaks at resident + max(x + forward_tmp, x̄ + forward_all_tmp), which lets a segment
  whose internal values peak above x be modelled exactly.
- `backward_tmp_bytes`: transient bytes while the backward runs (on top of its output).
- `grad_input_bytes`: bytes of δ^{i-1}, the gradient the backward of stage i produces
  (default x_{i-1}). δ^L does not exist: the last stage is the end of the step (the loss).

Chain-level: `input_bytes` (x_0, bytes of a^0, resident throughout) and `fixed_bytes`
(parameters, optimizer state: resident throughout).

chain.json (schema_version "chain-1"):

    {"schema_version": "chain-1", "name": "bert-12", "input_bytes": 1048576, "fixed_bytes": 0,
     "stages": [{"name": "block0", "forward_ms": 1.2, "backward_ms": 2.5,
                 "output_bytes": 1048576, "saved_bytes": 8388608,
                 "forward_tmp_bytes": 0, "backward_tmp_bytes": 2097152}, ...]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.core.errors import InputError, describe_validation_error

CHAIN_SCHEMA_VERSION: Literal["chain-1"] = "chain-1"


@dataclass(frozen=True)
class Stage:
    forward_ms: float
    backward_ms: float
    output_bytes: int  # x
    saved_bytes: int  # x̄ ≥ x
    forward_tmp_bytes: int = 0
    backward_tmp_bytes: int = 0
    grad_input_bytes: int = 0  # δ^{i-1}
    name: str = ""
    forward_all_tmp_bytes: int | None = None  # None: forward_tmp_bytes

    @property
    def all_tmp_bytes(self) -> int:
        explicit = self.forward_all_tmp_bytes
        return self.forward_tmp_bytes if explicit is None else explicit

    @property
    def all_forward_peak_bytes(self) -> int:
        """Bytes above the resident set while F_all runs."""
        return max(
            self.output_bytes + self.forward_tmp_bytes, self.saved_bytes + self.all_tmp_bytes
        )


@dataclass(frozen=True)
class Chain:
    """Stages are held 0-based in `stages`; the docs and the DP number them 1..L."""

    stages: tuple[Stage, ...]
    input_bytes: int = 0
    fixed_bytes: int = 0
    name: str = ""

    @property
    def length(self) -> int:
        return len(self.stages)

    def stage(self, i: int) -> Stage:
        """Stage i, 1-based."""
        return self.stages[i - 1]

    def x(self, i: int) -> int:
        """Bytes of a^i (a^0 is the input)."""
        return self.input_bytes if i == 0 else self.stages[i - 1].output_bytes

    def delta(self, i: int) -> int:
        """Bytes of δ^i, the gradient w.r.t. a^i (δ^L does not exist)."""
        if i >= self.length:
            return 0
        return self.stages[i].grad_input_bytes

    @property
    def total_ms(self) -> float:
        return sum(s.forward_ms + s.backward_ms for s in self.stages)


class StageModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = ""
    forward_ms: float = Field(ge=0)
    backward_ms: float = Field(ge=0)
    output_bytes: int = Field(ge=0, description="x: bytes of the stage's output.")
    saved_bytes: int | None = Field(
        default=None, ge=0, description="x̄: bytes kept for backward under full saving (≥ x)."
    )
    forward_tmp_bytes: int = Field(default=0, ge=0)
    forward_all_tmp_bytes: int | None = Field(
        default=None, ge=0, description="Transient bytes under full saving (default: forward's)."
    )
    backward_tmp_bytes: int = Field(default=0, ge=0)
    grad_input_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of the gradient w.r.t. the stage input."
    )

    @model_validator(mode="after")
    def _saved_covers_output(self) -> StageModel:
        if self.saved_bytes is not None and self.saved_bytes < self.output_bytes:
            raise ValueError(
                f"saved_bytes {self.saved_bytes} < output_bytes {self.output_bytes}: the saved "
                "set includes the output; give saved_bytes ≥ output_bytes"
            )
        return self


class ChainDocument(BaseModel):
    """chain.json."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal["chain-1"] = CHAIN_SCHEMA_VERSION
    name: str = ""
    input_bytes: int = Field(default=0, ge=0)
    fixed_bytes: int = Field(default=0, ge=0)
    stages: list[StageModel] = Field(min_length=1)

    def to_chain(self) -> Chain:
        stages: list[Stage] = []
        previous = self.input_bytes
        for s in self.stages:
            stages.append(
                Stage(
                    forward_ms=s.forward_ms,
                    backward_ms=s.backward_ms,
                    output_bytes=s.output_bytes,
                    saved_bytes=s.output_bytes if s.saved_bytes is None else s.saved_bytes,
                    forward_tmp_bytes=s.forward_tmp_bytes,
                    backward_tmp_bytes=s.backward_tmp_bytes,
                    grad_input_bytes=previous if s.grad_input_bytes is None else s.grad_input_bytes,
                    name=s.name,
                    forward_all_tmp_bytes=s.forward_all_tmp_bytes,
                )
            )
            previous = s.output_bytes
        return Chain(
            stages=tuple(stages),
            input_bytes=self.input_bytes,
            fixed_bytes=self.fixed_bytes,
            name=self.name,
        )


def chain_document(chain: Chain) -> dict[str, Any]:
    """The chain.json form of a chain (every field explicit)."""
    return {
        "schema_version": CHAIN_SCHEMA_VERSION,
        "name": chain.name,
        "input_bytes": chain.input_bytes,
        "fixed_bytes": chain.fixed_bytes,
        "stages": [
            {
                "name": s.name,
                "forward_ms": s.forward_ms,
                "backward_ms": s.backward_ms,
                "output_bytes": s.output_bytes,
                "saved_bytes": s.saved_bytes,
                "forward_tmp_bytes": s.forward_tmp_bytes,
                "forward_all_tmp_bytes": s.forward_all_tmp_bytes,
                "backward_tmp_bytes": s.backward_tmp_bytes,
                "grad_input_bytes": s.grad_input_bytes,
            }
            for s in chain.stages
        ],
    }


def is_chain_document(data: Any) -> bool:
    return isinstance(data, dict) and ("stages" in data or "chain" in data)


def chain_from_dict(data: Any, where: str = "chain") -> Chain:
    """Validate a chain.json document; bad input is one InputError line naming the field."""
    if isinstance(data, dict) and "chain" in data and "stages" not in data:
        data = data["chain"]
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a chain.json object with 'stages'")
    try:
        return ChainDocument.model_validate(data).to_chain()
    except ValidationError as e:
        raise InputError(f"{where}: {describe_validation_error(e, data)}") from None


def homogeneous_chain(
    length: int,
    *,
    forward_ms: float = 1.0,
    backward_ms: float = 1.0,
    output_bytes: int = 1,
    saved_bytes: int | None = None,
    grad_bytes: int | None = None,
) -> Chain:
    """A chain of identical stages (Revolve's setting)."""
    saved = output_bytes if saved_bytes is None else saved_bytes
    grad = output_bytes if grad_bytes is None else grad_bytes
    stage = Stage(forward_ms, backward_ms, output_bytes, saved, 0, 0, grad)
    return Chain(stages=(stage,) * length, input_bytes=output_bytes, name=f"homogeneous{length}")
