"""Pipeline plans: the partition (stage -> nodes/modules, stage -> rank) and per-rank action lists.

The action vocabulary is `torch.distributed.pipelining`'s `_Action(stage, type, microbatch)` and
so is the text form, one token per action: `2F0` runs the forward of stage 2 on micro-batch 0,
`1SEND_F3` sends stage 1's output of micro-batch 3 to stage 2, `1RECV_B3` receives the gradient
of micro-batch 3 from stage 2. `F` forward, `B` full backward, `I` backward for the input
gradient, `W` backward for the weight gradients; `SEND_F`/`RECV_F` carry activations from stage
s to s+1, `SEND_B`/`RECV_B` gradients from s+1 to s (torch's convention: a `RECV_F` names the
receiving stage, its sender is the stage before; a `RECV_B`'s sender is the stage after).

CSV form (torch's `_dump_csv` / `_load_csv`): one row per rank, one action string per cell, an
empty cell is an idle step.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PipelineOp(StrEnum):
    forward = "F"
    backward = "B"  # full backward (input and weight gradients)
    backward_input = "I"
    backward_weight = "W"
    send_f = "SEND_F"
    recv_f = "RECV_F"
    send_b = "SEND_B"
    recv_b = "RECV_B"


COMPUTE_OPS = frozenset(
    {PipelineOp.forward, PipelineOp.backward, PipelineOp.backward_input, PipelineOp.backward_weight}
)
_TOKEN = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


class PipelineAction(BaseModel):
    """One action of a rank: `_Action(stage_index, op, microbatch_index)` of torch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage_index: int = Field(ge=0)
    op: PipelineOp
    microbatch_index: int = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: object) -> object:
        return _parse(data) if isinstance(data, str) else data

    def __str__(self) -> str:
        return f"{self.stage_index}{self.op.value}{self.microbatch_index}"

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @classmethod
    def from_text(cls, token: str) -> PipelineAction:
        return cls.model_validate(_parse(token))


def _parse(token: str) -> dict[str, object]:
    m = _TOKEN.match(token.strip())
    if not m:
        raise ValueError(f"cannot parse {token!r} (expected e.g. 2F0 or 1SEND_F3)")
    return {"stage_index": int(m.group(1)), "op": m.group(2), "microbatch_index": int(m.group(3))}


def pipeline_action(stage_index: int, op: str, microbatch_index: int) -> PipelineAction:
    return PipelineAction(
        stage_index=stage_index, op=PipelineOp(op), microbatch_index=microbatch_index
    )


def rank_actions_to_text(rank_actions: Sequence[Sequence[PipelineAction]]) -> str:
    """One line per rank: `0F0 0F1 0B0 ...`."""
    return "\n".join(" ".join(str(a) for a in actions) for actions in rank_actions)


def rank_actions_from_text(text: str) -> list[list[PipelineAction]]:
    """Parse one line per rank; raise ValueError naming the rank and the action index."""
    out: list[list[PipelineAction]] = []
    for rank, line in enumerate(text.strip().splitlines()):
        out.append(_parse_row(line.split(), rank))
    return out


def _parse_row(tokens: Sequence[str], rank: int) -> list[PipelineAction]:
    row: list[PipelineAction] = []
    for i, token in enumerate(tokens):
        try:
            row.append(PipelineAction.from_text(token))
        except ValueError as e:
            msg = str(e).splitlines()[0]
            raise ValueError(f"rank {rank}, action {i}: {msg}") from None
    return row


