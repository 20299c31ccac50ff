"""What each pipeline stage costs, read from the graph (planner.sim.pipeline_ranks uses it).

The graph is one micro-batch's training step: a stage's forward time is the sum of compute_ms of
its forward and loss nodes, its backward time that of its backward nodes. The backward splits
into I (input gradient) and W (weight gradients): W is the stage's weight-gradient nodes (the
gradient_node of its trainable parameters, when the graph has model_state), I the rest; with none
identifiable, half and half.

A stage holds the nodes it names by id and every node of its modules (and their submodules);
a node no stage names follows its inputs (`place_the_rest`: a loss outside every module lands on
the last stage). Forward data flows to the same or later stages, gradients to earlier ones.

Memory of a stage (per rank, summed over its stages), as torch.distributed.pipelining allocates
it (torch 2.13, stage.py / schedules.py; measured on CPU in tests/runtime/test_pipeline_buffers.py):
- model state: each parameter's bytes (weights, gradient, optimizer state after ZeRO) go to the
  stage owning its gradient_node, else a node of its module or of the nearest enclosing module
  with nodes (a block-level trace names 'h.0', its parameters 'h.0.attn.qkv'); the rest of the
  fixed bytes (inputs, buffers, unplaced parameters; all without model_state) evenly;
- receive buffers (`buffer_bytes`, per micro-batch, for the whole step): PipelineStage allocates,
  at its first step and for every micro-batch, a buffer for the input it receives from stage - 1
  (`input_bytes`) and one for the gradient of its output from stage + 1; a received input lives
  in its buffer, so it is never charged again;
- kept from a micro-batch's F (`saved_bytes`): the forward storages the stage made that its own
  backward reads, plus what torch keeps to the end of the step (`held_bytes`): the forward
  outputs it sends (the send's work holds them) and its loss;
- under recomputation (a micro-batch in the stage's recompute_microbatches) only `held_bytes`
  from F (the checkpoint's inputs are the receive buffers); B (or I) reruns the forward first
  (forward_ms longer) and holds the rest of saved again until B (or W) ends;
- the input gradient a B (or I) sends (`send_backward_bytes`) from its start to the step's end;
- transient while an F/B/I/W runs: the largest of one node's working bytes (`node_transient_bytes`:
  a forward node its workspace and, unless a backward node keeps it, its output; a backward node
  its output, workspace and the gradients it reads, and a weight gradient added into .grad its
  new tensor: a pipeline runs several micro-batches, so every stage's peak is at one where
  .grad exists already; `MemoryLedger.accumulated_bytes`).
- zero-bubble I/W: what torch keeps from I to W, a split W's reruns (planner.sim.rank_memory).
Boundary bytes: a send from stage s to s+1 carries the forward storages made at stages <= s that
a later stage's forward reads; a gradient send from s to s-1 the backward storages made at >= s
that an earlier stage's backward reads. On a module-level trace (metadata.extra.level 'module',
a module's forward node charged its saved activations) the tensor crossing a cut is sized by the
gradient crossing it back (the module's input gradient has its input's shape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from planner.core.graph import Graph, Phase
from planner.core.pipeline_actions import Partition
from planner.sim.backward_release import backward_transients
from planner.sim.ledger import MemoryLedger
from planner.sim.rank_memory import StageSizes as StageSizes
from planner.sim.rank_memory import kept_bytes as kept_bytes
from planner.sim.rank_memory import microbatch_count as microbatch_count
from planner.sim.rank_memory import one_stage_peak_bytes as one_stage_peak_bytes
from planner.sim.rank_memory import rank_base_bytes as rank_base_bytes
from planner.sim.rank_memory import rank_peak_bytes as rank_peak_bytes
from planner.sim.rank_memory import rank_start_bytes as rank_start_bytes
from planner.sim.rank_memory import released_bytes as released_bytes
from planner.sim.rank_memory import weight_rerun_residue_bytes
from planner.sim.result import PlanError
from planner.sim.stage_placement import COSTS_KEPT, _forget_oldest, _layout
from planner.sim.stage_placement import MAPS_KEPT as MAPS_KEPT
from planner.sim.stage_placement import place_the_rest as place_the_rest
from planner.sim.stage_placement import stage_of_nodes as stage_of_nodes
from planner.sim.stage_state import stage_model_state_bytes


@dataclass(frozen=True)
class StageCosts:
    """One stage's times (per micro-batch) and sizes; the pipeline partitioners' range costs
    (planner.solvers.pipeline.units.RangeCosts) are the same quantities."""

    forward_ms: float
    backward_ms: float
    backward_input_ms: float
    backward_weight_ms: float
    saved_bytes: int  # kept from F: what its backward reads, and held_bytes
    input_bytes: int  # received from stage - 1 (in torch's receive buffer)
    transient_bytes: int  # while F or B runs (B: less what it freed, planner.sim.backward_release)
    model_state_bytes: int
    send_forward_bytes: int  # to stage + 1
    send_backward_bytes: int  # to stage - 1 (kept from B/I to the step's end)
    held_bytes: int  # of saved_bytes, kept to the step's end: sent outputs and the loss
    buffer_bytes: int  # torch's receive buffers: input and output gradient
    weight_pending_bytes: int  # kept from I to W's end: gradients I stores for W (0: stage 0)
    weight_transient_bytes: int  # transient while W runs (reruns of recomputed units included)
    weight_rerun_bytes: int  # the same for a micro-batch the whole stage recomputes
    first_stage: bool  # torch's I does nothing there; its W runs the whole backward
    input_transient_bytes: int  # while a split I runs (it frees only what W will not read)
    recompute_transient_bytes: int  # while a recomputed micro-batch's B (or I) runs
    # what one checkpoint call keeps from its forward to its backward besides tensors:
    # torch.utils.checkpoint's saved CPU RNG state on a CPU run (`checkpoint_state_bytes`)
    checkpoint_bytes: int

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms


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
    transient_bytes: list[int]  # the largest `node_transient_bytes` of one node
    node_count: list[int]
    flows: list[tuple[Flow, int, int, int, int, int]]
    # (root, its group, reading group): a backward root a weight-gradient node reads from
    weight_reads: list[tuple[int, int, int]]  # another backward node (torch's I keeps it)
    weight_groups: list[set[str]]  # module paths of the parameters whose gradient node it has
    input_reads: list[tuple[int, int, int]]  # and a forward root an input-gradient node reads
    forward_transient_bytes: list[int] = field(default_factory=list)  # of its forward nodes


def stage_sums(graph: Graph, group: Mapping[int, int], count: int) -> StageSums:
    """The sums of `group` (node -> group index < count): the one node rule of stage_costs and
    the partitioners' per-unit tables (planner.solvers.pipeline.units)."""
    ledger = MemoryLedger.of(graph)
    ms, root, succs = ledger.compute_ms, ledger.storage_root, ledger.successors
    out = StageSums([0.0] * count, [0.0] * count, [0.0] * count, [False] * count, [0] * count,
                    [0] * count, [], [], [set() for _ in range(count)], [], [0] * count)
    flows = out.flows
    backward = {n.id for n in graph.nodes if n.phase == Phase.backward}
    grad_nodes = gradient_nodes(graph)
    for p in graph.model_state.parameters if graph.model_state is not None else ():
        g = p.gradient_node
        if p.trainable and g is not None and g in group:
            out.weight_groups[group[g]].add(p.module_path)
    for v in ledger.node_ids:
        s = group[v]
        out.node_count[s] += 1
        back = v in backward
        t = node_transient_bytes(ledger, backward, v)
        out.transient_bytes[s] = max(out.transient_bytes[s], t)
        if not back:
            out.forward_transient_bytes[s] = max(out.forward_transient_bytes[s], t)
        if back:
            out.backward_ms[s] += ms[v]
            if v in grad_nodes:
                out.weight_ms[s] += ms[v]
                out.has_weight[s] = True
                out.weight_reads.extend((root[u], group[root[u]], s)
                                        for u in ledger.predecessors[v]
                                        if u in backward and u not in grad_nodes)
            else:
                out.input_reads.extend((root[u], group[root[u]], s)
                                       for u in ledger.predecessors[v] if u not in backward)
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


