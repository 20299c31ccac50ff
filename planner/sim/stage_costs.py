"""What each pipeline stage costs, read from the graph (planner.sim.pipeline_ranks uses it).

The graph is one micro-batch's training step: a stage's forward time is the sum of compute_ms of
its forward and loss nodes, its backward time that of its backward nodes. The backward splits
into I (input gradient) and W (weight gradients): W is the stage's weight-gradient nodes (the
gradient_node of its trainable parameters, when the graph has model_state), I the rest; with none
identifiable, half and half.

A stage holds the nodes it names by id and every node of its modules (and their submodules);
a node no stage names follows its inputs (see `place_the_rest`), so a loss outside every module
lands on the last stage. Forward data must flow to the same or later stages, gradients to the
same or earlier ones.

Memory of a stage (per rank, summed over its stages):
- model state: each parameter's bytes (weights, gradient, optimizer state after ZeRO; whatever
  the gradient lifetime) go to the stage that owns its gradient_node, else a node of its module
  or of the nearest enclosing module that has nodes (a block-level trace names 'h.0', its
  parameters 'h.0.attn.qkv');
  the rest of the step's fixed bytes (inputs, buffers, unplaced parameters; the whole fixed bytes
  without model_state) is split evenly over the stages;
- saved activations per in-flight micro-batch: every forward/loss storage that a backward node
  of the stage reads, plus the boundary storages it receives from earlier stages and reads
  (torch's PipelineStage keeps a micro-batch's inputs until its backward);
- under recomputation (a micro-batch in the stage's recompute_microbatches) only the received
  input bytes are kept from F to B; the backward first reruns the forward (B and I take
  forward_ms longer) and holds the saved bytes again until the backward (with I/W: the W) ends;
- transient while an F/B/I/W runs: the largest output + workspace of one node of the stage
  (`MemoryLedger.transient_bytes`; every per-node byte fact here is the ledger's).
Boundary bytes: a send from stage s to s+1 carries every forward storage made at stages <= s and
read by a forward node of a later stage; a gradient send from s to s-1 every backward storage
made at stages >= s and read by a backward node of an earlier stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from planner.core.graph import Graph, Phase
from planner.core.model_state import ParameterState, StateBytes
from planner.core.pipeline_actions import Partition, PipelineAction, PipelineOp
from planner.sim.ledger import MemoryLedger
from planner.sim.result import PlanError


@dataclass(frozen=True)
class StageCosts:
    """One stage's times (per micro-batch) and sizes; the pipeline partitioners' range costs
    (planner.solvers.pipeline.units.RangeCosts) are the same quantities."""

    forward_ms: float
    backward_ms: float
    backward_input_ms: float
    backward_weight_ms: float
    saved_bytes: int
    input_bytes: int  # received from earlier stages and read here: kept under recomputation
    transient_bytes: int
    model_state_bytes: int
    send_forward_bytes: int  # to stage + 1
    send_backward_bytes: int  # to stage - 1

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms


class StageSizes(Protocol):
    """What a stage holds (StageCosts, and the partitioners' RangeCosts)."""

    @property
    def saved_bytes(self) -> int: ...
    @property
    def input_bytes(self) -> int: ...
    @property
    def transient_bytes(self) -> int: ...
    @property
    def model_state_bytes(self) -> int: ...


# -- the memory rules of a pipeline rank (planner.sim.pipeline_ranks replays them in time) ------
def kept_bytes(sizes: StageSizes, recomputed: bool) -> int:
    """What a micro-batch keeps from its F to its backward: the saved activations, or only the
    received input when the stage recomputes it."""
    return sizes.input_bytes if recomputed else sizes.saved_bytes


def rank_base_bytes(sizes: Sequence[StageSizes], stage_rank_of: Sequence[int], rank: int) -> int:
    """A rank's model state: the sum over its stages."""
    return sum(c.model_state_bytes for s, c in enumerate(sizes) if stage_rank_of[s] == rank)


def one_stage_peak_bytes(sizes: StageSizes, inflight: int, stored: int | None = None) -> int:
    """Peak of a rank running this stage alone with `inflight` micro-batches holding
    activations, `stored` of them in full (None: all; the others recomputed): exact without
    recomputation, else an upper bound counting the rematerialised bytes once on top."""
    k = inflight
    q = k if stored is None else min(stored, k)
    extra = sizes.saved_bytes - kept_bytes(sizes, True) if q < k else 0
    return (sizes.model_state_bytes + q * kept_bytes(sizes, False)
            + (k - q) * kept_bytes(sizes, True) + extra + sizes.transient_bytes)


def rank_peak_bytes(
    lists: Sequence[Sequence[PipelineAction]],
    stage_rank_of: Sequence[int],
    sizes: Sequence[StageSizes],
    recompute: Sequence[frozenset[int]],
) -> list[int]:
    """Each rank's peak as planner.sim.pipeline_ranks counts it, from list order alone (a rank's
    memory changes only at its own actions): model state, `kept_bytes` per micro-batch from F,
    the rest of saved from a recomputing B/I, a stage's transient while its compute runs, the
    saved bytes released when B (or W) ends."""
    peaks = []
    for rank, row in enumerate(lists):
        live = peak = rank_base_bytes(sizes, stage_rank_of, rank)
        for a in row:
            c = sizes[a.stage_index]
            again = a.microbatch_index in recompute[a.stage_index]
            if a.op is PipelineOp.forward:
                live += kept_bytes(c, again)
            elif a.op in _GRADIENT_OPS and again:
                live += c.saved_bytes - kept_bytes(c, again)
            if a.is_compute:
                peak = max(peak, live + c.transient_bytes)
            if a.op in _RELEASING_OPS:
                live -= c.saved_bytes
        peaks.append(peak)
    return peaks


_GRADIENT_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_input})
_RELEASING_OPS = frozenset({PipelineOp.backward, PipelineOp.backward_weight})


