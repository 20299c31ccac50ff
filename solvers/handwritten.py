"""What users write by hand, as planning methods and as candidates of `auto`.

- `checkpoint-blocks`: `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`
  around every k-th block (torchtitan's `ac_freq`: the k-th, 2k-th, ... block, counted from 1).
  A checkpointed block's inputs are saved, its ops run in the forward without keeping
  anything for the backward, and are recomputed in the backward when the block's gradients
  first need them; a recomputed value is freed after its last backward use. Values leaving
  the block (its output) and everything outside checkpointed blocks are stored as eager does.
- `selective-matmul`: torchtitan's `op` selective activation checkpointing inside every
  block: the outputs of matmul-like ops (mm, addmm, bmm, linear, convolution, the attention
  kernels) are saved, everything else (pointwise ops, norms, dropout with its RNG replayed)
  is recomputed in the backward; `every_other` saves only the 1st, 3rd, ... matmul of each
  block (torchtitan's "save every other mm"; attention kernels are always saved). Without
  numbered blocks the whole forward is the one region.

Blocks come from `module_path`: the prefix P whose numbered children `P.0`, `P.1`, ... (at
least two) hold the most forward ops; on a tie the shorter prefix (GPT: `h`, not
`h.0.mlp`, a Sequential inside each block; Llama: `model.layers`). The option `prefix` names
it instead. A forward op belongs to block N when its module path is `P.N` or below it.

Both policies are a set of kept values for the one schedule builder every baseline uses
(`baselines.checkpoint_schedule`, in Chen's segment form: a value recomputed for the backward
stays until its last consumer), so the plan is judged by the simulator like any other. The
builder recomputes a block's values when the backward first needs each of them rather than
all at the block's first unpack as torch does; a block's values form a chain, so the first
need recomputes nearly all of them, and later ones never raise the peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.core.errors import InputError
from planner.core.graph_parts import Edge, Phase
from planner.core.plan import Action, PlanStatus
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option, read_options

if TYPE_CHECKING:  # the graph code loads when a method runs: listing the specs needs none
    from planner.core.graph import Graph

__all__ = ["SPECS", "Blocks", "checkpoint_blocks_plan", "find_blocks", "handwritten_plans",
           "is_matmul", "selective_matmul_plan"]

# Matmul-like ops whose outputs torchtitan's op policy saves (its _save_list holds aten.mm and
# the attention kernels; addmm, bmm, linear and convolution are the same kind of work here).
MATMUL_OPS = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
    "aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d",
})
ATTENTION_PREFIXES = ("aten._scaled_dot_product_", "aten.scaled_dot_product_attention",
                      "aten._flash_attention_forward", "aten._efficient_attention_forward")
AUTO_EVERY = (1, 2, 3, 4)  # checkpoint-blocks variants auto tries (where there are that many)


@dataclass(frozen=True)
class Blocks:
    """The numbered blocks under `prefix`: block i's forward ops, in block-number order."""

    prefix: str
    numbers: list[int]
    members: list[list[int]]

    def block_of(self, chosen: Iterable[int]) -> dict[int, int]:
        """node -> its block's position, for the blocks at positions `chosen`."""
        return {v: i for i in chosen for v in self.members[i]}


def _op_name(op: str) -> str:
    return op.removesuffix(".default")


def is_attention(op: str) -> bool:
    return _op_name(op).startswith(ATTENTION_PREFIXES)


def is_matmul(op: str) -> bool:
    """A matmul-like op (attention kernels included): what the selective policy saves."""
    return _op_name(op) in MATMUL_OPS or is_attention(op)


def _forward_ids(graph: Graph) -> list[int]:
    return [n.id for n in graph.nodes if n.phase is Phase.forward]


def _numbered(path: str) -> Iterable[tuple[str, int]]:
    """(prefix, number) for each numbered part of a module path: 'h.0.mlp.2' gives
    ('h', 0) and ('h.0.mlp', 2)."""
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            yield ".".join(parts[:i]), int(part)


def find_blocks(graph: Graph, prefix: str | None = None) -> Blocks | None:
    """The graph's numbered blocks (see the module docstring); None when it has none.
    InputError when `prefix` is given and names no numbered children."""
    index = graph.index
    groups: dict[str, dict[int, list[int]]] = {}
    for v in _forward_ids(graph):
        for p, number in _numbered(index.node(v).module_path):
            groups.setdefault(p, {}).setdefault(number, []).append(v)
    if prefix is not None:
        found = groups.get(prefix.strip("."))
        if not found:
            known = sorted(p for p, g in groups.items() if len(g) >= 2)[:5]
            raise InputError(
                f"no forward op has a module path '{prefix}.<number>'; numbered blocks in this "
                f"graph: {', '.join(repr(p) for p in known) or 'none'}", field="options.prefix")
        chosen = prefix.strip(".")
    else:
        candidates = [(-sum(map(len, g.values())), p.count(".") + bool(p), p)
                      for p, g in groups.items() if len(g) >= 2]
        if not candidates:
            return None
        chosen = min(candidates)[2]
    numbered = groups[chosen]
    numbers = sorted(numbered)
    return Blocks(chosen, numbers, [numbered[k] for k in numbers])