CPU_RNG_STATE_BYTES = 5056  # torch.get_rng_state(): the CPU generator's state (mt19937)


def checkpoint_state_bytes(graph: Graph) -> int:
    """What torch.utils.checkpoint keeps per call from its forward to its backward besides
    the tensors it saves: `preserve_rng_state` stores torch.get_rng_state(), 5,056 B of CPU
    memory, device memory on a CPU run (a graph traced or costed on the CPU); on CUDA it is
    host memory (and the CUDA state a small host tensor too): 0. Measured on 2 gloo ranks:
    a rank running 4 checkpointed micro-batches held 4 x 5,056 B more than predicted."""
    profile = str(graph.metadata.device_profile or "")
    return CPU_RNG_STATE_BYTES if profile in ("cpu", "measured:cpu") else 0


def node_transient_bytes(ledger: MemoryLedger, backward: set[int], v: int,
                         received: Callable[[int], bool] | None = None) -> int:
    """What node v adds while its stage's F or B runs, on top of the micro-batch's kept bytes:
    a forward node its workspace and its output unless a backward node reads it (then it is
    kept already); a backward node its output, its workspace and the gradients it reads
    (backward storages, each once), which live while the gradient flows through the stage, and
    the gradient it adds into an existing .grad (`MemoryLedger.accumulating_transient_bytes`).
    A gradient root for which `received(root)` holds came from another stage: it is in torch's
    receive buffer (`buffer_bytes`), charged there (a cut right after an embedding: its
    backward reads nothing else)."""
    root, own = ledger.storage_root, ledger.storage_bytes
    if v not in backward:
        kept = any(w in backward for w in ledger.successors[v])
        return ledger.workspace_bytes[v] + (0 if kept else own[v])
    grads = {root[u] for u in ledger.predecessors[v] if u in backward} - {root[v]}
    if received is not None:
        grads = {r for r in grads if not received(r)}
    return ledger.accumulating_transient_bytes(v) + sum(own[r] for r in grads)


