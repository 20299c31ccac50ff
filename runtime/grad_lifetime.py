"""Does the training loop keep gradients the way the plan's graph assumes?

A graph's `model_state.gradient_lifetime` says when the plan charges the gradient buffers:
"step" from the start of the step (gradient accumulation, `zero_grad(set_to_none=False)`),
"backward" from each gradient's node on (`zero_grad(set_to_none=True)`, torch's default). The
loop shows which it is at the start of a step: a parameter that already holds a `.grad` keeps
its gradient all step; none holding one after an earlier backward means they were released.

`GradientLifetimeCheck` looks at the start of each planned step (a forward pre-hook of the
planned module) until it has seen gradients kept, and says in one line (a
`GradientLifetimeWarning`) when the loop disagrees with the graph: a "backward" graph in a loop
that keeps gradients underestimates the step by up to the bytes of those gradients; a "step"
graph in a loop that releases them is pessimistic by up to the gradient bytes it charges from
the start. It says so once, and again only if what the loop does changes.

Kept gradients are sticky: an accumulation loop releases them every N micro-steps, but the
micro-steps that keep them decide the memory, so once seen, "step" is what the loop does. A
step that finds no gradient counts only after a backward of this module has run (a fresh model
has none at its first step whatever the loop does).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.core.budget import format_bytes
from planner.core.graph import Graph

# Frames in these folders are skipped, so the warning points at the user's `planned(...)`.
_INTERNAL_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).parent))


class GradientLifetimeWarning(UserWarning):
    """The plan's gradient lifetime differs from what the training loop does."""


def kept_gradients(module: nn.Module) -> bool:
    """True when some parameter of `module` holds a `.grad` now (one loop, stops early)."""
    return any(p.grad is not None for p in module.parameters())


def warn(message: str) -> None:
    """A GradientLifetimeWarning attributed to the first frame outside torch and the runtime."""
    level, frame = 1, sys._getframe(0)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, GradientLifetimeWarning, stacklevel=level)


class GradientLifetimeCheck:
    """The lifetime a planned module's training loop shows, against its graph's."""

    def __init__(self, graph: Graph, say: Callable[[str], None] = warn) -> None:
        state = graph.model_state
        self.lifetime = state.gradient_lifetime if state is not None else "step"
        self.say = say
        # Parameters whose gradients the plan charges only from their gradient node on.
        self.late_names: frozenset[str] = frozenset()
        # Gradient bytes a "backward" trace of the same kind would charge late instead.
        self.early_bytes = 0
        if state is not None:
            placed = [(p, b) for p, b in state.per_parameter()
                      if p.trainable and p.gradient_node is not None]
            if self.lifetime == "backward":
                self.late_names = frozenset(p.name for p, _ in placed)
            else:
                self.early_bytes = sum(b.gradients_bytes for _, b in placed)
        self.observed: str | None = None  # what the loop does, once known
        self.backward_ran = False  # a backward of this module since the last reset

    def reset(self) -> None:
        """Forget what was seen (e.g. after a calibration step the user's loop did not run)."""
        self.observed, self.backward_ran = None, False

    def step_started(self, module: nn.Module) -> None:
        if not module.training or self.observed == "step":
            return
        if kept_gradients(module):
            seen = "step"
        elif self.backward_ran:
            seen = "backward"
        else:
            return  # no gradient yet and no backward yet: nothing to tell
        if seen == self.observed:
            return
        self.observed = seen
        message = self.disagreement(module)
        if message:
            self.say(message)

    def step_returned(self, loss: Any) -> None:
        """Watch for the backward of this step's loss (until one has run)."""
        if not self.backward_ran and isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.register_hook(self._mark_backward)

    def _mark_backward(self, _grad: torch.Tensor) -> None:
        self.backward_ran = True

    # forward hooks of the planned module (methods, so the module stays picklable)
    def pre_hook(self, module: nn.Module, _args: Any) -> None:
        self.step_started(module)

    def post_hook(self, module: nn.Module, _args: Any, output: Any) -> None:
        if module.training:
            self.step_returned(output)

    def disagreement(self, module: nn.Module) -> str:
        """One line when the observed lifetime and the graph's disagree (and it costs bytes)."""
        if self.observed == "step" and self.lifetime == "backward":
            held = [(n, p.grad) for n, p in module.named_parameters() if p.grad is not None]
            late = sum(g.nbytes for n, g in held if n in self.late_names)
            if not late:
                return ""
            return (
                f"gradient lifetime: the plan's graph counts gradients from backward on "
                f"(gradient_lifetime 'backward'), but {len(held)} parameters hold a .grad at "
                f"the start of this step (gradient accumulation or zero_grad(set_to_none="
                f"False)): the plan underestimates the step by up to {late} B "
                f"({format_bytes(late)}); re-trace with gradient_lifetime='step' "
                "(planner-cli trace --gradient-lifetime step) and plan again, or call "
                "zero_grad(set_to_none=True) before each step"
            )
        if self.observed == "backward" and self.lifetime == "step" and self.early_bytes:
            return (
                f"gradient lifetime: the plan's graph holds gradients all step "
                f"(gradient_lifetime 'step'), but no parameter holds a .grad at the start of "
                f"this step (zero_grad(set_to_none=True)): the plan is pessimistic by up to "
                f"{self.early_bytes} B ({format_bytes(self.early_bytes)}); re-trace with "
                "gradient_lifetime='backward' (planner-cli trace --gradient-lifetime backward) "
                "and plan again for a tighter plan"
            )
        return ""


def install(module: nn.Module, graph: Graph) -> GradientLifetimeCheck:
    """Check `module`'s steps against `graph`'s gradient lifetime; the check is returned and
    kept as `module.gradient_lifetime_check`."""
    check = GradientLifetimeCheck(graph)
    module.register_forward_pre_hook(check.pre_hook)
    module.register_forward_hook(check.post_hook)
    object.__setattr__(module, "gradient_lifetime_check", check)
    return check
