"""What the simulator does not count yet in a pipeline rank's measured peak (issue 47): every
torch.utils.checkpoint call keeps torch.get_rng_state() (5,056 B of CPU memory; no dispatched
op makes it, so only the allocator's count sees it) from its forward to its backward. Tests
that compare the allocator's count with a prediction allow at most this many bytes: one RNG
state per checkpoint the rank's plan runs in a step (whole-stage micro-batches and "recompute"
units, the variants' too), an upper bound on those held at once."""

from __future__ import annotations

import torch

from planner.core.plan import Plan

RNG_STATE_BYTES = torch.get_rng_state().nbytes


def checkpoint_rng_bytes(plan: Plan, rank: int) -> int:
    assert plan.partition is not None and plan.rank_actions is not None
    microbatches = 1 + max(a.microbatch_index for row in plan.rank_actions for a in row)
    calls = 0
    for stage in plan.partition.stages:
        if stage.rank != rank:
            continue
        for mb in range(microbatches):
            units = stage.plan_of(mb).unit_policies.values()
            calls += sum(p == "recompute" for p in units) + stage.recomputes(mb)
    return calls * RNG_STATE_BYTES
