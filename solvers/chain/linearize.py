"""graph.json -> a chain of segments, so that the chain solvers apply to any training graph.

Joints are forward nodes that every later forward node depends on only through them (the
definition of `planner.solvers.baselines.cut_points`, without its fallback). Segment i holds the
forward nodes after joint i-1 up to joint i (the last segment ends at the last forward node);
its backward nodes are the backward nodes that read its forward values:

    seg(b) = min(segment of a non-joint forward input, j+1 for an input joint j,
                 seg of a backward input, L)

The chain model needs B_i to read only ā^i, a^{i-1} and δ^i. Where a backward node reads a
forward value of an earlier segment, or a gradient skips a segment, the segments in between
are merged (their joints dropped) until every backward node fits; a graph with no usable joint
becomes a single segment (store-all). Chains longer than MAX_SEGMENTS keep evenly spaced joints.

Side values: a few small forward values read across most of the model (a Llama's rotary cos/sin
and attention mask, computed once and read by every layer) leave no joint after them. When
moving them and their ancestors out of the chain gives more joints, they become the chain's input
a^0: computed first, resident throughout (`input_bytes`), never recomputed.

Stage parameters come from running each operation's actions (`planner.solvers.chain.translate`) on
the
segment alone: x = bytes of the joint, x̄ = bytes F_all leaves resident, temporaries = the
excess of the op's local memory peak over x (F_ck), x̄ (F_all) and δ (B). Forward peaks are then
exact; the backward peak is an upper bound (values freed early inside B only lower it).
Views (alias_of) are counted as their own bytes (0); the simulator remains the judge.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.graph import Graph, Phase
from planner.core.plan import Action
from planner.sim.ledger import MemoryLedger, ViewRule
from planner.sim.ledger_replay import fast_replay
from planner.solvers.baselines import joint_positions
from planner.solvers.chain.layout import ChainLayout
from planner.solvers.chain.model import Chain, Stage
from planner.solvers.chain.sequence import Op, OpKind
from planner.solvers.chain.translate import op_actions
from planner.solvers.order import schedule_order

# The chain DP's tables grow with the square of the segments and its time with the cube
# (200 segments: 1.8 s, 270 MiB; 400: ~14 s, 1 GiB): longer chains merge consecutive segments.
MAX_SEGMENTS = 200
SIDE_MAX_SHARE = 0.02  # side values may hold at most this share of the forward pass's bytes


@dataclass(frozen=True)
class Linearization:
    chain: Chain
    layout: ChainLayout
    joints: tuple[int, ...]  # joint node ids kept (a^1..a^{L-1})
    candidate_joints: int  # joints before merging
    non_recomputable: tuple[int, ...]  # forward nodes that must not run twice


def linearize(graph: Graph, max_segments: int = MAX_SEGMENTS) -> Linearization:
    """`max_segments`: longer chains merge consecutive segments (evenly spaced joints)."""
    index = graph.index
    order = schedule_order(graph)
    forward = [v for v in order if index.node(v).phase is not Phase.backward]
    backward = [v for v in order if index.node(v).phase is Phase.backward]
    side = _side_values(graph, forward)
    if side:
        kept = set(side)
        forward = [v for v in forward if v not in kept]
    candidates = joint_positions(graph, forward)
    cuts = list(candidates)
    while True:
        seg_fwd, joint_seg, seg_bwd, to_drop = _assign(graph, forward, backward, cuts)
        if not to_drop and len(cuts) < max_segments:
            break
        cuts = [c for c in cuts if forward[c] not in to_drop]
        if len(cuts) >= max_segments:  # evenly spaced joints: consecutive segments merged
            step = len(cuts) / max_segments
            cuts = sorted({cuts[int(k * step)] for k in range(max_segments - 1)})
    length = len(cuts) + 1
    joint_nodes = [forward[c] for c in cuts] + [forward[-1]]
    segments: list[list[int]] = [[] for _ in range(length + 1)]
    for v in forward:
        segments[seg_fwd[v]].append(v)
    bwd_lists: list[list[int]] = [[] for _ in range(length + 1)]
    for b in backward:
        bwd_lists[seg_bwd[b]].append(b)
    succs, preds = index.successors, index.predecessors
    saved: list[frozenset[int]] = [frozenset()]
    grad_out: list[frozenset[int]] = [frozenset()]
    for i in range(1, length + 1):
        members = set(bwd_lists[i])
        kept = {p for b in members for p in preds[b] if seg_fwd.get(p) == i}
        saved.append(frozenset(kept | {joint_nodes[i - 1]}))
        grad_out.append(
            frozenset(b for b in members if any(seg_bwd.get(w, i) < i for w in succs[b]))
        )
    layout = ChainLayout(
        forward=((),) + tuple(tuple(s) for s in segments[1:]),
        ck_forward=((),) + tuple(tuple(s) for s in segments[1:]),
        joint=(tuple(side),) + tuple((j,) for j in joint_nodes),
        saved=tuple(saved),
        backward=((),) + tuple(tuple(b) for b in bwd_lists[1:]),
        grad_out=tuple(grad_out),
    )
    chain = chain_of_layout(graph, layout)
    fixed = [v for v in forward if not index.node(v).recomputable]
    return Linearization(
        chain=chain,
        layout=layout,
        joints=tuple(joint_nodes[:-1]),
        candidate_joints=len(candidates),
        non_recomputable=tuple(fixed),
    )


def _side_values(graph: Graph, forward: list[int]) -> list[int]:
    """Forward values read more than a quarter of the forward pass later, with their forward
    ancestors, in order: kept only when they are small (≤ SIDE_MAX_SHARE of the forward bytes)
    and taking them out at least doubles the joints."""
    if len(forward) < 16:
        return []
    index = graph.index
    pos = {v: i for i, v in enumerate(forward)}
    reach = len(forward) // 4
    far = [v for v in forward
           if max((pos[w] for w in index.successors[v] if w in pos), default=pos[v]) - pos[v]
           > reach]
    if not far:
        return []
    closure: set[int] = set()
    stack = list(far)
    while stack:
        v = stack.pop()
        if v in closure:
            continue
        closure.add(v)
        stack.extend(u for u in index.predecessors[v] if u in pos and u not in closure)
    size = index.storage_bytes
    total = sum(size[v] for v in forward)
    if sum(size[v] for v in closure) > SIDE_MAX_SHARE * total:
        return []
    rest = [v for v in forward if v not in closure]
    if len(rest) < 2:
        return []
    before, after = len(joint_positions(graph, forward)), len(joint_positions(graph, rest))
    if after < max(2 * before, before + 2):
        return []
    return [v for v in forward if v in closure]


def _assign(
    graph: Graph, forward: list[int], backward: list[int], cuts: list[int]
) -> tuple[dict[int, int], dict[int, int], dict[int, int], set[int]]:
    """Segments of forward and backward nodes for these cuts, and the joints to drop."""
    preds = graph.index.predecessors
    length = len(cuts) + 1
    seg_fwd: dict[int, int] = {}
    joint_seg: dict[int, int] = {}  # joint node -> j (it is a^j)
    seg, cut_set = 1, set(cuts)
    for pos, v in enumerate(forward):
        seg_fwd[v] = seg
        if pos in cut_set:
            joint_seg[v] = seg
            seg += 1
    joint_of = {j: forward[c] for j, c in enumerate(cuts, start=1)}  # a^j -> node
    seg_bwd: dict[int, int] = {}
    drop: set[int] = set()

    def merge(lo: int, hi: int) -> None:
        """Merge segments lo..hi into one: drop joints a^lo .. a^{hi-1}."""
        drop.update(joint_of[j] for j in range(lo, hi))

    for b in backward:
        s = length
        for p in preds[b]:
            if p in joint_seg:
                s = min(s, joint_seg[p] + 1)
            elif p in seg_fwd:
                s = min(s, seg_fwd[p])
            elif p in seg_bwd:
                s = min(s, seg_bwd[p])
        seg_bwd[b] = s
        for p in preds[b]:
            if p in joint_seg and joint_seg[p] > s:
                merge(s, joint_seg[p])  # reads a^j, j > s: merge s..j so that a^j is its input
            elif p in seg_fwd and p not in joint_seg and seg_fwd[p] > s:
                merge(s, seg_fwd[p])
            elif p in seg_bwd and seg_bwd[p] > s + 1:
                merge(s + 1, seg_bwd[p])  # a gradient skipping segments
    return seg_fwd, joint_seg, seg_bwd, drop


def _profile(graph: Graph, actions: list[Action]) -> tuple[int, int]:
    """(peak, end) of live bytes relative to before the actions (values freed count negative):
    the memory ledger's live set from 0 bytes, each value its own storage (ViewRule.own_storage)
    and held bytes left out (the chain charges them for the whole step)."""
    # the fast replay: it knows which outputs of multi-output ops live from the op on
    figures = fast_replay(MemoryLedger.of(graph), actions, ViewRule.own_storage, False,
                          start_bytes=0, with_held=False)
    return figures.peak_bytes, figures.end_bytes


def chain_of_layout(graph: Graph, layout: ChainLayout) -> Chain:
    ledger = MemoryLedger.of(graph)
    size = ledger.storage_bytes
    stages: list[Stage] = []
    for i in range(1, layout.length + 1):
        x = sum(size[v] for v in layout.joint[i])
        xbar = sum(size[v] for v in layout.saved[i])
        grad = sum(size[v] for v in layout.grad_out[i])
        ck_peak, _ = _profile(graph, op_actions(graph, layout, Op(OpKind.f_ck, i)))
        all_peak, _ = _profile(graph, op_actions(graph, layout, Op(OpKind.f_all, i)))
        b_peak, _ = _profile(graph, op_actions(graph, layout, Op(OpKind.backward, i)))
        stages.append(
            Stage(
                forward_ms=sum(ledger.compute_ms[v] for v in layout.forward[i]),
                backward_ms=sum(ledger.compute_ms[v] for v in layout.backward[i]),
                output_bytes=x,
                saved_bytes=xbar,
                forward_tmp_bytes=max(0, ck_peak - x),
                forward_all_tmp_bytes=max(0, all_peak - xbar),
                backward_tmp_bytes=max(0, b_peak - grad),
                grad_input_bytes=grad,
                name=f"segment{i}",
            )
        )
    # Conservative on purpose: bytes held from a node's first computation on (gradient buffers,
    # gradient_lifetime 'backward') are charged for the whole step, as the chain model has no
    # notion of memory that appears mid-step. The model's peak is then >= the simulator's.
    return Chain(
        stages=tuple(stages),
        input_bytes=sum(size[v] for v in layout.joint[0]),
        fixed_bytes=ledger.end_bytes,
        name=graph.metadata.model_name or "linearized",
    )
