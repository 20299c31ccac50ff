"""Checks of a pipeline plan before planner.runtime.pipeline builds it: one clear line for a
plan this torch cannot run correctly, or whose variants name micro-batches it never runs."""

from __future__ import annotations

import torch

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineOp
from planner.core.plan import Plan

# The torch release whose split backward (I and W actions) the runtime's W is verified on; on
# torch 2.11 (an H100, 2026-11-27) the weight gradients of a zero-bubble step came out wrong
# (the last stage's up to 3.4x): docs/whole_job.md
SPLIT_BACKWARD_TORCH = (2, 13)


def has_weight_actions(plan: Plan) -> bool:
    return any(a.op is PipelineOp.backward_weight for row in plan.rank_actions or [] for a in row)


def runs_split_backward() -> bool:
    """Whether this torch runs W actions correctly (SPLIT_BACKWARD_TORCH or later)."""
    release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return release >= SPLIT_BACKWARD_TORCH


def check_split_backward(plan: Plan) -> None:
    if not runs_split_backward() and has_weight_actions(plan):
        raise InputError(
            f"plan ({plan.details.get('schedule', plan.method)}): its W actions (split backward) "
            f"give correct gradients on torch {'.'.join(map(str, SPLIT_BACKWARD_TORCH))}, not on "
            f"this torch {torch.__version__}; install torch==2.13.0 or plan a schedule without W "
            "(1f1b, interleaved-1f1b, gpipe)")


def check_variant_microbatches(plan: Plan) -> None:
    """One line for a variant naming a micro-batch the rank actions do not run."""
    if plan.partition is None or not plan.rank_actions:
        return
    m = 1 + max(a.microbatch_index for row in plan.rank_actions for a in row)
    for s in plan.partition.stages:
        for k, variant in enumerate(s.variants):
            beyond = sorted(mb for mb in variant.microbatches if mb >= m)
            if beyond:
                raise InputError(
                    f"partition: stage {s.stage_index}'s variants[{k}].microbatches name "
                    f"{beyond[0]}, but the rank actions run {m} micro-batches (0..{m - 1}); "
                    "drop it"
                )