def _keep_set(graph: Graph, block_of: dict[int, int], saved_inside: set[int]) -> set[int]:
    """Every value except those inside a region (`block_of`: node -> region) that are neither
    in `saved_inside` nor read by a forward op outside their region (its output, the next
    block's input, which eager keeps too)."""
    succs, node = graph.index.successors, graph.index.node
    keep = set()
    for n in graph.nodes:
        v = n.id
        region = block_of.get(v)
        if (region is None or v in saved_inside or any(
                block_of.get(w) != region and node(w).phase is not Phase.backward
                for w in succs[v])):
            keep.add(v)
    return keep


def _with_lifetimes(graph: Graph, regions: list[list[int]], block_of: dict[int, int],
                    keep: set[int]) -> Graph:
    """The graph with edges that say how long torch keeps what a region's recomputation
    reads, for the schedule builder (which keeps a value until its last consumer): each
    dropped value the backward reads gets an edge to the region's first backward reader, so
    that the whole region is recomputed there, as torch recomputes a checkpoint at its first
    unpack; a value saved inside the region (a matmul output) stays until then, as in SAC's
    cache; an input of the region until the region's last backward reader, as the checkpoint
    frame holds its inputs until its last saved tensor is used. The plan is judged on the
    graph itself."""
    from planner.solvers.order import schedule_order

    index = graph.index
    preds, succs, node = index.predecessors, index.successors, index.node
    order = schedule_order(graph)
    pos = {v: i for i, v in enumerate(order)}
    extra: set[tuple[int, int]] = set()
    for region, members in enumerate(regions):
        dropped = [x for x in members if x not in keep]
        readers = [pos[w] for x in dropped for w in succs[x] if node(w).phase is Phase.backward]
        if not readers:
            continue
        first, last = order[min(readers)], order[max(readers)]
        for x in dropped:
            if any(node(w).phase is Phase.backward for w in succs[x]):
                extra.add((x, first))
            for u in preds[x]:
                if u in keep:
                    extra.add((u, first if block_of.get(u) == region else last))
    edges = [Edge(source=u, target=w) for u, w in sorted(extra)
             if pos[u] < pos[w] and w not in succs[u]]
    return graph.model_copy(update={"edges": [*graph.edges, *edges], "order": order})


def _policy_schedule(graph: Graph, regions: list[list[int]], saved: set[int],
                     deadline: float | None) -> list[Action]:
    """The shared schedule builder's plan for regions recomputed in the backward, keeping
    `saved` inside them and everything outside them."""
    from planner.solvers.baselines import checkpoint_schedule

    block_of = {v: i for i, members in enumerate(regions) for v in members}
    keep = _keep_set(graph, block_of, saved)
    view = _with_lifetimes(graph, regions, block_of, keep)
    return checkpoint_schedule(view, keep, retain_recomputed=True, deadline=deadline)


def checkpoint_blocks_plan(graph: Graph, blocks: Blocks, every: int = 1, *,
                           deadline: float | None = None) -> list[Action]:
    """torch's checkpoint around the every-th block (positions every-1, 2·every-1, ...)."""
    if every < 1:
        raise InputError(f"every={every}: must be an integer ≥ 1", field="options.every")
    chosen = [blocks.members[i] for i in range(len(blocks.members)) if (i + 1) % every == 0]
    return _policy_schedule(graph, chosen, set(), deadline)


def saved_matmuls(graph: Graph, members: list[int], every_other: bool) -> set[int]:
    """The values torchtitan's op policy saves in one block: matmul outputs (with
    `every_other` the 1st, 3rd, ... matmul in forward order; attention kernels always) and
    the tuple elements (getitem) of a saved op."""
    index = graph.index
    position = index.position
    saved: set[int] = set()
    count = 0
    for v in sorted(members, key=position.__getitem__):
        n = index.node(v)
        if is_matmul(n.op):
            if is_attention(n.op):
                saved.add(v)
                continue
            count += 1
            if not every_other or count % 2 == 1:
                saved.add(v)
        elif n.op == "getitem" and any(u in saved for u in index.predecessors[v]):
            saved.add(v)
    return saved


def selective_matmul_plan(graph: Graph, blocks: Blocks | None, every_other: bool = False, *,
                          deadline: float | None = None) -> list[Action]:
    """torchtitan's op-level selective checkpointing in every block (no blocks: the whole
    forward as one)."""
    regions = blocks.members if blocks is not None else [_forward_ids(graph)]
    saved: set[int] = set()
    for members in regions:
        saved |= saved_matmuls(graph, members, every_other)
    return _policy_schedule(graph, regions, saved, deadline)


