"""plan.json: what a solver decided, for one device or a pipeline, and what it predicts.

Schema version 2 (docs/plan.md); version-1 files (compute/free lists) load unchanged as remat
plans. One-device actions have a text form, one token each, that parses back:
`C12` compute node 12, `F12` free its device copy, `O12` start copying its output to the host
(device-to-host stream), `P12` start copying it back (host-to-device stream; the device memory
is taken when the copy starts), `D12` drop the host copy. Pipelines carry a `partition` and one
action list per rank in torch.distributed.pipelining's vocabulary (planner.core.pipeline_actions).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from planner.core.block_plan import BLOCK_PLAN_SCHEMA, BlockPlan
from planner.core.pipeline_actions import (
    Partition,
    PipelineAction,
    PipelineOp,
    PipelineStage,
    check_rank_actions,
    rank_actions_to_text,
)
from planner.core.resources import Resources

if TYPE_CHECKING:
    from planner.core.graph import Graph

__all__ = [
    "BLOCK_PLAN_SCHEMA", "Action", "ActionOp", "BlockPlan", "FsdpSettings", "GraphSummary",
    "Partition", "PipelineAction", "PipelineOp", "PipelineStage", "Plan", "PlanKind", "PlanStatus",
    "Predicted", "actions_from_text", "actions_to_text", "compute", "drop", "free",
    "graph_reference", "offload", "plan_nodes", "prefetch", "relative_gap",
]

PLAN_SCHEMA_VERSION: Literal["2"] = "2"


class ActionOp(StrEnum):
    compute = "compute"
    free = "free"  # release the device copy
    offload = "offload"  # start a device-to-host copy
    prefetch = "prefetch"  # start a host-to-device copy
    drop = "drop"  # release the host copy


_OP_LETTER = {
    ActionOp.compute: "C",
    ActionOp.free: "F",
    ActionOp.offload: "O",
    ActionOp.prefetch: "P",
    ActionOp.drop: "D",
}
_LETTER_OP = {v: k for k, v in _OP_LETTER.items()}
_TOKEN = re.compile(r"^([A-Z])(\d+)$")
HOST_OPS = frozenset({ActionOp.offload, ActionOp.prefetch, ActionOp.drop})


class Action(BaseModel):
    """One step of a one-device plan; JSON {"op": "compute", "node": 12} or the token "C12"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: ActionOp
    node: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_token(cls, data: object) -> object:
        return _parse_token(data, None) if isinstance(data, str) else data

    def __str__(self) -> str:
        return f"{_OP_LETTER[self.op]}{self.node}"


def _parse_token(token: str, index: int | None) -> dict[str, object]:
    m = _TOKEN.match(token)
    if not m or m.group(1) not in _LETTER_OP:
        where = f"action {index}: " if index is not None else ""
        raise ValueError(f"{where}cannot parse {token!r} (expected e.g. C12, F12, O12, P12, D12)")
    return {"op": _LETTER_OP[m.group(1)], "node": int(m.group(2))}


def compute(node: int) -> Action:
    return Action(op=ActionOp.compute, node=node)


def free(node: int) -> Action:
    return Action(op=ActionOp.free, node=node)


def offload(node: int) -> Action:
    return Action(op=ActionOp.offload, node=node)


def prefetch(node: int) -> Action:
    return Action(op=ActionOp.prefetch, node=node)


def drop(node: int) -> Action:
    return Action(op=ActionOp.drop, node=node)


def actions_to_text(actions: Iterable[Action]) -> str:
    return " ".join(str(a) for a in actions)


def actions_from_text(text: str) -> list[Action]:
    """Parse `C0 C1 O0 F0 ...`; raise ValueError naming the index of the first bad token."""
    return [Action.model_validate(_parse_token(t, i)) for i, t in enumerate(text.split())]


class PlanStatus(StrEnum):
    optimal = "optimal"  # proven: gap closed
    feasible = "feasible"  # within budget, optimality not proven
    infeasible = "infeasible"  # no plan within budget (proven or for the methods tried)
    timeout = "timeout"  # time ran out before any plan within budget
    error = "error"


