"""Block-level plans for the runtime: which block runs in which mode during the forward pass.

Blocks are the chain's stages, numbered from 0 (block b is stage b+1). Each block has a mode,
read from the first forward pass of a chain operation sequence:

- `K` keep: run normally, autograd keeps everything the backward needs (F_all).
- `C` checkpoint: run without saving, keep the block's input (F_ck): the start of a
  checkpointed segment, as in `torch.utils.checkpoint`.
- `R` recompute: run without saving, input not kept (F_∅): continues the segment of the
  nearest `C` before it; recomputed from that checkpoint during the backward pass.

A runtime engineer can apply it with one level of checkpointing: every maximal run `C R R ...`
is one checkpointed segment (`BlockPlan.segments()`), `K` blocks run plainly
(`one_level_ops()` is that schedule; planner methods report its peak and cost in
`details["block_plan_one_level"]`). The solver's schedule may recompute nested segments more
cleverly than one level does; its exact operation sequence travels with the plan
(`details["chain_ops"]`) and `forward_runs` says how many times it runs each block's forward.
`BlockPlan.from_solution(solve_rotor(chain, budget).ops)` derives a plan from a rotor result.

JSON form (`to_json`):

    {"schema": "block-plan-1", "modes": "KKKKKKCRRCRRCRRCRRCRRCRR",
     "forward_runs": [1, 1, 1, 1, 1, 1, 2, 2, 2, ...]}

Text form (`text`): "blocks 0–5 kept, 6–23 checkpointed every 3rd".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from planner.solvers.chain.sequence import Op, OpKind

BLOCK_PLAN_SCHEMA = "block-plan-1"


class BlockMode(StrEnum):
    keep = "K"
    checkpoint = "C"
    recompute = "R"


_FIRST_MODE = {
    OpKind.f_all: BlockMode.keep,
    OpKind.f_ck: BlockMode.checkpoint,
    OpKind.f_none: BlockMode.recompute,
}


@dataclass(frozen=True)
class BlockPlan:
    modes: tuple[BlockMode, ...]
    forward_runs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.modes) != len(self.forward_runs):
            raise ValueError("modes and forward_runs must have one entry per block")
        for b, mode in enumerate(self.modes):
            if mode is BlockMode.recompute and (b == 0 or self.modes[b - 1] is BlockMode.keep):
                raise ValueError(f"block {b}: 'R' must follow a 'C' or 'R' block")

    @classmethod
    def from_ops(cls, length: int, ops: Sequence[Op]) -> BlockPlan:
        modes: list[BlockMode | None] = [None] * length
        runs = [0] * length
        for op in ops:
            if op.kind in _FIRST_MODE:
                b = op.stage - 1
                runs[b] += 1
                if modes[b] is None:
                    modes[b] = _FIRST_MODE[op.kind]
        if any(m is None for m in modes):
            raise ValueError("the sequence never runs some block's forward")
        return cls(tuple(m for m in modes if m is not None), tuple(runs))

    @classmethod
    def from_solution(cls, ops: Sequence[Op] | None) -> BlockPlan | None:
        """The block plan of a solver's sequence (e.g. `solve_rotor(...).ops`); None: no plan."""
        if ops is None:
            return None
        return cls.from_ops(sum(op.kind is OpKind.backward for op in ops), ops)

    def one_level_ops(self) -> list[Op]:
        """The sequence a one-level runtime runs for this plan: the forward pass by mode, then
        each checkpointed segment recomputed once with full saving just before its backward.
        Its `run_sequence` peak and cost are what applying the block plan as-is costs."""
        length = len(self.modes)
        first = {mode: kind for kind, mode in _FIRST_MODE.items()}
        ops = [Op(first[m], b + 1) for b, m in enumerate(self.modes)]
        starts = {hi: lo for lo, hi in self.segments()}
        stage = length
        while stage >= 1:
            b = stage - 1
            if self.modes[b] is BlockMode.keep:
                ops.append(Op(OpKind.backward, stage))
                stage -= 1
                continue
            lo = starts[b] + 1  # the segment is stages lo..stage
            ops.append(Op(OpKind.discard, stage))  # a^stage is recomputed with the segment
            ops.extend(Op(OpKind.f_all, k) for k in range(lo, stage + 1))
            ops.extend(Op(OpKind.backward, k) for k in range(stage, lo - 1, -1))
            stage = lo - 1
        return ops

    def segments(self) -> list[tuple[int, int]]:
        """Checkpointed segments as (first block, last block), inclusive."""
        out: list[tuple[int, int]] = []
        for b, mode in enumerate(self.modes):
            if mode is BlockMode.checkpoint:
                out.append((b, b))
            elif mode is BlockMode.recompute:
                out[-1] = (out[-1][0], b)
        return out

    def kept(self) -> list[int]:
        return [b for b, m in enumerate(self.modes) if m is BlockMode.keep]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": BLOCK_PLAN_SCHEMA,
            "modes": "".join(m.value for m in self.modes),
            "forward_runs": list(self.forward_runs),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BlockPlan:
        if data.get("schema") != BLOCK_PLAN_SCHEMA:
            raise ValueError(f"schema: expected {BLOCK_PLAN_SCHEMA!r}, got {data.get('schema')!r}")
        modes = tuple(BlockMode(c) for c in data["modes"])
        runs = tuple(int(r) for r in data.get("forward_runs", [1] * len(modes)))
        return cls(modes, runs)

    def text(self) -> str:
        """'blocks 0–5 kept, 6–23 checkpointed every 3rd'."""
        parts: list[str] = []
        b, n = 0, len(self.modes)
        while b < n:
            if self.modes[b] is BlockMode.keep:
                e = b
                while e + 1 < n and self.modes[e + 1] is BlockMode.keep:
                    e += 1
                parts.append(f"{_span(b, e)} kept")
            else:
                e = b
                while e + 1 < n and self.modes[e + 1] is not BlockMode.keep:
                    e += 1
                sizes = [hi - lo + 1 for lo, hi in self.segments() if b <= lo <= e]
                parts.append(f"{_span(b, e)} checkpointed {_every(sizes)}")
            b = e + 1
        return "blocks " + ", ".join(parts) if parts else "no blocks"


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
