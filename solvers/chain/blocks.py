"""Block plans from the chain solver's operation sequences, and back.

The plan itself is planner.core.block_plan.BlockPlan (K/C/R per chain block, the modes read
from the first forward pass of a sequence; JSON, segments, text). Blocks are the chain's stages,
numbered from 0 (block b is stage b+1). Here:

- `block_plan_from_ops(length, ops)` / `block_plan_from_solution(solve_rotor(...).ops)`: a
  sequence's block plan (`forward_runs[b]`: how many times it runs block b's forward);
- `one_level_ops(plan)`: the sequence a one-level runtime runs for a plan (the forward pass by
  mode, then each checkpointed segment recomputed once with full saving just before its
  backward); planner methods report its peak and cost in `details["block_plan_one_level"]`.

The solver's own schedule may recompute nested segments more cleverly than one level does; its
exact operation sequence travels with the plan (`details["chain_ops"]`).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.core import block_plan as core
from planner.core.block_plan import BLOCK_PLAN_SCHEMA, BlockMode
from planner.solvers.chain.sequence import Op, OpKind

__all__ = ["BLOCK_PLAN_SCHEMA", "BlockMode", "block_plan_from_ops", "block_plan_from_solution",
           "one_level_ops"]

_FIRST_MODE = {
    OpKind.f_all: BlockMode.keep,
    OpKind.f_ck: BlockMode.checkpoint,
    OpKind.f_none: BlockMode.recompute,
}


def block_plan_from_ops(length: int, ops: Sequence[Op]) -> core.BlockPlan:
    """The block plan of a sequence over `length` blocks (ValueError: a block never runs)."""
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
    return core.BlockPlan(modes="".join(str(m) for m in modes), forward_runs=runs)


def block_plan_from_solution(ops: Sequence[Op] | None) -> core.BlockPlan | None:
    """The block plan of a solver's sequence (e.g. `solve_rotor(...).ops`); None: no plan."""
    if ops is None:
        return None
    return block_plan_from_ops(sum(op.kind is OpKind.backward for op in ops), ops)


def one_level_ops(plan: core.BlockPlan) -> list[Op]:
    """The sequence a one-level runtime runs for `plan`: the forward pass by mode, then each
    checkpointed segment recomputed once with full saving just before its backward. Its
    `run_sequence` peak and cost are what applying the block plan as-is costs."""
    length = len(plan.modes)
    first = {mode: kind for kind, mode in _FIRST_MODE.items()}
    ops = [Op(first[BlockMode(m)], b + 1) for b, m in enumerate(plan.modes)]
    starts = {hi: lo for lo, hi in plan.segments()}
    stage = length
    while stage >= 1:
        b = stage - 1
        if plan.modes[b] == BlockMode.keep:
            ops.append(Op(OpKind.backward, stage))
            stage -= 1
            continue
        lo = starts[b] + 1  # the segment is stages lo..stage
        ops.append(Op(OpKind.discard, stage))  # a^stage is recomputed with the segment
        ops.extend(Op(OpKind.f_all, k) for k in range(lo, stage + 1))
        ops.extend(Op(OpKind.backward, k) for k in range(stage, lo - 1, -1))
        stage = lo - 1
    return ops
