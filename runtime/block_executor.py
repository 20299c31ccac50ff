"""Block-level plans (chain solvers): non-reentrant `torch.utils.checkpoint` per segment.

A `BlockPlan` (planner.core.block_plan) gives each chain stage (a module path from the
module-level trace) a mode: K runs normally, C starts a checkpointed segment (its input is
kept), R continues that segment. A segment `C R R` runs as ONE checkpointed function of its
blocks: while the planned forward runs, the C block's forward is replaced by the composition of
the segment's blocks under `checkpoint(..., use_reentrant=False)` and the R blocks' forwards by a
pass-through that checks it receives exactly that segment's output. Before the first step, one
probe forward (no autograd; RNG and buffers restored) checks which blocks really read their
predecessor's output; a segment is split where one does not (e.g. a position embedding next to
the token embedding), which keeps that block's input too, and `notes` says so.
Dropout inside a segment replays
its RNG state (checkpoint's `preserve_rng_state`). This is one level of checkpointing: nested
recomputations of a Rotor sequence are not reproduced (the plan's `forward_runs` says when).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.core.block_plan import BlockPlan
from planner.core.errors import InputError, describe_validation_error
from planner.core.graph import Graph
from planner.engine.block_plans import simulate_block_plan
from planner.sim.simulator import PlanError


class BlockPlanError(InputError):
    """A block plan that does not fit the model (names the block)."""


def read_block_plan(block_plan: Any) -> BlockPlan:
    """The BlockPlan of a BlockPlan, its JSON form, a Plan (its `block_plan`, else version 1's
    details['block_plan']), or text ('KCRR...'); BlockPlanError naming the block."""
    if isinstance(block_plan, BlockPlan):
        return block_plan
    data: Any
    typed = getattr(block_plan, "block_plan", None)
    if isinstance(typed, BlockPlan):
        return typed
    if isinstance(block_plan, str | dict):
        data = block_plan
    elif hasattr(block_plan, "details") and isinstance(block_plan.details, dict):
        data = block_plan.details.get("block_plan")
        if not isinstance(data, dict):
            raise BlockPlanError("plan: has no details.block_plan (not a chain solver's plan)")
    else:
        raise BlockPlanError(f"block plan: cannot read a {type(block_plan).__name__}")
    try:
        return BlockPlan.model_validate(data)
    except ValidationError as e:
        why = describe_validation_error(e)  # "block 1: 'R' must follow ..." names the block
        raise BlockPlanError(why if why.startswith("block ") else f"block plan {why}") from None


def check_simulates(block_plan: Any, graph: Graph) -> None:
    """Refuse a block plan whose one-level application does not simulate on `graph` (the
    module-level trace's), with the simulator's message."""
    try:
        simulate_block_plan(graph, read_block_plan(block_plan))
    except PlanError as e:
        raise BlockPlanError(str(e)) from None  # names the block plan, step and node


class BlockExecutor:
    """Installs the checkpointed forwards on the model's blocks; use as a context manager."""

    def __init__(self, model: nn.Module, block_plan: Any, stage_names: Sequence[str]) -> None:
        plan = read_block_plan(block_plan)
        self.modes = plan.modes
        if len(self.modes) != len(stage_names):
            raise BlockPlanError(
                f"block plan: {len(self.modes)} modes for {len(stage_names)} stages of the model"
            )
        modules = dict(model.named_modules())
        self.blocks: list[nn.Module] = []
        for b, name in enumerate(stage_names):
            if "#" in name:
                raise BlockPlanError(
                    f"block {b} ({name}): a module called more than once cannot be checkpointed "
                    "per call; trace at op level instead"
                )
            if name not in modules:
                raise BlockPlanError(f"block {b}: the model has no module {name!r}")
            self.blocks.append(modules[name])
        self.names = list(stage_names)
        self.segments = plan.segments()
        self._installed = False
        self.notes: list[str] = []
        self.probed = not any(last > first for first, last in self.segments)

    def probe(self, model: nn.Module, inputs: Sequence[Any]) -> None:
        """Check, in one forward without autograd, that each multi-block segment is a chain.

        RNG state and buffers are restored, so the probe leaves no trace in training.
        """
        seen: dict[int, Any] = {}
        handles = []
        for first, last in self.segments:
            for b in range(first, last + 1):
                handles.append(self.blocks[b].register_forward_hook(_recorder(seen, b)))
        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                model(*inputs)
        finally:
            for h in handles:
                h.remove()
            with torch.no_grad():
                for k, v in model.named_buffers():
                    v.copy_(buffers[k])
        split: list[tuple[int, int]] = []
        for first, last in self.segments:
            start = first
            for b in range(first + 1, last + 1):
                received, previous = seen.get(b), seen.get(b - 1)
                if received is None or previous is None or received[0] is not previous[1]:
                    # Not a chain here: b starts its own segment (its input is kept too).
                    self.notes.append(
                        f"block {b} ({self.names[b]}) does not read the output of block {b - 1} "
                        f"({self.names[b - 1]}): segment {first}–{last} split there, which "
                        "keeps block b's input as well"
                    )
                    split.append((start, b - 1))
                    start = b
            split.append((start, last))
        self.segments = split
        self.probed = True

    def __enter__(self) -> BlockExecutor:
        self.install()
        return self

    def __exit__(self, *_: Any) -> None:
        self.remove()

    def install(self) -> None:
        if self._installed:
            return
        for first, last in self.segments:
            members = self.blocks[first : last + 1]
            originals = [m.forward for m in members]
            state: dict[str, Any] = {}
            self.blocks[first].forward = _segment_forward(originals, state)
            for k in range(first + 1, last + 1):
                self.blocks[k].forward = _pass_through(state, k, self.names[k], first)
        self._installed = True

    def remove(self) -> None:
        for first, last in self.segments:
            for m in self.blocks[first : last + 1]:
                m.__dict__.pop("forward", None)
        self._installed = False


def _recorder(seen: dict[int, Any], block: int) -> Any:
    def hook(_module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        seen.setdefault(block, (args[0] if len(args) == 1 else None, out))

    return hook


def _segment_forward(originals: list[Any], state: dict[str, Any]) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        def segment(*inner: Any) -> Any:
            out = originals[0](*inner, **kwargs)
            for fn in originals[1:]:
                out = fn(out)
            return out

        out = checkpoint(segment, *args, use_reentrant=False, preserve_rng_state=True)
        state["output"] = out
        return out

    return run


def _pass_through(state: dict[str, Any], block: int, name: str, first: int) -> Any:
    def run(x: Any, *rest: Any, **kwargs: Any) -> Any:
        if rest or kwargs or x is not state.get("output"):  # the probe makes this unreachable
            raise BlockPlanError(
                f"block {block} ({name}): is not called on the output of the segment starting "
                f"at block {first}: these blocks do not form a chain; use an op-level plan"
            )
        return x

    return run


class BlockPlannedModule(nn.Module):
    """The model's step (forward + loss) under a block plan; shares everything with the model."""

    _model: nn.Module
    executor: BlockExecutor
    _loss_fn: Any

    def __init__(
        self, model: nn.Module, block_plan: Any, stage_names: Sequence[str], loss_fn: Any = None
    ) -> None:
        super().__init__()
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "executor", BlockExecutor(model, block_plan, stage_names))
        object.__setattr__(self, "_loss_fn", loss_fn)

    def forward(self, *inputs: Any) -> torch.Tensor:
        from planner.tracing.capture import compute_loss

        if not self.executor.probed:
            self.executor.probe(self._model, inputs)
        with self.executor:
            return compute_loss(self._model(*inputs), self._loss_fn)


def stage_names_of(trace: Any) -> list[str]:
    """Stage module paths of a module-level TraceResult, in chain order."""
    chain = (getattr(trace, "details", None) or {}).get("chain") or {}
    stages = chain.get("stages") or []
    if not stages:
        raise BlockPlanError("trace: a module-level TraceResult with details['chain'] is needed")
    return [str(s["name"]) for s in stages]
