"""One pipeline stage as planner.runtime.pipeline runs it: the stage program as a module whose
checkpointed micro-batches and unit plans follow the micro-batch a forward runs (`StageModule`),
inside torch's PipelineStage telling it that micro-batch (`PlannedStage`), with zero-bubble's W
run as one autograd call over torch's weight groups (`merged_weight_groups`)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.utils.checkpoint import checkpoint

from planner.runtime.pipeline_split import StageProgram
from planner.runtime.pipeline_units import UnitSwitch


class StageModule(nn.Module):
    """One stage's module: the stage program, keyword inputs filtered; the forward of the
    micro-batches in `recompute` runs checkpointed (the stage sets `microbatch` before each).
    `switch` (planner.runtime.pipeline_units) is told the micro-batch, so that its unit calls
    run that micro-batch's unit plan, and the checkpoint's rerun in the backward, with the
    micro-batch its forward ran."""

    def __init__(self, program: StageProgram, recompute: frozenset[int],
                 switch: UnitSwitch | None = None) -> None:
        super().__init__()
        self.program = program.module
        self.keyword_inputs = list(program.keyword_inputs)
        self.recompute = recompute
        self.switch = switch or UnitSwitch()
        self.microbatch: int | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        keywords = {k: kwargs[k] for k in self.keyword_inputs}
        microbatch = self.microbatch  # the backward's rerun runs when it is None again
        with self.switch.running(microbatch):
            if microbatch in self.recompute and torch.is_grad_enabled():
                runs = itertools.count()

                def whole_stage(*args: Any, **kwargs: Any) -> Any:
                    if next(runs) == 0:
                        return self.program(*args, **kwargs)
                    with self.switch.rerun(microbatch):  # the backward's rerun
                        return self.program(*args, **kwargs)

                return checkpoint(
                    whole_stage, *args, use_reentrant=False, preserve_rng_state=True, **keywords
                )
            return self.program(*args, **keywords)


class PlannedStage(PipelineStage):
    """torch's PipelineStage telling its module which micro-batch a forward runs (torch's
    metadata inference calls the module outside forward_one_chunk: no micro-batch there)."""

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        module = self.submod
        if isinstance(module, StageModule):
            module.microbatch = fwd_chunk_id
        try:
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        finally:
            if isinstance(module, StageModule):
                module.microbatch = None

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        # torch's W runs one autograd call per weight group, and each call reruns every
        # checkpoint it passes through and leaves the rerun's input-gradient tensors alive
        # until the graph is freed (a GPT block: six reruns); one call over all groups reruns
        # each checkpoint once
        state = getattr(self, "backward_state", {}).get(bwd_chunk_id)
        if self.dw_builder is None and isinstance(state, tuple) and len(state) == 4:
            input_values, groups, stage_output, output_grads = state
            if groups is not None and len(groups) > 1:
                self.backward_state[bwd_chunk_id] = (
                    input_values, [merged_weight_groups(groups)], stage_output, output_grads)
        super().backward_weight_one_chunk(bwd_chunk_id, last_backward)


def merged_weight_groups(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """torch's weight groups (params, their intermediates and those's gradients from I) as one:
    each intermediate's gradient is still clamped to its own (stage_backward_weight's prehooks
    with several intermediates), so every parameter's gradient is the same."""
    merged: dict[str, Any] = {"params": set(), "intermediates": [], "grads": []}
    for g in groups:
        merged["params"] |= set(g["params"])
        merged["intermediates"].extend(g["intermediates"])
        merged["grads"].extend(g["grads"])
    return merged
