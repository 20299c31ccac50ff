"""plan.json: an ordered list of actions over graph nodes plus the solver's report (version 1).

Actions have a compact text form, one token each: `C12` computes node 12, `F12` frees it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PLAN_SCHEMA_VERSION: Literal["1"] = "1"


class ActionOp(StrEnum):
    compute = "compute"
    free = "free"


_OP_LETTER = {ActionOp.compute: "C", ActionOp.free: "F"}
_LETTER_OP = {v: k for k, v in _OP_LETTER.items()}
_TOKEN = re.compile(r"^([A-Z])(\d+)$")


class Action(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    op: ActionOp
    node: int = Field(ge=0)

    def __str__(self) -> str:
        return f"{_OP_LETTER[self.op]}{self.node}"


def compute(node: int) -> Action:
    return Action(op=ActionOp.compute, node=node)


def free(node: int) -> Action:
    return Action(op=ActionOp.free, node=node)


def actions_to_text(actions: Iterable[Action]) -> str:
    return " ".join(str(a) for a in actions)


def actions_from_text(text: str) -> list[Action]:
    """Parse `C0 C1 F0 ...`; raise ValueError naming the first bad token."""
    out: list[Action] = []
    for i, token in enumerate(text.split()):
        m = _TOKEN.match(token)
        if not m or m.group(1) not in _LETTER_OP:
            raise ValueError(f"action {i}: cannot parse {token!r} (expected e.g. C12 or F12)")
        out.append(Action(op=_LETTER_OP[m.group(1)], node=int(m.group(2))))
    return out


class PlanStatus(StrEnum):
    optimal = "optimal"  # proven: gap closed
    feasible = "feasible"  # within budget, optimality not proven
    infeasible = "infeasible"  # no plan within budget (proven or for the methods tried)
    timeout = "timeout"  # time ran out before any plan within budget
    error = "error"


class Predicted(BaseModel):
    """What the simulator says of the plan (fixed memory included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peak_bytes: int = Field(ge=0)
    compute_cost: float = Field(ge=0, description="Total compute of the plan (graph cost units).")
    overhead: float = Field(
        description="(compute_cost - graph total) / graph total: extra work from recomputation."
    )


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal["1"] = PLAN_SCHEMA_VERSION
    graph_hash: str
    budget_bytes: int | None = Field(default=None, ge=0)
    method: str
    backend: str = "none"
    status: PlanStatus
    objective: float | None = Field(default=None, description="Solver objective (compute cost).")
    lower_bound: float | None = Field(
        default=None, description="Best proven lower bound on the objective."
    )
    gap: float | None = Field(default=None, ge=0, description="(objective - bound) / objective.")
    wall_seconds: float = Field(default=0.0, ge=0)
    predicted: Predicted | None = None
    actions: list[Action] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        return actions_to_text(self.actions)

    def summary(self) -> str:
        peak = self.predicted.peak_bytes if self.predicted else None
        parts = [f"{self.method}/{self.backend}", self.status.value]
        if peak is not None:
            parts.append(f"peak {peak}")
        if self.budget_bytes is not None:
            parts.append(f"budget {self.budget_bytes}")
        if self.predicted is not None:
            parts.append(f"overhead {100 * self.predicted.overhead:+.3f}%")
        if self.gap is not None:
            parts.append(f"gap {100 * self.gap:.3f}%")
        return ", ".join(parts)


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / |objective|, 0 when they meet; None when either is unknown."""
    if objective is None or bound is None:
        return None
    if objective <= bound or abs(objective - bound) <= 1e-9 * max(1.0, abs(objective)):
        return 0.0
    return (objective - bound) / max(abs(objective), 1e-12)


def plan_nodes(actions: Sequence[Action]) -> list[int]:
    """Node ids in the order they are first computed."""
    seen: dict[int, None] = {}
    for a in actions:
        if a.op is ActionOp.compute:
            seen.setdefault(a.node, None)
    return list(seen)