def buffered_gradients(ledger: MemoryLedger, backward: set[int], weight_nodes: set[int],
                       group: Mapping[int, int]) -> set[tuple[int, int]]:
    """(gradient root, group reading it) where the group received it from another group and
    only weight-gradient nodes (or nodes passing no gradient on: a module-level trace's first
    unit) read it there: they read torch's receive buffer, nothing new
    (a cut right after an embedding: measured on 2 gloo ranks, its gradient was charged twice).
    One that an input-gradient node reads stays charged: where autograd passes it on (a
    residual add, an accumulation), torch allocates again (measured at a GPT's block cut)."""
    root = ledger.storage_root
    readers: dict[tuple[int, int], bool] = {}  # (root, reading group) -> only weight nodes
    for v in backward:
        for u in ledger.predecessors[v]:
            r = root[u]
            if u in backward and group[r] != group[v]:
                key = (r, group[v])
                ends = v in weight_nodes or not any(w in backward for w in ledger.successors[v])
                readers[key] = readers.get(key, True) and ends
    return {k for k, only in readers.items() if only}


def is_module_level(graph: Graph) -> bool:
    """A module-level trace: a forward node's bytes are its module's saved activations."""
    return graph.metadata.extra.get("level") == "module"


def loss_roots(graph: Graph) -> set[int]:
    """Storage roots of the loss nodes (torch keeps each micro-batch's loss to the end)."""
    root = graph.index.storage_roots
    return {root[v] for v in graph.index.loss_nodes}


@dataclass(frozen=True)
class Boundary:
    """A stage's (or a range of units') bytes at its cuts, from which its sizes follow
    (`boundary_sizes`): the same rule for stage_costs and the partitioners' range costs."""

    kept: int  # storages made here that its backward reads, sends forward, or its loss
    sent: int  # storages made here crossing the outgoing cut
    loss: int  # loss storages made here and not sent
    forward_in: int  # forward storages crossing the incoming cut
    forward_out: int  # and the outgoing one
    gradient_in: int  # gradients crossing the incoming cut (sent back from here)
    gradient_out: int  # and the outgoing one (received here)


def boundary_sizes(b: Boundary, module_level: bool) -> tuple[int, int, int, int, int]:
    """(saved, held, input, buffer, send_forward) bytes of a stage. The tensors crossing a cut
    are its forward storages, or on a module-level trace the gradients crossing it back."""
    input_bytes = b.gradient_in if module_level else b.forward_in
    out_bytes = b.gradient_out if module_level else b.forward_out
    held = (out_bytes if module_level else b.sent) + b.loss
    return max(b.kept, held), held, input_bytes, input_bytes + b.gradient_out, out_bytes


def stage_costs(graph: Graph, partition: Partition) -> list[StageCosts]:
    """Each stage's costs (memoised on the graph per stage layout)."""
    memo = graph.index.memo.setdefault("stage_costs", {})
    key = _layout(partition)
    if key not in memo:
        _forget_oldest(memo, COSTS_KEPT)
        memo[key] = tuple(_stage_costs(graph, partition))
    return list(memo[key])


