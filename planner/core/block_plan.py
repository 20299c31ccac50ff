"""The chain solver's block plan as a typed part of plan.json (`Plan.block_plan`).

Same JSON as version 1's `details["block_plan"]` (solvers/chain/blocks.py `BlockPlan.to_json`,
read by runtime/block_executor.py): {"schema": "block-plan-1", "modes": "KCRR",
"forward_runs": [1, 2, 2, 2]}. Modes per chain block: K keep, C checkpoint (keep its input), R
recompute (continues the segment of the C before it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

BLOCK_PLAN_SCHEMA = "block-plan-1"


class BlockPlan(BaseModel):
    """Per chain block: K keep, C checkpoint (keep its input), R recompute (continues the segment
    of the C before it); `forward_runs[b]` is how often the solver's sequence runs block b's
    forward. JSON: {"schema": "block-plan-1", "modes": "KCRR", "forward_runs": [1, 2, 2, 2]}."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    modes: str = Field(min_length=1, pattern=r"^[KCR]+$")
    forward_runs: list[int] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: object) -> object:
        if isinstance(data, str):
            return {"modes": data}
        if isinstance(data, dict) and "schema" in data:
            if data["schema"] != BLOCK_PLAN_SCHEMA:
                raise ValueError(f"schema: expected {BLOCK_PLAN_SCHEMA!r}, got {data['schema']!r}")
            data = {k: v for k, v in data.items() if k != "schema"}
        return data

    @model_validator(mode="after")
    def _check(self) -> BlockPlan:
        if not self.forward_runs:
            object.__setattr__(self, "forward_runs", [1] * len(self.modes))
        if len(self.forward_runs) != len(self.modes):
            raise ValueError(
                f"forward_runs: {len(self.forward_runs)} entries for {len(self.modes)} blocks"
            )
        for b, mode in enumerate(self.modes):
            if mode == "R" and (b == 0 or self.modes[b - 1] == "K"):
                raise ValueError(f"block {b}: 'R' must follow a 'C' or 'R' block")
            if self.forward_runs[b] < 1:
                raise ValueError(f"block {b}: forward_runs must be >= 1")
        return self

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"schema": BLOCK_PLAN_SCHEMA, "modes": self.modes, "forward_runs": self.forward_runs}

    def __str__(self) -> str:
        return self.modes

    def segments(self) -> list[tuple[int, int]]:
        """Checkpointed segments as (first block, last block), inclusive."""
        out: list[tuple[int, int]] = []
        for b, mode in enumerate(self.modes):
            if mode == "C":
                out.append((b, b))
            elif mode == "R":
                out[-1] = (out[-1][0], b)
        return out