def rank_actions_to_csv(
    rank_actions: Sequence[Sequence[PipelineAction]], *, compute_only: bool = False
) -> str:
    """torch's CSV: a row per rank. `compute_only` drops SEND/RECV (torch's "compute_only"
    format, whose loader adds the communication itself)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for actions in rank_actions:
        writer.writerow([str(a) for a in actions if a.is_compute or not compute_only])
    return buf.getvalue()


def rank_actions_from_csv(text: str) -> list[list[PipelineAction]]:
    """Read torch's CSV (empty cells, torch's idle steps, are skipped)."""
    out: list[list[PipelineAction]] = []
    for rank, row in enumerate(csv.reader(io.StringIO(text))):
        out.append(_parse_row([cell for cell in row if cell.strip()], rank))
    return out


UnitPolicy = Literal["keep", "recompute", "offload"]
SAVED_OP = re.compile(r"[A-Za-z_][\w.]*#\d+")  # unit_saved_ops: an operator and its call index


def saved_op(op: str, index: int) -> str:
    """unit_saved_ops' name of the `index`-th call (from 0) of `op` in a module's forward."""
    return f"{op}#{index}"


def saved_op_parts(name: str) -> tuple[str, int]:
    """('aten.addmm', 0) from 'aten.addmm#0'."""
    op, _, k = name.rpartition("#")
    return op, int(k)


class StageVariant(BaseModel):
    """Another plan of a stage's units for some of its micro-batches: they run these unit
    policies instead of the stage's own (fields as in PipelineStage). The whole-job planner
    mixes two plans over the micro-batches a rank holds at once, as the ILP mixes whole-stage
    recomputation, but per module: recomputing a module in one micro-batch of every k frees
    its bytes once per k in flight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    microbatches: list[int] = Field(min_length=1, description="Micro-batches running it.")
    unit_policies: dict[str, UnitPolicy] = Field(default_factory=dict)
    unit_saved_ops: dict[str, list[str]] = Field(default_factory=dict)
    unit_offload_ops: dict[str, list[str]] = Field(default_factory=dict)

    def unit_policy(self, module: str) -> UnitPolicy:
        return self.unit_policies.get(module, "keep")


class PipelineStage(BaseModel):
    """One stage: the graph nodes it runs (ids, and/or every node of the named modules and their
    submodules) and the rank that runs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage_index: int = Field(ge=0)
    rank: int = Field(ge=0)
    nodes: list[int] = Field(default_factory=list, description="Graph node ids of the stage.")
    modules: list[str] = Field(
        default_factory=list,
        description="Module paths: every node whose module_path is one of them or inside one.",
    )
    recompute_microbatches: list[int] = Field(
        default_factory=list,
        description="Micro-batches whose activations this stage does not keep: it keeps its "
        "input and reruns its forward before their backward (activation checkpointing).",
    )

    unit_policies: dict[str, UnitPolicy] = Field(
        default_factory=dict,
        description="Per module of the stage (a unit: 'h.3') or submodule of one ('h.3.mlp'), "
        "what its saved activations do in every micro-batch: 'recompute' keeps only its input "
        "and reruns its forward before its backward; 'offload' copies them to host memory after "
        "its forward and back before its backward. A module not named keeps them (the whole-job "
        "planner's per-stage plan); a policy on a submodule leaves the rest of its unit as it "
        "is, and no named module may be inside another named one.",
    )
    unit_saved_ops: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per 'recompute' module, the ops of its forward whose outputs are kept "
        "(selective activation checkpointing: its backward reruns every other op of the "
        "module, not these). An op is 'OP#K': the K-th call (from 0) of operator OP in the "
        "module's forward, e.g. 'aten.addmm#0'. Not named: the whole module is rerun.",
    )
    unit_offload_ops: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per 'offload' module, the ops of its forward whose outputs go to host "
        "memory ('OP#K' as in unit_saved_ops); the module's other saved tensors stay on the "
        "device. Not named: everything the module saves is offloaded.",
    )

    variants: list[StageVariant] = Field(
        default_factory=list,
        description="Other unit plans for some micro-batches (each variant's micro-batches "
        "run its unit_policies, unit_saved_ops and unit_offload_ops instead of the stage's).",
    )

    def recomputes(self, microbatch_index: int) -> bool:
        return microbatch_index in self.recompute_microbatches

    def unit_policy(self, module: str) -> UnitPolicy:
        return self.unit_policies.get(module, "keep")

    def plan_of(self, microbatch_index: int) -> PipelineStage | StageVariant:
        """What runs the units in this micro-batch: its variant, or the stage's own plan."""
        for v in self.variants:
            if microbatch_index in v.microbatches:
                return v
        return self


def inside_modules(path: str, modules: list[str]) -> bool:
    """`path` is one of `modules` or a submodule of one ('h.3.mlp' inside 'h.3')."""
    return any(path == m or path.startswith(m + ".") for m in modules)


def _check_named_ops(stage: PipelineStage, where: str, plan: PipelineStage | StageVariant,
                     field: str, named: dict[str, list[str]], policy: str) -> None:
    for unit, ops in named.items():
        if plan.unit_policy(unit) != policy:
            raise ValueError(
                f"stages[{stage.stage_index}]{where}.{field}: {unit!r} is not a {policy!r} "
                f"module of the stage; give it unit_policies {policy!r} or drop it"
            )
        bad = [op for op in ops if not SAVED_OP.fullmatch(op)]
        if bad:
            raise ValueError(
                f"stages[{stage.stage_index}]{where}.{field}[{unit!r}]: {bad[0]!r} is not "
                "'OP#K' (an operator and its call index from 0, e.g. 'aten.addmm#0')"
            )


