"""Event simulation of a pipeline plan: every rank's action list runs concurrently.

Each rank runs its list in order on one compute stream. F/B/I/W of (stage, micro-batch) take the
stage's times (planner.sim.stage_costs); an action starts once its rank is free and its inputs
are there (planner.sim.pipeline_waits: sends, receives, or the communication compute_only lists
imply). A rank that can never go on is a deadlock, reported with what it waits for.

Per-rank memory over time (planner.sim.stage_costs' rules, as torch.distributed.pipelining
allocates): the stages' model state and torch's receive buffers (per micro-batch, the whole
step), plus each micro-batch's kept bytes (taken when its F starts: its saved bytes; the input
gradient its backward sends from that B's, or I's, start; when its B, or its W, ends all but
what torch keeps to the step's end, the sent outputs, loss and input gradient, are
released), plus a stage's transient bytes while one of its computes runs (a W its own:
planner.sim.rank_memory.compute_transient_bytes); under I/W also the gradients an I keeps
until its W ends. A micro-batch the stage recomputes
(PipelineStage.recompute_microbatches) keeps only the held bytes from F on; its B (or I) reruns
the forward first (forward_ms longer) and takes the rest of the saved bytes back when it starts;
under zero-bubble a later stage's W reruns it once more (planner.runtime.pipeline runs a W as
one autograd call; the first stage's W is its whole backward, timed at its I here).
Stages with unit_policies (per-module remat/offload) run with the costs of
planner.sim.stage_policies (a micro-batch of one of its variants with the variant's); their
offloaded bytes are host memory from F to B's (W's) end
(host_peak_bytes: all ranks together, one host).
Makespan: when the last rank ends; bubble fraction: 1 - busy compute / (ranks x makespan);
throughput: micro-batches per second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineAction, check_rank_actions
from planner.core.resources import Resources
from planner.sim.pipeline_waits import (
    I_,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    B,
    Blocked,
    F,
    Key,
    RankWaits,
    W,
)
from planner.sim.rank_memory import compute_transient_bytes
from planner.sim.result import PlanError, RankResult, SimulationResult
from planner.sim.stage_costs import (
    StageCosts,
    kept_bytes,
    rank_base_bytes,
    rank_start_bytes,
    released_bytes,
    stage_costs,
)
from planner.sim.stage_policies import variant_unit_costs


@dataclass(frozen=True)
class ActionSpan:
    """When one compute action ran (for schedule pictures)."""

    rank: int
    action: PipelineAction
    start_ms: float
    end_ms: float


class _Ranks(RankWaits):
    """Every rank's list run as events: clocks, busy time, memory events and compute spans."""

    def __init__(
        self,
        graph: Graph,
        partition: Partition,
        rank_actions: Sequence[Sequence[PipelineAction]],
        resources: Resources | None,
    ) -> None:
        try:
            check_rank_actions(partition, rank_actions)
        except ValueError as e:
            raise PlanError(str(e)) from None
        self.lists = rank_actions
        # each stage's costs under its unit_policies (remat/offload per module; unchanged
        # without), and the bytes its offloaded units hold in host memory per micro-batch
        policy = variant_unit_costs(graph, partition, stage_costs(graph, partition), resources)
        super().__init__(
            partition, [own.costs for own, _ in policy],
            resources.device_link if resources is not None else None,
            implicit=not any(not a.is_compute for row in rank_actions for a in row),
        )
        self.host_bytes = [own.host_bytes for own, _ in policy]
        # per stage, the micro-batches that run a variant's unit plan (PipelineStage.variants)
        self.variants = [by_microbatch for _, by_microbatch in policy]
        self.host_events: list[tuple[float, int, int, int]] = []  # as events, host memory
        self.recomputed = [frozenset(partition.stage(s).recompute_microbatches)
                           for s in range(partition.stage_count)]
        self.spans: list[ActionSpan] = []
        self.received: set[Key] = set()
        self.clock = [0.0] * len(rank_actions)
        self.busy = [0.0] * len(rank_actions)
        self.transfer = 0.0
        self.events: list[tuple[float, int, int, int]] = []  # (time, rank, seq, bytes delta)
        self.microbatches = 1 + max((a.microbatch_index for row in rank_actions for a in row),
                                    default=0)
        if resources is not None and resources.microbatches > 1:
            if resources.microbatches != self.microbatches:
                raise PlanError(
                    f"resources.microbatches is {resources.microbatches} but the rank actions "
                    f"run {self.microbatches} micro-batches"
                )
        for s, by_microbatch in enumerate(self.variants):
            beyond = sorted(mb for mb in by_microbatch if mb >= self.microbatches)
            if beyond:
                raise PlanError(
                    f"partition: stage {s}'s variants name micro-batch {beyond[0]}, but the rank "
                    f"actions run {self.microbatches} (0..{self.microbatches - 1}); drop it"
                )

    def cost_of(self, s: int, mb: int) -> tuple[StageCosts, int]:
        """Stage s's costs and host bytes in micro-batch mb (its variant's, or its own)."""
        got = self.variants[s].get(mb)
        return (self.costs[s], self.host_bytes[s]) if got is None else (got.costs,
                                                                         got.host_bytes)

    # -- one action --------------------------------------------------------------------------
    def execute(self, rank: int, i: int, a: PipelineAction) -> None:
        s, op, mb = a.stage_index, a.op, a.microbatch_index
        key = (s, op, mb)
        if mb >= self.microbatches:  # pragma: no cover - microbatches is inferred from actions
            raise self.fail(rank, i, a, f"no micro-batch {mb}")
        if key in self.done or (op is RECV_F or op is RECV_B) and key in self.received:
            raise self.fail(rank, i, a, f"runs a second time (first at action {self.done[key][1]})"
                            if key in self.done else "receives a second time")
        if op in (I_, W) and (s, B, mb) in self.done or op is B and (s, I_, mb) in self.done:
            raise self.fail(rank, i, a, "mixes a full backward (B) with its split (I/W)")
        ready = self.ready_time(rank, i, a)  # may raise Blocked: nothing changes before this
        start = max(self.clock[rank], ready)
        c = self.costs[s]
        if self.implicit:
            self.transfer += self.implied_transfer_ms(rank, a)
        if op in (SEND_F, SEND_B):
            nbytes = c.send_forward_bytes if op is SEND_F else c.send_backward_bytes
            duration = self.transfer_ms(nbytes)
            self.transfer += duration
            target = (s + 1, RECV_F, mb) if op is SEND_F else (s - 1, RECV_B, mb)
            self.arrivals[target] = start + duration  # posted when the rank gets there
            self.done[key] = (start, i)
            return
        if op in (RECV_F, RECV_B):
            self.clock[rank] = start
            self.received.add(key)
            self.done[key] = (start, i)
            return
        c, host_bytes = self.cost_of(s, mb)
        again = mb in self.recomputed[s]
        kept = kept_bytes(c, again)
        duration = {F: c.forward_ms, B: c.backward_ms, I_: c.backward_input_ms,
                    W: c.backward_weight_ms}[op]
        if again and (op in (B, I_) or (op is W and not c.first_stage)):
            duration += c.forward_ms  # a later stage's W reruns it once more (one autograd call)
        end = start + duration
        seq = 4 * len(self.spans)  # this compute's events: seq .. seq + 3, in this order
        if op is F:
            self.events.append((start, rank, seq, kept))
        elif op in (B, I_):  # its input gradient (kept to the step's end), a rerun's saved
            self.events.append((start, rank, seq,
                                c.send_backward_bytes + (released_bytes(c) if again else 0)))
        if op is I_:  # the gradients torch's I keeps for the W
            self.events.append((start, rank, seq, c.weight_pending_bytes))
        transient = compute_transient_bytes(c, op, again)
        self.events.append((start, rank, seq + 1, transient))
        self.events.append((end, rank, seq + 2, -transient))
        if op in (B, W):
            self.events.append((end, rank, seq + 3, -released_bytes(c, again)))
        if op is W:
            self.events.append((end, rank, seq + 3, -c.weight_pending_bytes))
        if host_bytes and op in (F, B, W):  # offloaded: host from F to B/W's end
            delta = host_bytes if op is F else -host_bytes
            self.host_events.append((start if op is F else end, rank, seq, delta))
        self.clock[rank] = end
        self.busy[rank] += duration
        self.done[key] = (end, i)
        self.spans.append(ActionSpan(rank, a, start, end))

    # -- the whole schedule ------------------------------------------------------------------
    def run(self, graph: Graph) -> SimulationResult:
        pos = [0] * len(self.lists)
        progress = True
        while progress:
            progress = False
            for rank, row in enumerate(self.lists):
                while pos[rank] < len(row):
                    try:
                        self.execute(rank, pos[rank], row[pos[rank]])
                    except Blocked:
                        break
                    pos[rank] += 1
                    progress = True
        if any(pos[r] < len(row) for r, row in enumerate(self.lists)):
            raise self.deadlock(pos)
        self.check_complete()
        return self.result(graph)

    def deadlock(self, pos: list[int]) -> PlanError:
        stuck: list[tuple[int, int, PipelineAction, str]] = []
        for rank, row in enumerate(self.lists):
            if pos[rank] < len(row):
                a = row[pos[rank]]
                try:
                    self.ready_time(rank, pos[rank], a)
                    waits = "?"  # pragma: no cover - it would have run
                except Blocked as b:
                    waits = b.waits_for
                stuck.append((rank, pos[rank], a, waits))
        rank, i, a, waits = stuck[0]
        peer = int(waits.rsplit(" ", 1)[1])
        there = (
            f"which waits at action {pos[peer]} ({self.lists[peer][pos[peer]]})"
            if pos[peer] < len(self.lists[peer])
            else "which has no such action"
        )
        others = "".join(f"; rank {r} waits at action {j} ({b}) for {w}"
                         for r, j, b, w in stuck[1:4])
        return PlanError(
            f"deadlock: rank {rank} waits at action {i} ({a}) for {waits}, {there}{others}",
            i, None, rank,
        )

    def check_complete(self) -> None:
        for s in range(self.partition.stage_count):
            rank = self.partition.rank_of(s)
            end = len(self.lists[rank])
            for mb in range(self.microbatches):
                if (s, F, mb) not in self.done:
                    raise PlanError(f"rank {rank}: stage {s} never runs the forward of "
                                    f"micro-batch {mb}", end, None, rank)
                if (s, B, mb) not in self.done and (s, W, mb) not in self.done:
                    raise PlanError(f"rank {rank}: stage {s} never completes the backward of "
                                    f"micro-batch {mb}", end, None, rank)
        for (s, op, mb) in self.arrivals:
            if (s, op, mb) not in self.received:
                send = SEND_F if op is RECV_F else SEND_B
                peer = s - 1 if op is RECV_F else s + 1
                rank = self.partition.rank_of(peer)
                i = self.done[(peer, send, mb)][1]
                raise PlanError(
                    f"rank {rank}, action {i} ({peer}{send.value}{mb}): never received "
                    f"(no {s}{op.value}{mb} on rank {self.partition.rank_of(s)})", i, None, rank,
                )

    def result(self, graph: Graph) -> SimulationResult:
        stage_ranks = [self.partition.rank_of(s) for s in range(len(self.costs))]
        ranks = []
        for r in range(len(self.lists)):
            base = rank_base_bytes(self.costs, stage_ranks, r)
            live = peak = rank_start_bytes(self.costs, stage_ranks, r, self.microbatches)
            for _, _, _, delta in sorted(e for e in self.events if e[1] == r):
                live += delta
                peak = max(peak, live)
            host = host_peak(e for e in self.host_events if e[1] == r)
            ranks.append(RankResult(r, peak, base, self.busy[r], self.clock[r], host))
        makespan = max(self.clock)
        busy = math.fsum(self.busy)
        m = self.microbatches
        top = max(ranks, key=lambda x: x.peak_bytes)
        return SimulationResult(
            peak_bytes=top.peak_bytes,
            peak_action_index=-1,
            fixed_bytes=sum(c.model_state_bytes for c in self.costs),
            compute_cost=busy,
            baseline_cost=graph.total_compute_ms * m,
            computations=len(graph.nodes) * m,
            node_count=len(graph.nodes),
            timeline=(),
            event_simulated=True,
            host_peak_bytes=host_peak(self.host_events),  # every rank's together (one host)
            compute_ms=busy,
            transfer_ms=self.transfer,
            makespan_ms=makespan,
            ranks=tuple(ranks),
            microbatches=m,
            throughput_per_s=m / (makespan / 1e3) if makespan > 0 else None,
            bubble_fraction=max(0.0, 1 - busy / (len(ranks) * makespan)) if makespan > 0 else 0.0,
        )


def host_peak(events: Iterable[tuple[float, int, int, int]]) -> int:
    """The most host bytes live at once over (time, rank, seq, delta) events."""
    live = peak = 0
    for *_, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


def simulate_pipeline(
    graph: Graph,
    partition: Partition,
    rank_actions: Sequence[Sequence[PipelineAction]],
    resources: Resources | None = None,
) -> SimulationResult:
    """Simulate every rank of a pipeline plan; PlanError names rank and action."""
    return _Ranks(graph, partition, rank_actions, resources).run(graph)


def simulate_pipeline_spans(
    graph: Graph,
    partition: Partition,
    rank_actions: Sequence[Sequence[PipelineAction]],
    resources: Resources | None = None,
) -> tuple[SimulationResult, list[ActionSpan]]:
    """`simulate_pipeline` plus when each compute action ran (rank, start, end)."""
    ranks = _Ranks(graph, partition, rank_actions, resources)
    result = ranks.run(graph)
    return result, sorted(ranks.spans, key=lambda x: (x.rank, x.start_ms))