class PlanKind(StrEnum):
    remat = "remat"  # one device: compute/free only (every version-1 plan)
    offload = "offload"  # one device: host copies, no node computed twice
    remat_offload = "remat+offload"
    pipeline = "pipeline"  # partition + rank_actions
    fsdp = "fsdp"  # one FSDP2 rank's settings (fsdp): per-block policy, reshard, prefetch


FSDP_TEXT = re.compile(r"\s*policies=([KSF]+)\s+reshard=([01]+)\s+prefetch=(\d+)\s*")


class FsdpSettings(BaseModel):
    """An FSDP2 plan (kind fsdp): the rank count it was planned for, the collectives' backend,
    and the plan's text form, `policies=FFFK reshard=1110 prefetch=0` (per block in forward
    order: K keep, S selective, F full recompute; 1 reshard after forward; the prefetch depth;
    planner.sim.fsdp.FsdpPlan parses it). The simulator judges it on the graph's `fsdp_model`
    (graph.metadata.extra, written by `planner-cli trace --fsdp-ranks`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ranks: int = Field(ge=1, description="Ranks (world size) the plan was made for.")
    text: str = Field(description="policies=... reshard=... prefetch=...",
                      pattern=FSDP_TEXT.pattern)
    collectives: Literal["nccl", "gloo"] = Field(
        default="nccl", description="The collectives' backend (gloo adds a temporary copy).")

    @model_validator(mode="after")
    def _same_blocks(self) -> FsdpSettings:
        m = FSDP_TEXT.fullmatch(self.text)
        if m is None:
            raise ValueError(f"fsdp.text {self.text!r}: expected 'policies=KSF reshard=110 "
                             "prefetch=1'")
        if len(m[1]) != len(m[2]):
            raise ValueError(f"fsdp.text {self.text!r}: policies and reshard name the same "
                             "blocks")
        return self


class Predicted(BaseModel):
    """What the simulator says of the plan (fixed memory included); v2 figures are None when the
    plan has nothing to say about them (a one-stream remat plan has no transfers)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    peak_bytes: int = Field(ge=0, description="Peak device memory (the largest over ranks).")
    compute_cost: float = Field(ge=0, description="Total compute of the plan (graph cost units).")
    overhead: float = Field(
        description="(compute_cost - graph total) / graph total: extra work from recomputation."
    )
    per_rank_peak_bytes: list[int] | None = Field(default=None, description="Pipelines: per rank.")
    host_peak_bytes: int | None = Field(default=None, ge=0, description="Peak host memory.")
    per_rank_host_peak_bytes: list[int] | None = Field(
        default=None,
        description="Pipelines with a host tier: each rank's own host peak (host_peak_bytes is "
        "every rank's together, one host; the ranks may peak at different times).",
    )
    compute_ms: float | None = Field(default=None, ge=0, description="Compute-stream busy time.")
    transfer_ms: float | None = Field(default=None, ge=0, description="Copy/link busy time.")
    exposed_transfer_ms: float | None = Field(
        default=None, ge=0, description="Time compute waited for copies (not hidden by overlap)."
    )
    makespan_ms: float | None = Field(default=None, ge=0, description="Step time with overlap.")
    throughput_per_s: float | None = Field(
        default=None, ge=0, description="Pipelines: micro-batches per second."
    )
    bubble_fraction: float | None = Field(
        default=None, ge=0, le=1, description="Pipelines: idle time / (ranks x makespan)."
    )


