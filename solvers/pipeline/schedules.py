"""Pipeline schedules as classes in one registry (as torch.distributed.pipelining's
`get_schedule_class`): each class owns its checks, its stages a rank, its in-flight limit and
its action lists per rank (torch's vocabulary, planner.core.pipeline_actions).

- gpipe: every forward, then every backward (all m micro-batches in flight on every stage).
- 1f1b: rank r runs min(P - 1 - r, m) forwards, then alternates one forward and one backward,
  then drains: stage s holds min(m, P - s) micro-batches.
- interleaved-1f1b: v stages (chunks) per rank, stage c*P + r on rank r, Megatron-LM's order
  (warm-up 2(P - 1 - r) + (v - 1)P forwards, groups of P micro-batches per chunk); m must be a
  multiple of P.
- zb-h1 / zb-h2: the backward split into I and W, list-scheduled on the stages' own times
  (planner.solvers.pipeline.zero_bubble) with at most min(m, P - r) micro-batches in flight on
  rank r (ZB-H1: 1F1B's memory) or min(m, 2(P - r) - 1) (ZB-H2).

A new schedule is one subclass of `Schedule` here, registered with `@_register`; its
name then reaches `SCHEDULES`, the checks and every partitioner. The module-level functions
(`check_schedule`, `stages_per_rank`, `inflight_limit`, `compute_lists`) are the registry's
classes called by name. Errors name request fields ("schedule", "devices", "microbatches",
"chunks"); entry points say them in their own words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from planner.core.errors import InputError
from planner.core.pipeline_actions import PipelineAction, pipeline_action
from planner.solvers.pipeline.action_lists import (
    RankLists,
    inflight_counts,
    stage_rank,
    with_communication,
)
from planner.solvers.pipeline.zero_bubble import StageTimes, zero_bubble_lists

__all__ = [
    "SCHEDULES", "SCHEDULE_CLASSES", "SPLIT_BACKWARD", "GPipe", "Interleaved1F1B", "OneFOneB",
    "Schedule", "RankLists", "StageTimes", "ZeroBubbleH1", "ZeroBubbleH2",
    "check_schedule", "compute_lists", "inflight_counts", "inflight_limit", "make_schedule",
    "schedule_class", "stage_rank", "stages_per_rank", "with_communication",
]


@dataclass(frozen=True)
class Schedule:
    """A schedule for `ranks` devices running `microbatches` micro-batches a step (and `chunks`
    stages a rank where the schedule interleaves); checked when made."""

    name: ClassVar[str]  # the spelling users give (--schedule, resources.pipeline_schedule)
    split_backward: ClassVar[bool] = False  # backward as I then W (zero-bubble)
    torch_class: ClassVar[str | None] = None  # torch's get_schedule_class name, None: none

    ranks: int
    microbatches: int
    chunks: int = 1

    def __post_init__(self) -> None:
        self.check(self.ranks, self.microbatches, self.chunks)

    @classmethod
    def check(cls, ranks: int, microbatches: int, chunks: int = 1) -> None:
        """InputError (one line, naming the field) for numbers this schedule cannot run."""
        if ranks < 1:
            raise InputError(f"a pipeline needs at least 1 device (got {ranks})", field="devices")
        if microbatches < 1:
            raise InputError(f"at least 1 (got {microbatches})", field="microbatches")

    @classmethod
    def stages_per_rank(cls, chunks: int) -> int:
        return 1

    @property
    def stage_count(self) -> int:
        return self.ranks * self.stages_per_rank(self.chunks)

    def inflight_limit(self, rank: int) -> int:
        """Micro-batches rank `rank` may hold at once (one stage a rank)."""
        return min(self.microbatches, self.ranks - rank)

    def inflight_per_stage(self) -> list[int]:
        """Per stage, the most micro-batches holding activations at once, read from the lists."""
        return inflight_counts(self.compute_lists(), self.stage_count)

    def compute_lists(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        """F/B (or F/I/W) actions per rank, no communication. `times` and `recompute` (per
        stage) matter only to schedules generated on the stages' own times (zero-bubble)."""
        raise NotImplementedError

    def rank_actions(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        """The lists with SEND/RECV between stages on different ranks."""
        return with_communication(self.compute_lists(times, recompute), self.ranks)


SCHEDULE_CLASSES: dict[str, type[Schedule]] = {}


def _register(cls: type[Schedule]) -> type[Schedule]:
    SCHEDULE_CLASSES[cls.name] = cls
    return cls


@_register
class GPipe(Schedule):
    name = "gpipe"
    torch_class = "GPipe"

    def inflight_limit(self, rank: int) -> int:
        return self.microbatches

    def compute_lists(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        m = self.microbatches
        return [[pipeline_action(r, "F", k) for k in range(m)]
                + [pipeline_action(r, "B", k) for k in range(m)] for r in range(self.ranks)]


@_register
class OneFOneB(Schedule):
    name = "1f1b"
    torch_class = "1F1B"

    def compute_lists(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        p, m = self.ranks, self.microbatches
        out = []
        for r in range(p):
            warm = min(p - 1 - r, m)
            row = [pipeline_action(r, "F", k) for k in range(warm)]
            for k in range(m - warm):
                row += [pipeline_action(r, "F", warm + k), pipeline_action(r, "B", k)]
            row += [pipeline_action(r, "B", k) for k in range(m - warm, m)]
            out.append(row)
        return out


@_register
class Interleaved1F1B(Schedule):
    name = "interleaved-1f1b"
    torch_class = "Interleaved1F1B"

    @classmethod
    def check(cls, ranks: int, microbatches: int, chunks: int = 1) -> None:
        super().check(ranks, microbatches, chunks)
        if chunks < 2:
            raise InputError(f"interleaved 1F1B runs at least 2 stages a rank (got {chunks})",
                             field="chunks")
        if microbatches % ranks:
            raise InputError(
                f"interleaved 1F1B runs micro-batches in groups of the {ranks} devices; use a "
                f"multiple of {ranks} (e.g. {ranks * max(1, -(-microbatches // ranks))}), not "
                f"{microbatches}",
                field="microbatches",
            )

    @classmethod
    def stages_per_rank(cls, chunks: int) -> int:
        return chunks

    def compute_lists(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        return [self._rank(r) for r in range(self.ranks)]

    def _rank(self, r: int) -> list[PipelineAction]:
        p, m, v = self.ranks, self.microbatches, self.chunks
        total = m * v

        def unit(k: int, op: str) -> PipelineAction:
            in_group = k % (p * v)
            chunk = in_group // p if op == "F" else v - 1 - in_group // p
            return pipeline_action(chunk * p + r, op, (k // (p * v)) * p + k % p)

        warm = min((p - 1 - r) * 2 + (v - 1) * p, total)
        out = [unit(k, "F") for k in range(warm)]
        for k in range(total - warm):
            out += [unit(warm + k, "F"), unit(k, "B")]
        out += [unit(k, "B") for k in range(total - warm, total)]
        return out


@_register
class ZeroBubbleH1(Schedule):
    name = "zb-h1"
    split_backward = True

    def inflight_per_stage(self) -> list[int]:
        return [self.inflight_limit(s) for s in range(self.stage_count)]  # stage s on rank s

    def compute_lists(
        self,
        times: Sequence[StageTimes] | None = None,
        recompute: Sequence[frozenset[int]] | None = None,
    ) -> RankLists:
        limits = [self.inflight_limit(r) for r in range(self.ranks)]
        return zero_bubble_lists(limits, self.microbatches, times, recompute)


@_register
class ZeroBubbleH2(ZeroBubbleH1):
    name = "zb-h2"

    def inflight_limit(self, rank: int) -> int:
        return min(self.microbatches, 2 * (self.ranks - rank) - 1)


SCHEDULES: tuple[str, ...] = tuple(SCHEDULE_CLASSES)
SPLIT_BACKWARD = frozenset(n for n, c in SCHEDULE_CLASSES.items() if c.split_backward)


def schedule_class(name: str) -> type[Schedule]:
    """The class of schedule `name`; InputError (field "schedule") naming the choices."""
    if name not in SCHEDULE_CLASSES:
        raise InputError(f"{name}: use one of {', '.join(SCHEDULES)}", field="schedule")
    return SCHEDULE_CLASSES[name]


def make_schedule(name: str, ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Schedule `name` for these numbers, checked (InputError naming the field)."""
    return schedule_class(name)(ranks, microbatches, chunks)


# -- by name: what partitioners and entry points call ------------------------------------------
# Schedules, their simulation and the partitioners grow with the micro-batch count: past this
# (the service's cap too) a request is refused, not left running for hours (10**9 hung).
MAX_MICROBATCHES = 4_096


def check_schedule(schedule: str, ranks: int, microbatches: int, chunks: int = 1) -> None:
    """InputError (one line, naming the field) for a schedule these numbers cannot run."""
    if microbatches > MAX_MICROBATCHES:
        raise InputError(f"{microbatches} micro-batches: at most {MAX_MICROBATCHES}",
                         field="microbatches")
    schedule_class(schedule).check(ranks, microbatches, chunks)


def stages_per_rank(schedule: str, chunks: int) -> int:
    return schedule_class(schedule).stages_per_rank(chunks)


def inflight_limit(schedule: str, ranks: int, microbatches: int, rank: int) -> int:
    """Micro-batches a one-stage-a-rank schedule lets rank `rank` hold at most."""
    return make_schedule(schedule, ranks, microbatches).inflight_limit(rank)


def compute_lists(
    schedule: str,
    ranks: int,
    microbatches: int,
    chunks: int = 1,
    times: Sequence[StageTimes] | None = None,
    recompute: Sequence[frozenset[int]] | None = None,
) -> RankLists:
    """F/B (or F/I/W) actions per rank, no communication (see Schedule.compute_lists)."""
    return make_schedule(schedule, ranks, microbatches, chunks).compute_lists(times, recompute)

