"""The chain solver's block plan as a typed part of plan.json (`Plan.block_plan`): the one
BlockPlan class (the chain solver derives it from its operation sequences,
planner.solvers.chain.blocks; runtime/block_executor.py applies it).

Same JSON as version 1's `details["block_plan"]`: {"schema": "block-plan-1", "modes": "KCRR",
"forward_runs": [1, 2, 2, 2]}. Modes per chain block (numbered from 0):

- `K` keep: run normally, autograd keeps everything the backward needs.
- `C` checkpoint: run without saving, keep the block's input: the start of a checkpointed
  segment, as in `torch.utils.checkpoint`.
- `R` recompute: run without saving, input not kept: continues the segment of the nearest `C`
  before it; recomputed from that checkpoint during the backward pass.

A runtime applies it with one level of checkpointing: every maximal run `C R R ...` is one
checkpointed segment (`segments()`), `K` blocks run plainly. Text form (`text()`):
"blocks 0–5 kept, 6–23 checkpointed every 3rd".
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

BLOCK_PLAN_SCHEMA = "block-plan-1"


class BlockMode(StrEnum):
    keep = "K"
    checkpoint = "C"
    recompute = "R"


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
        if isinstance(data, dict) and isinstance(data.get("modes"), Sequence) \
                and not isinstance(data["modes"], str):
            data = {**data, "modes": "".join(str(m) for m in data["modes"])}  # BlockModes
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
            if mode == BlockMode.checkpoint:
                out.append((b, b))
            elif mode == BlockMode.recompute:
                out[-1] = (out[-1][0], b)
        return out

    def kept(self) -> list[int]:
        """The blocks run plainly (mode K)."""
        return [b for b, m in enumerate(self.modes) if m == BlockMode.keep]

    def text(self) -> str:
        """'blocks 0–5 kept, 6–23 checkpointed every 3rd'."""
        parts: list[str] = []
        b, n = 0, len(self.modes)
        while b < n:
            kept = self.modes[b] == BlockMode.keep
            e = b
            while e + 1 < n and (self.modes[e + 1] == BlockMode.keep) == kept:
                e += 1
            if kept:
                parts.append(f"{_span(b, e)} kept")
            else:
                sizes = [hi - lo + 1 for lo, hi in self.segments() if b <= lo <= e]
                parts.append(f"{_span(b, e)} checkpointed {_every(sizes)}")
            b = e + 1
        return "blocks " + ", ".join(parts) if parts else "no blocks"

    def to_json(self) -> dict[str, Any]:
        """The JSON form (as `model_dump`): {"schema": "block-plan-1", "modes", "forward_runs"}."""
        return self.model_dump()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """The JSON form back; its "schema" must be there and be block-plan-1."""
        if data.get("schema") != BLOCK_PLAN_SCHEMA:
            raise ValueError(f"schema: expected {BLOCK_PLAN_SCHEMA!r}, got {data.get('schema')!r}")
        return cls.model_validate(data)


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}–{hi}"


def _every(sizes: list[int]) -> str:
    if len(sizes) == 1:
        return "as one segment"
    if len(set(sizes)) == 1:
        k = sizes[0]
        return "every block" if k == 1 else f"every {_ordinal(k)}"
    return "in segments of " + ", ".join(str(s) for s in sizes)


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