def stage_of_nodes(graph: Graph, partition: Partition) -> dict[int, int]:
    """Node id -> stage index: the stage naming it (by id or module; two: PlanError naming the
    node), else where its inputs are (`place_the_rest`)."""
    out: dict[int, int] = {}
    for s in partition.stages:
        mods = tuple(s.modules)
        for v in s.nodes:
            if v not in graph.index.position:
                raise PlanError(
                    f"partition: stage {s.stage_index} names node {v}, not in the graph", node=v
                )
            _assign(graph, out, v, s.stage_index)
        if mods:
            for n in graph.nodes:
                p = n.module_path
                inside = any(p == m or p.startswith(m + ".") for m in mods)
                if inside and out.get(n.id) != s.stage_index:
                    _assign(graph, out, n.id, s.stage_index)
    place_the_rest(graph, out, partition.stage_count - 1)
    return out


def place_the_rest(graph: Graph, out: dict[int, int], last: int) -> None:
    """Nodes no stage names (e.g. a loss outside every module) follow their inputs: a forward
    node goes to the latest stage among its inputs (0 without inputs), a backward node to the
    earliest stage among its backward inputs (else the latest among its inputs; the last stage
    without inputs)."""
    index = graph.index
    for v in index.topological_order:
        if v in out:
            continue
        preds = index.predecessors[v]
        if index.node(v).phase != Phase.backward:
            out[v] = max((out[u] for u in preds), default=0)
            continue
        grads = [out[u] for u in preds if index.node(u).phase == Phase.backward]
        out[v] = min(grads) if grads else max((out[u] for u in preds), default=last)


def _assign(graph: Graph, out: dict[int, int], v: int, stage: int) -> None:
    if v in out and out[v] != stage:
        raise PlanError(
            f"partition: {graph.describe(v)} is in stages {out[v]} and {stage}", node=v
        )
    out[v] = stage


class Flow(IntEnum):
    """What an edge between two groups of nodes (stages, units) carries."""

    saved = 0  # forward data a backward node reads (kept per micro-batch)
    forward = 1  # forward data read by a forward node of another group
    backward = 2  # a gradient read in another group


@dataclass
class StageSums:
    """Per group (stage, or a chain's unit) what its nodes add up to, from the ledger's
    per-node facts, and the data flows between groups: (flow, source group, target group,
    storage root, source node, target node), in node order (the first wrong-way flow is the
    one reported)."""

    forward_ms: list[float]
    backward_ms: list[float]
    weight_ms: list[float]  # its weight-gradient nodes' time
    has_weight: list[bool]
    transient_bytes: list[int]  # the largest `MemoryLedger.transient_bytes` of one node
    node_count: list[int]
    flows: list[tuple[Flow, int, int, int, int, int]]


def stage_sums(graph: Graph, group: Mapping[int, int], count: int) -> StageSums:
    """The sums of `group` (node -> group index < count): the one node rule of stage_costs and
    the partitioners' per-unit tables (planner.solvers.pipeline.units)."""
    ledger = MemoryLedger.of(graph)
    ms, root, succs = ledger.compute_ms, ledger.storage_root, ledger.successors
    out = StageSums([0.0] * count, [0.0] * count, [0.0] * count, [False] * count, [0] * count,
                    [0] * count, [])
    flows = out.flows
    backward = {n.id for n in graph.nodes if n.phase == Phase.backward}
    grad_nodes = gradient_nodes(graph)
    for v in ledger.node_ids:
        s = group[v]
        out.node_count[s] += 1
        out.transient_bytes[s] = max(out.transient_bytes[s], ledger.transient_bytes(v))
        back = v in backward
        if back:
            out.backward_ms[s] += ms[v]
            if v in grad_nodes:
                out.weight_ms[s] += ms[v]
                out.has_weight[s] = True
        else:
            out.forward_ms[s] += ms[v]
        r = root[v]
        for w in succs[v]:
            t = group[w]
            if not back and w in backward:
                flows.append((Flow.saved, s, t, r, v, w))
            elif t != s:
                flows.append((Flow.backward if back else Flow.forward, s, t, r, v, w))
    return out