def _check_stage_plans(s: PipelineStage) -> None:
    """The stage's own unit plan and its variants': modules of the stage, named calls of the
    right policy, each micro-batch in one variant at most."""
    seen: set[int] = set()
    plans: list[tuple[str, PipelineStage | StageVariant]] = [("", s)]
    plans += [(f".variants[{k}]", v) for k, v in enumerate(s.variants)]
    for where, plan in plans:
        stray = sorted(m for m in plan.unit_policies if not inside_modules(m, s.modules))
        if stray:
            raise ValueError(
                f"stages[{s.stage_index}]{where}.unit_policies: {stray[0]!r} is not one of the "
                "stage's modules nor inside one; name a module listed in its modules or a "
                "submodule of one ('h.3.mlp')"
            )
        nested = [(a, b) for a in plan.unit_policies for b in plan.unit_policies
                  if b.startswith(a + ".")]
        if nested:
            raise ValueError(
                f"stages[{s.stage_index}]{where}.unit_policies: {nested[0][1]!r} is inside "
                f"{nested[0][0]!r}, which has a policy too; give a policy to one of them"
            )
        _check_named_ops(s, where, plan, "unit_saved_ops", plan.unit_saved_ops, "recompute")
        _check_named_ops(s, where, plan, "unit_offload_ops", plan.unit_offload_ops, "offload")
        if isinstance(plan, StageVariant):
            twice = sorted(mb for mb in plan.microbatches if mb in seen or mb < 0)
            if twice:
                raise ValueError(
                    f"stages[{s.stage_index}]{where}.microbatches: {twice[0]} is negative or in "
                    "an earlier variant; give each micro-batch one variant at most"
                )
            seen |= set(plan.microbatches)


class Partition(BaseModel):
    """Stages 0..S-1, each on one rank; ranks 0..R-1 each run at least one stage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: list[PipelineStage] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Partition:
        indices = sorted(s.stage_index for s in self.stages)
        if indices != list(range(len(self.stages))):
            raise ValueError(f"stages: stage_index must be 0..{len(self.stages) - 1} once each")
        ranks = {s.rank for s in self.stages}
        if ranks != set(range(len(ranks))):
            missing = sorted(set(range(max(ranks) + 1)) - ranks)
            raise ValueError(f"stages: ranks must be 0..{max(ranks)}; rank {missing[0]} runs none")
        for s in self.stages:
            if not s.nodes and not s.modules:
                raise ValueError(f"stages[{s.stage_index}]: names no nodes and no modules")
            _check_stage_plans(s)
        return self

    @property
    def stage_count(self) -> int:
        return len(self.stages)

    @property
    def rank_count(self) -> int:
        return 1 + max(s.rank for s in self.stages)

    def rank_of(self, stage_index: int) -> int:
        return self.stage(stage_index).rank

    def stage(self, stage_index: int) -> PipelineStage:
        for s in self.stages:
            if s.stage_index == stage_index:
                return s
        raise KeyError(stage_index)


def check_rank_actions(
    partition: Partition, rank_actions: Sequence[Sequence[PipelineAction]]
) -> None:
    """Raise ValueError naming rank and action when a list does not fit the partition."""
    if len(rank_actions) != partition.rank_count:
        raise ValueError(
            f"rank_actions: {len(rank_actions)} action lists for {partition.rank_count} ranks"
        )
    last = partition.stage_count - 1
    for rank, actions in enumerate(rank_actions):
        for i, a in enumerate(actions):
            where = f"rank_actions[{rank}][{i}] ({a})"
            if a.stage_index > last:
                raise ValueError(f"{where}: no stage {a.stage_index} (stages 0..{last})")
            owner = partition.rank_of(a.stage_index)
            if owner != rank:
                raise ValueError(f"{where}: stage {a.stage_index} runs on rank {owner}")
            if a.op in (PipelineOp.send_f, PipelineOp.recv_b) and a.stage_index == last:
                raise ValueError(f"{where}: the last stage has no next stage")
            if a.op in (PipelineOp.recv_f, PipelineOp.send_b) and a.stage_index == 0:
                raise ValueError(f"{where}: stage 0 has no previous stage")