def _stage_costs(graph: Graph, partition: Partition) -> list[StageCosts]:
    stage = stage_of_nodes(graph, partition)
    count = partition.stage_count
    sums = stage_sums(graph, stage, count)
    saved: list[set[int]] = [set() for _ in range(count)]  # stage -> its roots its B reads
    cut_f: list[set[int]] = [set() for _ in range(count + 1)]  # cut c: roots into stage c
    cut_b: list[set[int]] = [set() for _ in range(count + 1)]  # cut c: gradients out of c
    for flow, s, t, root, u, v in sums.flows:
        if flow is Flow.saved:
            if stage[root] == t:  # a received root sits in torch's receive buffer
                saved[t].add(root)
        elif flow is Flow.forward:
            if t < s:
                raise _backwards(graph, u, v, s, t, "forward")
            for cut in range(s + 1, t + 1):
                cut_f[cut].add(root)
        else:
            if t > s:
                raise _backwards(graph, u, v, s, t, "backward")
            for cut in range(t + 1, s + 1):
                cut_b[cut].add(root)
    states = stage_model_state_bytes(graph, stage, count)
    ledger = MemoryLedger.of(graph)
    size = ledger.storages_bytes
    backward = {n.id for n in graph.nodes if n.phase == Phase.backward}
    backward_order: list[list[int]] = [[] for _ in range(count)]  # execution order
    for v in graph.index.topological_order:
        if v in backward:
            backward_order[stage[v]].append(v)

    weight_nodes = gradient_nodes(graph)

    in_buffer = buffered_gradients(ledger, backward, weight_nodes, stage)

    def transient_of(v: int) -> int:  # a gradient only weight nodes read is in its buffer
        return node_transient_bytes(ledger, backward, v, lambda r: (r, stage[v]) in in_buffer)
    losses = loss_roots(graph)
    module_level = is_module_level(graph)
    pending: list[set[int]] = [set() for _ in range(count)]  # stage -> gradients I keeps for W
    rerun_read: list[set[int]] = [set() for _ in range(count)]  # stage -> saved roots I reads
    for reads, out_sets in ((sums.weight_reads, pending), (sums.input_reads, rerun_read)):
        for root, made, t in reads:
            if made == t:  # a received root is in its receive buffer
                out_sets[t].add(root)
    out = []
    for s in range(count):
        bwd = sums.backward_ms[s]
        w_ms = backward_weight_ms(bwd, sums.weight_ms[s], sums.has_weight[s])
        sent = {r for r in cut_f[s + 1] if stage[r] == s}
        loss = {r for r in losses if stage[r] == s} - sent
        boundary = Boundary(
            kept=size(saved[s] | sent | loss), sent=size(sent), loss=size(loss),
            forward_in=size(cut_f[s]), forward_out=size(cut_f[s + 1]),
            gradient_in=size(cut_b[s]), gradient_out=size(cut_b[s + 1]),
        )
        kept, held, received, buffers, sent_bytes = boundary_sizes(boundary, module_level)
        released = backward_transients(ledger, backward_order[s], saved[s] - sent - loss,
                                       transient_of)
        forward = sums.forward_transient_bytes[s]
        transient = max(forward, released.joint_bytes)
        unreduced = max(sums.transient_bytes[s], released.unreduced_bytes)
        read = rerun_read[s] & saved[s]
        out.append(
            StageCosts(
                forward_ms=sums.forward_ms[s],
                backward_ms=bwd,
                backward_input_ms=bwd - w_ms,
                backward_weight_ms=w_ms,
                saved_bytes=kept,
                input_bytes=received,
                transient_bytes=transient,
                model_state_bytes=states[s],
                send_forward_bytes=sent_bytes,
                send_backward_bytes=size(cut_b[s]),
                held_bytes=held,
                buffer_bytes=buffers,
                weight_pending_bytes=0 if s == 0 else size(pending[s]),
                # a split I keeps the graph for W (retain_graph): nothing is freed before W
                # ends, so neither gets a credit; the first stage's W is its whole backward
                weight_transient_bytes=transient if s == 0 else unreduced,
                weight_rerun_bytes=unreduced + (
                    0 if s == 0 else weight_rerun_residue_bytes(
                        len(sums.weight_groups[s]), size(read), size(saved[s] - read))),
                first_stage=s == 0,
                input_transient_bytes=transient if s == 0 else unreduced,
                recompute_transient_bytes=unreduced,
                checkpoint_bytes=checkpoint_state_bytes(graph),
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