class GraphSummary(BaseModel):
    """What the plan's graph was traced from, so that a plan met with another model can say
    which model it is for (the graph itself is named by hash only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str = ""
    nodes: int = Field(ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    dtype: str = ""
    inputs_bytes: int = Field(default=0, ge=0)
    parameters: int | None = Field(default=None, ge=0, description="Parameter tensors.")
    parameters_bytes: int | None = Field(
        default=None, ge=0, description="Their bytes as the model computes with them, unsharded."
    )
    precision: str | None = Field(default=None, description="The model state's precision.")

    @classmethod
    def of(cls, graph: Graph) -> GraphSummary:
        meta, state = graph.metadata, graph.model_state
        return cls(
            model_name=meta.model_name, nodes=len(graph.nodes), batch_size=meta.batch_size,
            dtype=meta.dtype, inputs_bytes=graph.fixed.inputs_bytes,
            parameters=None if state is None else len(state.parameters),
            parameters_bytes=None if state is None else sum(p.bytes for p in state.parameters),
            precision=None if state is None else state.precision,
        )

    def describe(self) -> str:
        """'GPT (91 nodes, batch 2, float32, 16 parameter tensors of 17856 bytes)'."""
        parts = [f"{self.nodes} nodes", f"batch {self.batch_size or '?'}", self.dtype or "?"]
        if self.parameters is not None:
            parts.append(f"{self.parameters} parameter tensors of {self.parameters_bytes} bytes")
        return f"{self.model_name or 'a model'} ({', '.join(parts)})"


def graph_reference(graph: Graph) -> dict[str, Any]:
    """The Plan fields that say how its graph was traced and from which model, so the runtime
    re-traces as planned and names the model a plan is for (planner.runtime.retrace)."""
    return {"trace_options": graph.trace_options, "graph_summary": GraphSummary.of(graph)}


def _coerce_actions(value: object) -> object:
    return actions_from_text(value) if isinstance(value, str) else value


def _coerce_pipeline(value: object) -> object:
    if isinstance(value, PipelineAction) or not isinstance(value, str):
        return value
    return PipelineAction.from_text(value)


# In JSON a pipeline action is its torch text form, "2F0".
PipelineActionJson = Annotated[
    PipelineAction,
    BeforeValidator(_coerce_pipeline),
    PlainSerializer(str, return_type=str),
    WithJsonSchema(
        {"type": "string", "pattern": r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)\d+$"}
    ),
]


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal["1", "2"] = PLAN_SCHEMA_VERSION
    kind: PlanKind | None = Field(
        default=None, description="Derived from the actions when absent (version 1: remat)."
    )
    graph_hash: str
    budget_bytes: int | None = Field(default=None, ge=0)
    resources: Resources | None = Field(default=None, description="The machine planned for.")
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
    actions: Annotated[list[Action], BeforeValidator(_coerce_actions)] = Field(
        default_factory=list, description="One-device plans: C/F/O/P/D in order."
    )
    block_plan: BlockPlan | None = Field(
        default=None, description="Chain solvers: the block modes the runtime applies."
    )
    partition: Partition | None = Field(default=None, description="Pipelines: the stages.")
    rank_actions: list[list[PipelineActionJson]] | None = Field(
        default=None, description="Pipelines: one action list per rank, e.g. ['0F0', '0B0']."
    )
    fsdp: FsdpSettings | None = Field(
        default=None, description="FSDP plans: the per-rank settings (kind fsdp).")
    notes: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict, description="Free-form solver notes.")
    trace_options: dict[str, Any] | None = Field(
        default=None,
        description="The options the plan's graph was traced with (planner.tracing.trace: "
        "optimizer, gradient_lifetime, dropout_masks, autocast, level, loss ...): the runtime "
        "re-traces the model with them. Absent: not a traced graph, or an older plan.",
    )
    graph_summary: GraphSummary | None = Field(
        default=None, description="The model the plan's graph was traced from (for messages)."
    )

    @model_validator(mode="before")
    @classmethod
    def _lift_block_plan(cls, data: object) -> object:
        # Version-1 chain plans carry the block plan in details: read it into the typed field
        # (details keeps its copy for readers of version 1).
        if isinstance(data, dict) and data.get("block_plan") is None:
            inner = (data.get("details") or {}).get("block_plan")
            if isinstance(inner, dict):
                data = {**data, "block_plan": inner}
        return data

    @model_validator(mode="after")
    def _check_kind(self) -> Plan:
        derived = _derive_kind(self)
        if self.schema_version == "1" and (
            derived is not PlanKind.remat or self.resources is not None
        ):
            raise ValueError(
                "schema_version '1' plans hold compute/free actions only: use schema_version '2'"
            )
        if self.kind is None:
            object.__setattr__(self, "kind", derived)
        elif (why := _kind_mismatch(self, derived)) is not None:
            raise ValueError(why)
        if self.kind is PlanKind.pipeline:
            if self.partition is None or self.rank_actions is None:
                raise ValueError("kind 'pipeline' needs both partition and rank_actions")
            check_rank_actions(self.partition, self.rank_actions)
        return self

    @property
    def text(self) -> str:
        """Actions as text; for a pipeline one line of actions per rank; an FSDP plan's text."""
        if self.fsdp is not None:
            return self.fsdp.text
        if self.rank_actions is not None:
            return rank_actions_to_text(self.rank_actions)
        return actions_to_text(self.actions)

    def summary(self) -> str:
        p = self.predicted
        parts = [f"{self.method}/{self.backend}", self.status.value]
        if self.kind not in (None, PlanKind.remat):
            parts.append(str(self.kind))
        if p is not None:
            parts.append(f"peak {p.peak_bytes}")
        if self.budget_bytes is not None:
            parts.append(f"budget {self.budget_bytes}")
        if p is not None:
            parts.append(f"overhead {100 * p.overhead:+.3f}%")
            parts.extend(_v2_figures(p))
        if self.gap is not None:
            parts.append(f"gap {100 * self.gap:.3f}%")
        return ", ".join(parts)