def stage_costs(graph: Graph, partition: Partition) -> list[StageCosts]:
    stage = stage_of_nodes(graph, partition)
    count = partition.stage_count
    sums = stage_sums(graph, stage, count)
    saved: list[set[int]] = [set() for _ in range(count)]
    received: list[set[int]] = [set() for _ in range(count)]
    send_f: list[set[int]] = [set() for _ in range(count)]
    send_b: list[set[int]] = [set() for _ in range(count)]
    for flow, s, t, root, u, v in sums.flows:
        if flow is Flow.saved:
            saved[t].add(root)
        elif flow is Flow.forward:
            if t < s:
                raise _backwards(graph, u, v, s, t, "forward")
            received[t].add(root)
            for cut in range(s, t):
                send_f[cut].add(root)
        else:
            if t > s:
                raise _backwards(graph, u, v, s, t, "backward")
            for cut in range(t + 1, s + 1):
                send_b[cut].add(root)
    states = _model_state_bytes(graph, stage, count)
    size = MemoryLedger.of(graph).storages_bytes
    out = []
    for s in range(count):
        bwd = sums.backward_ms[s]
        w_ms = backward_weight_ms(bwd, sums.weight_ms[s], sums.has_weight[s])
        out.append(
            StageCosts(
                forward_ms=sums.forward_ms[s],
                backward_ms=bwd,
                backward_input_ms=bwd - w_ms,
                backward_weight_ms=w_ms,
                saved_bytes=size(saved[s] | received[s]),
                input_bytes=size(received[s]),
                transient_bytes=sums.transient_bytes[s],
                model_state_bytes=states[s],
                send_forward_bytes=size(send_f[s]),
                send_backward_bytes=size(send_b[s]),
            )
        )
    return out


def _backwards(graph: Graph, u: int, v: int, s: int, t: int, phase: str) -> PlanError:
    return PlanError(
        f"partition: {phase} data flows from {graph.describe(u)} (stage {s}) to "
        f"{graph.describe(v)} (stage {t}): the stages must follow the {phase} pass",
        node=v,
    )


def backward_weight_ms(backward_ms: float, weight_nodes_ms: float, has_weight: bool) -> float:
    """W's share of a backward: its weight-gradient nodes' time; none identifiable: half."""
    return weight_nodes_ms if has_weight else backward_ms / 2


def gradient_nodes(graph: Graph) -> set[int]:
    """The gradient nodes of the trainable parameters (their W work)."""
    ms = graph.model_state
    if ms is None:
        return set()
    return {p.gradient_node for p in ms.parameters if p.trainable and p.gradient_node is not None}


def _enclosing_stage(module_stage: dict[str, int], module_path: str) -> int | None:
    """The stage of `module_path`'s nodes, else of its nearest enclosing module with nodes."""
    if module_path in module_stage:
        return module_stage[module_path]
    path = module_path.rpartition(".")[0]
    while path:
        if path in module_stage:
            return module_stage[path]
        path = path.rpartition(".")[0]
    return None


def parameter_stages(
    graph: Graph, stage: dict[int, int]
) -> Iterator[tuple[ParameterState, StateBytes, int | None]]:
    """Each parameter, its bytes and its stage (or any grouping of nodes, such as a chain's
    units): that of its gradient node, else of its module (or the nearest enclosing module with
    nodes); None: placed nowhere."""
    ms = graph.model_state
    if ms is None:
        return
    module_stage: dict[str, int] = {}
    for n in graph.nodes:
        module_stage.setdefault(n.module_path, stage[n.id])
    for p, b in ms.per_parameter():
        s = stage.get(p.gradient_node) if p.gradient_node is not None else None
        if s is None:
            s = _enclosing_stage(module_stage, p.module_path)
        yield p, b, s


def model_state_per_stage(graph: Graph, stage: dict[int, int], count: int) -> list[StateBytes]:
    """Each stage's placed model state (`parameter_stages`); unplaced parameters nowhere."""
    placed = [StateBytes() for _ in range(count)]
    for _, b, s in parameter_stages(graph, stage):
        if s is not None:
            placed[s] = placed[s] + b
    return placed


def unplaced_fixed_bytes(graph: Graph, placed_bytes: int) -> int:
    """The step's fixed bytes that no stage owns (inputs, buffers, unplaced parameters; all of
    them without model_state), given the model state placed on stages."""
    return max(0, MemoryLedger.of(graph).end_bytes - placed_bytes)


def even_share_bytes(rest_bytes: int, stage_index: int, stage_count: int) -> int:
    """Stage `stage_index`'s even share of `rest_bytes` (the first stages take the remainder)."""
    return rest_bytes // stage_count + (1 if stage_index < rest_bytes % stage_count else 0)


def _model_state_bytes(graph: Graph, stage: dict[int, int], count: int) -> list[int]:
    placed = [b.total_bytes for b in model_state_per_stage(graph, stage, count)]
    rest = unplaced_fixed_bytes(graph, sum(placed))
    return [placed[s] + even_share_bytes(rest, s, count) for s in range(count)]
