"""One FSDP2 rank's memory and step time over a chain of blocks (no torch).

A job sharded with torch's `fully_shard` (FSDP2) is modelled as torchtitan builds it: every
block (transformer layer) is its own `fully_shard` group, the root holds the rest (embeddings,
final norm, head). A plan (`FsdpPlan`) chooses per block its activation policy (`keep`,
`selective`: matmul outputs kept and the rest recomputed, `full`: recompute the whole block from
its input) and whether the block reshards its parameters after the forward, and one prefetch
depth: how many blocks ahead the all-gathers are issued (forward and backward; 0: none, each
all-gather waits for its own block, the least memory and the most exposed communication).

What the rank computes is summarised by phases measured on one process
(`planner.tracing.fsdp_blocks.profile_blocks`): the root's head forward (before block 0), every
block's forward and backward under each policy, the tail's forward (after the last block, the
loss included) and backward, the head's backward. A phase is its peak above the bytes live at
its start, its net change and its time; phases compose because a block's saved activations,
recompute and gradients depend on its own policy only.

`simulate_fsdp` walks the step in the order FSDP2 runs it (torch 2.13,
`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`), as the allocator sees it:

- forward, per group: the all-gather output (the group's padded unsharded bytes U) is allocated
  when the all-gather is issued (at the group's own pre-forward, or earlier by prefetch), the
  collective's temporary copies on top while it runs (gloo: one more U); the copy-out allocates
  the unsharded parameters (U) and then frees the previous group's all-gather output, which FSDP2
  keeps in `all_gather_state` to overlap the copy-out with the next all-gather; the last one is
  freed when the root's forward ends. After the block's forward its parameters are freed unless
  the plan keeps them (`reshard_after_forward=False`). The root never reshards after forward.
- backward, per block in reverse: unshard if resharded (the all-gather output U, the copy-out's
  U, the prefetches of the next `prefetch` blocks, then the output freed); the block's backward
  (its recompute, its unsharded gradients G); after it the parameters are freed, the previous
  reduce-scatter's input freed (`reduce_scatter_max_input_buffers` = 1), the gradients copied
  into a new reduce-scatter input (U) and freed, the reduce-scatter output (U / N: the sharded
  gradient, kept) and the collective's temporary (gloo: a copy of the input, U). The root's
  reduce-scatter runs at the end of the backward, after the head's backward.

Times: one compute stream, one all-gather and one reduce-scatter stream (FSDP2's streams on a
GPU). A collective moves (N - 1) / N of U over the link (ring) plus the link's latency; an
all-gather starts when it is issued and its stream is free, a block's compute when its
all-gather is done and the compute stream is free; a reduce-scatter when the block's backward
ends. The step ends when compute and the last reduce-scatter are done. Device memory is what
the walk counts in issue order; on a GPU a prefetched all-gather allocates at the same point.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("keep", "selective", "full")
POLICY_LETTER = {"keep": "K", "selective": "S", "full": "F"}
LETTER_POLICY = {v: k for k, v in POLICY_LETTER.items()}
FSDP_MODEL_SCHEMA = "fsdp-model-1"
COLLECTIVE_TEMP = {"gloo": 1.0, "nccl": 0.0}  # extra copies of U a collective allocates


@dataclass(frozen=True)
class Phase:
    """A stretch of the step measured on one process: its peak above the bytes live at its start,
    the net bytes it leaves (negative when it frees more than it allocates), its time."""

    peak: int
    delta: int
    ms: float = 0.0


@dataclass(frozen=True)
class BlockCosts:
    """One block (one `fully_shard` group): its parameters and its phases under each policy."""

    name: str
    param_bytes: int  # unsharded parameter bytes (= its unsharded gradients)
    padded_bytes: dict[int, int]  # world size -> unsharded bytes with dim 0 padded to N's multiple
    forward: Mapping[str, Phase]  # policy -> forward phase
    backward: Mapping[str, Phase]  # policy -> backward phase (recompute included)


@dataclass(frozen=True)
class FsdpModel:
    """What the rank runs: the root's parameters and phases, the blocks in forward order."""

    root_param_bytes: int
    root_padded_bytes: dict[int, int]
    head_forward: Phase
    tail_forward: Phase
    tail_backward: Phase
    head_backward: Phase
    blocks: tuple[BlockCosts, ...]
    optimizer_bytes_per_param_byte: float = 2.0  # Adam's two moments at the parameters' dtype

    @property
    def param_bytes(self) -> int:
        return self.root_param_bytes + sum(b.param_bytes for b in self.blocks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`FsdpModel.from_dict` reads it back): what a tracer can store in a
        graph's metadata for planners without torch."""
        def ph(p: Phase) -> list[float]:
            return [p.peak, p.delta, p.ms]
        return {
            "schema": FSDP_MODEL_SCHEMA,
            "root_param_bytes": self.root_param_bytes,
            "root_padded_bytes": {str(k): v for k, v in self.root_padded_bytes.items()},
            "head_forward": ph(self.head_forward), "tail_forward": ph(self.tail_forward),
            "tail_backward": ph(self.tail_backward), "head_backward": ph(self.head_backward),
            "optimizer_bytes_per_param_byte": self.optimizer_bytes_per_param_byte,
            "blocks": [{"name": b.name, "param_bytes": b.param_bytes,
                        "padded_bytes": {str(k): v for k, v in b.padded_bytes.items()},
                        "forward": {k: ph(v) for k, v in b.forward.items()},
                        "backward": {k: ph(v) for k, v in b.backward.items()}}
                       for b in self.blocks],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FsdpModel:
        if data.get("schema") != FSDP_MODEL_SCHEMA:
            raise ValueError(f"schema: expected {FSDP_MODEL_SCHEMA!r}, got {data.get('schema')!r}")

        def ph(v: Sequence[float]) -> Phase:
            return Phase(int(v[0]), int(v[1]), float(v[2]))
        return cls(
            root_param_bytes=int(data["root_param_bytes"]),
            root_padded_bytes={int(k): int(v) for k, v in data["root_padded_bytes"].items()},
            head_forward=ph(data["head_forward"]), tail_forward=ph(data["tail_forward"]),
            tail_backward=ph(data["tail_backward"]), head_backward=ph(data["head_backward"]),
            blocks=tuple(BlockCosts(
                b["name"], int(b["param_bytes"]),
                {int(k): int(v) for k, v in b["padded_bytes"].items()},
                {k: ph(v) for k, v in b["forward"].items()},
                {k: ph(v) for k, v in b["backward"].items()}) for b in data["blocks"]),
            optimizer_bytes_per_param_byte=float(data["optimizer_bytes_per_param_byte"]),
        )

    def padded(self, world: int) -> tuple[int, list[int]]:
        """(root, per block) unsharded bytes padded for `world` ranks."""
        for sizes in [self.root_padded_bytes, *(b.padded_bytes for b in self.blocks)]:
            if world not in sizes:
                raise ValueError(f"no padded sizes for {world} ranks (profiled for "
                                 f"{sorted(sizes)})")
        return self.root_padded_bytes[world], [b.padded_bytes[world] for b in self.blocks]


@dataclass(frozen=True)
class FsdpPlan:
    """Per block: activation policy and reshard-after-forward; one prefetch depth (>= 0: 0
    issues every all-gather at its block's own pre-forward / pre-backward, FSDP2's backward
    default is 1).

    Text form: `policies=KSFK reshard=1101 prefetch=1` (K keep, S selective, F full recompute;
    1 reshard after forward, 0 keep the unsharded parameters until the block's backward)."""

    policies: tuple[str, ...]
    reshard: tuple[bool, ...]
    prefetch: int = 1

    def __post_init__(self) -> None:
        if len(self.policies) != len(self.reshard):
            raise ValueError("policies and reshard name the same blocks")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ValueError(f"unknown policy {bad[0]!r}; one of {', '.join(POLICIES)}")
        if self.prefetch < 0:
            raise ValueError("prefetch is a number of blocks, 0 or more")

    @classmethod
    def uniform(cls, blocks: int, policy: str, reshard: bool = True,
                prefetch: int = 1) -> FsdpPlan:
        return cls((policy,) * blocks, (reshard,) * blocks, prefetch)

    def text(self) -> str:
        return (f"policies={''.join(POLICY_LETTER[p] for p in self.policies)} "
                f"reshard={''.join('1' if r else '0' for r in self.reshard)} "
                f"prefetch={self.prefetch}")

    @classmethod
    def parse(cls, text: str) -> FsdpPlan:
        m = re.fullmatch(r"\s*policies=([KSF]+)\s+reshard=([01]+)\s+prefetch=(\d+)\s*", text)
        if not m:
            raise ValueError(f"not an FSDP plan: {text!r} (expected 'policies=KSF "
                             "reshard=110 prefetch=1')")
        return cls(tuple(LETTER_POLICY[c] for c in m[1]), tuple(c == "1" for c in m[2]),
                   int(m[3]))


@dataclass(frozen=True)
class FsdpResult:
    step_peak_bytes: int  # most bytes the step allocates at once above its start (per rank)
    resident_bytes: int  # sharded parameters and optimizer state, there before the step
    step_ms: float
    compute_ms: float
    comm_ms: float  # all-gathers and reduce-scatters, summed (overlapped or not)
    exposed_comm_ms: float  # step_ms - compute_ms
    peak_at: str  # where the peak is reached
    timeline: list[tuple[str, int]] = field(default_factory=list, repr=False)

    @property
    def peak_bytes(self) -> int:
        """The rank's predicted peak: what was there before the step plus the step's peak."""
        return self.resident_bytes + self.step_peak_bytes


@dataclass(frozen=True)
class LinkSpec:
    """The inter-device link the collectives use (bytes/s one direction, latency seconds)."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def collective_ms(self, unsharded_bytes: int, world: int) -> float:
        if world <= 1:
            return 0.0
        moved = unsharded_bytes * (world - 1) / world
        return moved / self.bandwidth_bytes_per_s * 1e3 + self.latency_s * 1e3


class _Walk:
    def __init__(self, keep_timeline: bool) -> None:
        self.live = 0
        self.peak = 0
        self.peak_at = "start"
        self.keep = keep_timeline
        self.timeline: list[tuple[str, int]] = []

    def _note(self, where: str, value: int) -> None:
        if value > self.peak:
            self.peak, self.peak_at = value, where
        if self.keep:
            self.timeline.append((where, value))

    def alloc(self, nbytes: int, where: str) -> None:
        self.live += nbytes
        self._note(where, self.live)

    def free(self, nbytes: int, where: str) -> None:
        self.live -= nbytes
        if self.keep:
            self.timeline.append((where, self.live))

    def transient(self, nbytes: int, where: str) -> None:
        self._note(where, self.live + nbytes)

    def phase(self, ph: Phase, where: str) -> None:
        self._note(where, self.live + ph.peak)
        self.live += ph.delta
        if self.keep:
            self.timeline.append((where + " end", self.live))


def simulate_fsdp(model: FsdpModel, plan: FsdpPlan, world: int, link: LinkSpec,
                  backend: str = "nccl", keep_timeline: bool = False) -> FsdpResult:
    """Walk one training step of one rank (see the module docstring)."""
    nb = len(model.blocks)
    if len(plan.policies) != nb:
        raise ValueError(f"plan names {len(plan.policies)} blocks, the model has {nb}")
    if world < 1:
        raise ValueError("world size is at least 1")
    if backend not in COLLECTIVE_TEMP:
        raise ValueError(f"backend {backend!r}: one of {', '.join(COLLECTIVE_TEMP)}")
    temp = COLLECTIVE_TEMP[backend]
    root_u, block_u = model.padded(world)
    d = plan.prefetch
    w = _Walk(keep_timeline)

    # time: compute stream `now`, all-gather stream free at `ag_free`, reduce-scatter `rs_free`
    now = 0.0
    ag_free = 0.0
    rs_free = 0.0
    comm_ms = 0.0
    compute_ms = 0.0
    ag_done: dict[int, float] = {}  # block -> its all-gather's end time (this pass)

    def all_gather(u: int, name: str, issue_at: float) -> float:
        nonlocal ag_free, comm_ms
        w.alloc(u, f"all-gather {name}")
        w.transient(int(u * temp), f"all-gather {name}")
        t = link.collective_ms(u, world)
        comm_ms += t
        start = max(issue_at, ag_free)
        ag_free = start + t
        return ag_free

    def run(ph: Phase, where: str) -> None:
        nonlocal now, compute_ms
        w.phase(ph, where)
        now += ph.ms
        compute_ms += ph.ms

    # ---- forward
    deferred = 0  # the last forward all-gather output FSDP2 keeps until the next copy-out
    t = all_gather(root_u, "root", now)
    now = max(now, t)
    w.alloc(root_u, "copy-out root")
    deferred = root_u
    issued: set[int] = set()
    for j in range(min(d, nb)):  # the root's pre-forward prefetches the first blocks
        ag_done[j] = all_gather(block_u[j], f"block {j} (prefetch)", now)
        issued.add(j)
    run(model.head_forward, "head forward")
    unsharded = [False] * nb
    for i, blk in enumerate(model.blocks):
        if i not in issued:
            ag_done[i] = all_gather(block_u[i], f"block {i}", now)
            issued.add(i)
        now = max(now, ag_done[i])
        w.alloc(block_u[i], f"copy-out block {i}")
        w.free(deferred, f"copy-out block {i}")
        deferred = block_u[i]
        unsharded[i] = True
        for j in range(i + 1, min(i + 1 + d, nb)):
            if j not in issued:
                ag_done[j] = all_gather(block_u[j], f"block {j} (prefetch)", now)
                issued.add(j)
        run(blk.forward[plan.policies[i]], f"block {i} forward ({plan.policies[i]})")
        if plan.reshard[i]:
            w.free(block_u[i], f"reshard block {i}")
            unsharded[i] = False
    run(model.tail_forward, "tail forward")
    w.free(deferred, "root post-forward")  # the root's forward ends after the loss

    # ---- backward
    ag_done.clear()
    issued.clear()
    for j in range(nb - 1, max(nb - 1 - d, -1), -1):  # the root's pre-backward prefetch
        if not unsharded[j]:
            ag_done[j] = all_gather(block_u[j], f"block {j} (backward prefetch)", now)
            issued.add(j)
    run(model.tail_backward, "tail backward")
    rs_input = 0  # the previous reduce-scatter's input, freed at the next post-backward
    for i in range(nb - 1, -1, -1):
        blk = model.blocks[i]
        got_output = False
        if not unsharded[i]:
            if i not in issued:
                ag_done[i] = all_gather(block_u[i], f"block {i} (backward)", now)
                issued.add(i)
            now = max(now, ag_done[i])
            w.alloc(block_u[i], f"copy-out block {i} (backward)")
            unsharded[i] = True
            got_output = True
        if got_output:  # the all-gather output is freed after the copy-out, before prefetching
            w.free(block_u[i], f"all-gather output block {i} freed")
        for j in range(i - 1, max(i - 1 - d, -1), -1):
            if not unsharded[j] and j not in issued:
                ag_done[j] = all_gather(block_u[j], f"block {j} (backward prefetch)", now)
                issued.add(j)
        run(blk.backward[plan.policies[i]], f"block {i} backward ({plan.policies[i]})")
        # post-backward: reshard, recycle the previous reduce-scatter input, reduce-scatter
        w.free(block_u[i], f"reshard block {i} (backward)")
        unsharded[i] = False
        w.free(rs_input, f"reduce-scatter input freed (block {i})")
        rs_input = block_u[i]
        _reduce_scatter(w, block_u[i], blk.param_bytes, world, temp, f"block {i}")
        t_rs = link.collective_ms(block_u[i], world)
        comm_ms += t_rs
        rs_free = max(rs_free, now) + t_rs
    run(model.head_backward, "head backward")
    w.free(root_u, "reshard root")
    w.free(rs_input, "reduce-scatter input freed (root)")
    _reduce_scatter(w, root_u, model.root_param_bytes, world, temp, "root")
    t_rs = link.collective_ms(root_u, world)
    comm_ms += t_rs
    rs_free = max(rs_free, now) + t_rs
    step_ms = max(now, rs_free)

    total_u = root_u + sum(block_u)
    shard = total_u // max(world, 1)
    resident = shard + int(shard * model.optimizer_bytes_per_param_byte)
    return FsdpResult(w.peak, resident, step_ms, compute_ms, comm_ms, step_ms - compute_ms,
                      w.peak_at, w.timeline)


def _reduce_scatter(w: _Walk, u: int, grad_bytes: int, world: int, temp: float,
                    name: str) -> None:
    """foreach_reduce: a new input buffer (U), the unsharded gradients copied in and freed, the
    output (U / N, the sharded gradient: kept), the collective's temporary copy of the input."""
    w.alloc(u, f"reduce-scatter input {name}")
    w.free(grad_bytes, f"unsharded gradients freed {name}")
    w.alloc(u // max(world, 1), f"reduce-scatter output {name}")
    w.transient(int(u * temp), f"reduce-scatter {name}")


def hand_plans(blocks: int, prefetch: int = 1) -> dict[str, FsdpPlan]:
    """torchtitan's hand settings: no AC, full AC, selective per op, every other layer full."""
    other = tuple("full" if i % 2 == 0 else "keep" for i in range(blocks))
    return {
        "none": FsdpPlan.uniform(blocks, "keep", prefetch=prefetch),
        "full": FsdpPlan.uniform(blocks, "full", prefetch=prefetch),
        "selective-op": FsdpPlan.uniform(blocks, "selective", prefetch=prefetch),
        "every-other": FsdpPlan(other, (True,) * blocks, prefetch),
    }


def plan_summary(plans: Sequence[tuple[str, FsdpPlan]], results: Sequence[FsdpResult]) -> str:
    """A small table of plans and their simulated peak and step time."""
    rows = [f"{'plan':<14} {'peak MiB':>10} {'step ms':>9}  settings"]
    for (name, plan), r in zip(plans, results, strict=True):
        rows.append(f"{name:<14} {r.peak_bytes / 2**20:>10.3f} {r.step_ms:>9.3f}  {plan.text()}")
    return "\n".join(rows)