def _v2_figures(p: Predicted) -> list[str]:
    out: list[str] = []
    if p.per_rank_peak_bytes is not None:
        out.append("per-rank peaks " + "/".join(str(b) for b in p.per_rank_peak_bytes))
    if p.host_peak_bytes is not None:
        out.append(f"host peak {p.host_peak_bytes}")
    if p.per_rank_host_peak_bytes is not None:
        out.append("per-rank host peaks " + "/".join(str(b) for b in p.per_rank_host_peak_bytes))
    if p.makespan_ms is not None:
        out.append(f"makespan {p.makespan_ms:.3f} ms")
    if p.transfer_ms is not None:
        out.append(f"transfers {p.transfer_ms:.3f} ms")
    if p.exposed_transfer_ms is not None:
        out.append(f"exposed {p.exposed_transfer_ms:.3f} ms")
    if p.throughput_per_s is not None:
        out.append(f"throughput {p.throughput_per_s:.3f}/s")
    if p.bubble_fraction is not None:
        out.append(f"bubble {100 * p.bubble_fraction:.1f}%")
    return out


def _derive_kind(plan: Plan) -> PlanKind:
    if plan.fsdp is not None:
        if plan.actions or plan.rank_actions is not None or plan.partition is not None:
            raise ValueError("an fsdp plan holds its settings in fsdp, not actions")
        return PlanKind.fsdp
    if plan.rank_actions is not None or plan.partition is not None:
        if plan.actions:
            raise ValueError("a pipeline plan keeps its actions in rank_actions, not actions")
        return PlanKind.pipeline
    if not any(a.op in HOST_OPS for a in plan.actions):
        return PlanKind.remat
    return PlanKind.remat_offload if _recomputes(plan.actions) else PlanKind.offload


def _recomputes(actions: Sequence[Action]) -> bool:
    seen: set[int] = set()
    for a in actions:
        if a.op is ActionOp.compute:
            if a.node in seen:
                return True
            seen.add(a.node)
    return False


def _kind_mismatch(plan: Plan, derived: PlanKind) -> str | None:
    """Why the declared kind does not fit the actions; None when it does. An offload plan may
    hold no host action (nothing needed moving)."""
    kind = plan.kind
    if (kind is PlanKind.fsdp) != (derived is PlanKind.fsdp):
        return (f"kind {kind}: the plan has fsdp settings (use 'fsdp')" if kind is not
                PlanKind.fsdp else "kind 'fsdp' needs its settings in fsdp")
    if derived is PlanKind.pipeline and kind is not PlanKind.pipeline:
        return f"kind {kind}: the plan has a partition/rank_actions (use 'pipeline')"
    if kind is PlanKind.pipeline and derived is not PlanKind.pipeline:
        return "kind 'pipeline' needs both partition and rank_actions"
    if kind is PlanKind.remat and derived is not PlanKind.remat:
        i = next(i for i, a in enumerate(plan.actions) if a.op in HOST_OPS)
        return (
            f"kind 'remat' but action {i} ({plan.actions[i]}) moves memory to the host: "
            "use 'offload' or 'remat+offload'"
        )
    if kind is PlanKind.offload and _recomputes(plan.actions):
        return "kind 'offload' but a node is computed twice: use 'remat+offload'"
    return None


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
