"""When a pipeline action's inputs are there: the dependency rules of the event simulation
(planner.sim.pipeline_ranks), over what has run and what has arrived so far.

A SEND does not block its rank: the data arrives at the peer
`resources.device_link.transfer_ms(boundary bytes)` after the producing compute ends (no link
given: instantly; links are not shared, no contention). A RECV blocks its rank until the
matching send's data arrives: RECV_F of stage s matches SEND_F of stage s-1, RECV_B of stage s
matches SEND_B of stage s+1, same micro-batch. Lists without any SEND/RECV are torch's
"compute_only" form: the communication is implied (a stage's F waits for the previous stage's F
plus the transfer, its B for the next stage's B or I). Neighbouring stages on one rank need no
communication. An action that waits for another rank raises Blocked (the rank stops there for
now); one whose input had to run earlier on its own rank and did not is a PlanError.
"""

from __future__ import annotations

from planner.core.pipeline_actions import Partition, PipelineAction, PipelineOp
from planner.core.resources import Link
from planner.sim.result import PlanError
from planner.sim.stage_costs import StageCosts

F, B, I_, W = (PipelineOp.forward, PipelineOp.backward, PipelineOp.backward_input,
               PipelineOp.backward_weight)
SEND_F, RECV_F, SEND_B, RECV_B = (PipelineOp.send_f, PipelineOp.recv_f, PipelineOp.send_b,
                                  PipelineOp.recv_b)
Key = tuple[int, PipelineOp, int]  # (stage, op, micro-batch)


class Blocked(Exception):
    """The action waits for another rank (`waits_for` names what)."""

    def __init__(self, waits_for: str) -> None:
        self.waits_for = waits_for


class RankWaits:
    """What has run (`done`) and arrived (`arrivals`) so far, and when an action may start."""

    def __init__(
        self, partition: Partition, costs: list[StageCosts], link: Link | None, implicit: bool
    ) -> None:
        self.partition = partition
        self.costs = costs
        self.link = link
        self.last = partition.stage_count - 1
        self.implicit = implicit  # compute_only lists: the communication is implied
        self.done: dict[Key, tuple[float, int]] = {}  # -> (end time, action index)
        self.arrivals: dict[Key, float] = {}  # (receiving stage, RECV op, mb) -> arrival

    def transfer_ms(self, nbytes: int) -> float:
        return 0.0 if self.link is None else self.link.transfer_ms(nbytes)

    def fail(self, rank: int, i: int, a: PipelineAction, why: str) -> PlanError:
        return PlanError(f"rank {rank}, action {i} ({a}): {why}", i, None, rank)

    def need(self, rank: int, i: int, a: PipelineAction, key: Key, what: str) -> float:
        """End time of `key`, which must have run earlier on this rank."""
        if key not in self.done:
            s, op, mb = key
            raise self.fail(rank, i, a, f"needs {what} ({s}{op.value}{mb}) earlier on rank {rank}")
        return self.done[key][0]

    def remote(self, key: Key, extra_ms: float) -> float:
        """Implied communication: end of `key` on its rank plus the transfer, or blocked."""
        if key not in self.done:
            s, op, mb = key
            raise Blocked(f"{s}{op.value}{mb} on rank {self.partition.rank_of(s)}")
        return self.done[key][0] + extra_ms

    def gradient_of(self, key_stage: int, mb: int) -> Key | None:
        for op in (B, I_):
            if (key_stage, op, mb) in self.done:
                return (key_stage, op, mb)
        return None

    def implied_transfer_ms(self, rank: int, a: PipelineAction) -> float:
        """compute_only lists: the transfer that brought this compute's input from a peer."""
        s, op = a.stage_index, a.op
        if op is F and s > 0 and self.partition.rank_of(s - 1) != rank:
            return self.transfer_ms(self.costs[s - 1].send_forward_bytes)
        if op in (B, I_) and s < self.last and self.partition.rank_of(s + 1) != rank:
            return self.transfer_ms(self.costs[s + 1].send_backward_bytes)
        return 0.0


    def ready_time(self, rank: int, i: int, a: PipelineAction) -> float:
        """When `a`'s inputs are there; raises Blocked or PlanError."""
        s, op, mb = a.stage_index, a.op, a.microbatch_index
        c = self.costs
        if op is F:
            if s == 0:
                return 0.0
            if self.partition.rank_of(s - 1) == rank:
                return self.need(rank, i, a, (s - 1, F, mb), "the previous stage's forward")
            if self.implicit:
                return self.remote((s - 1, F, mb), self.transfer_ms(c[s - 1].send_forward_bytes))
            return self.need(rank, i, a, (s, RECV_F, mb), "its input")
        if op in (B, I_):
            t = self.need(rank, i, a, (s, F, mb), "the forward")
            if s == self.last:
                return t
            if self.partition.rank_of(s + 1) == rank:
                g = self.gradient_of(s + 1, mb)
                if g is None:
                    raise self.fail(rank, i, a, f"needs the backward of stage {s + 1} earlier")
                return max(t, self.done[g][0])
            if self.implicit:
                g = self.gradient_of(s + 1, mb)
                if g is None:
                    raise Blocked(f"{s + 1}B{mb} on rank {self.partition.rank_of(s + 1)}")
                return max(t, self.done[g][0] + self.transfer_ms(c[s + 1].send_backward_bytes))
            return max(t, self.need(rank, i, a, (s, RECV_B, mb), "its gradient"))
        if op is W:
            return self.need(rank, i, a, (s, I_, mb), "the input-gradient backward")
        if op is SEND_F:
            return self.need(rank, i, a, (s, F, mb), "the forward")
        if op is SEND_B:
            g = self.gradient_of(s, mb)
            if g is None:
                raise self.fail(rank, i, a, f"needs the backward ({s}B{mb} or {s}I{mb}) earlier")
            return self.done[g][0]
        key = (s, op, mb)  # RECV_F / RECV_B
        if key not in self.arrivals:
            peer = s - 1 if op is RECV_F else s + 1
            send = SEND_F if op is RECV_F else SEND_B
            raise Blocked(f"{peer}{send.value}{mb} on rank {self.partition.rank_of(peer)}")
        return self.arrivals[key]