def handwritten_plans(graph: Graph, deadline: float | None = None
                      ) -> list[tuple[str, list[Action]]]:
    """(name, plan) of each hand-written policy auto tries: checkpoint-blocks with every
    AUTO_EVERY (up to the number of blocks), selective-matmul with and without every_other;
    none on a graph without numbered blocks or backward. Built once per graph (memo); what is
    unfinished at `deadline` is left out (and not remembered)."""
    memo = graph.index.memo
    if "handwritten_plans" in memo:
        plans: list[tuple[str, list[Action]]] = memo["handwritten_plans"]
        return plans
    blocks = find_blocks(graph)
    if blocks is None or not any(n.phase is Phase.backward for n in graph.nodes):
        memo["handwritten_plans"] = []
        return []
    plans = []
    complete = True
    makers = [(f"checkpoint-blocks:every={k}",
               lambda k=k: checkpoint_blocks_plan(graph, blocks, k, deadline=deadline))
              for k in AUTO_EVERY if k <= len(blocks.members)]
    from planner.solvers.baselines import ScheduleAbandoned

    makers += [(f"selective-matmul{':every_other' if other else ''}",
                lambda other=other: selective_matmul_plan(graph, blocks, other,
                                                          deadline=deadline))
               for other in (False, True)]
    for name, make in makers:
        if deadline is not None and time.perf_counter() > deadline:
            complete = False
            break
        try:
            plans.append((name, make()))
        except ScheduleAbandoned:
            complete = False
    if complete:
        memo["handwritten_plans"] = plans
    return plans


# -- the methods -----------------------------------------------------------------------------
PREFIX_HELP = ("module path of the numbered blocks, e.g. 'h' or 'model.layers' (null: the "
               "prefix whose numbered children hold the most forward ops)")


@dataclass(frozen=True)
class BlockOptions:
    every: int = option(1, "checkpoint every k-th block (the k-th, 2k-th, ... counted from 1, "
                        "as torchtitan's ac_freq)", minimum=1)
    prefix: str | None = option(None, PREFIX_HELP)


@dataclass(frozen=True)
class SelectiveOptions:
    every_other: bool = option(False, "save only every other matmul of each block (the 1st, "
                               "3rd, ...; attention kernels always), as torchtitan's op policy")
    prefix: str | None = option(None, PREFIX_HELP)


def _result(graph: Graph, make: Callable[[], list[Action]], details: dict[str, Any]
            ) -> MethodResult:
    from planner.solvers.baselines import ScheduleAbandoned

    try:
        actions = make()
    except ScheduleAbandoned as e:
        return MethodResult(actions=None, status=PlanStatus.timeout, backend="handwritten",
                            notes=[f"schedule not built within the time limit ({e})"])
    # The graph's total compute (every node once) bounds every plan's cost from below.
    return MethodResult(actions=actions, status=PlanStatus.feasible, backend="handwritten",
                        lower_bound=graph.total_compute_ms, details=details)


def checkpoint_blocks(request: SolveRequest) -> MethodResult:
    """torch.utils.checkpoint around every k-th numbered block (see the module docstring)."""
    graph = request.graph
    options = read_options(BlockOptions, request.options)
    blocks = find_blocks(graph, options.prefix)
    if blocks is None:
        raise InputError("checkpoint-blocks: no module path has numbered children (such as "
                         "'h.0', 'layers.1'); name the blocks with option prefix, or use "
                         "another method", field="options.prefix")
    deadline = time.perf_counter() + request.time_limit_s
    checkpointed = len(blocks.members) // options.every
    details = {"prefix": blocks.prefix, "blocks": len(blocks.members),
               "checkpointed_blocks": checkpointed}
    return _result(graph, lambda: checkpoint_blocks_plan(graph, blocks, options.every,
                                                         deadline=deadline), details)


def selective_matmul(request: SolveRequest) -> MethodResult:
    """torchtitan's op-level selective checkpointing (see the module docstring)."""
    graph = request.graph
    options = read_options(SelectiveOptions, request.options)
    blocks = find_blocks(graph, options.prefix)
    deadline = time.perf_counter() + request.time_limit_s
    details = {"prefix": None if blocks is None else blocks.prefix,
               "blocks": 0 if blocks is None else len(blocks.members)}
    return _result(graph, lambda: selective_matmul_plan(graph, blocks, options.every_other,
                                                        deadline=deadline), details)


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="checkpoint-blocks", run=checkpoint_blocks, options=BlockOptions,
               summary="torch.utils.checkpoint around every k-th numbered block "
               "(module_path): inputs saved, the block recomputed for its backward"),
    MethodSpec(name="selective-matmul", run=selective_matmul, options=SelectiveOptions,
               summary="torchtitan's op-level selective checkpointing: matmul outputs saved "
               "(or every other one), pointwise ops and norms recomputed"),
)
