"""What a pipeline stage's backward frees as it runs, taken off its transient.

A stage's rank memory (planner.sim.rank_memory) charges a micro-batch's saved bytes from its F
until its B (or W) ends, and a compute's transient on top. Autograd frees a saved tensor once
its last reader has run, so while a late backward node runs, much of the micro-batch's saved
bytes are gone already: the embedding's gradient at the end of a GPT's first stage, the head's
weight gradient after the log-softmax's saved output was read. Charging the node's transient
on top of every saved byte over-predicted such stages by the saved bytes freed before it
(measured on 2 gloo ranks, GPT vocab 32,768: 1.6 MB on the first stage, 4.2 MB on the last).

So a stage's B transient is the largest over its backward nodes, in execution order, of the
node's transient (planner.sim.stage_costs.node_transient_bytes) less the `freeable` roots
(saved by the stage, not held to the step's end) already freed (`joint_bytes`). Eager
autograd runs a forward op's backward formula as one node: its gradients are all alive until
it returns (`_formula_co_live`, added to each node's transient), and its saved tensors are
freed when it has run (`_formula_ends`: the credit starts there). A formula is taken as the
backward nodes of one module reading a common gradient (`_formulas`). No credit
(`unreduced_bytes`) where nothing is freed before the backward ends: a recomputed micro-batch
holds its saved bytes again until B ends, and a split I keeps the graph for its W
(retain_graph; a W after it runs on what I left).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from planner.sim.ledger import MemoryLedger


@dataclass(frozen=True)
class BackwardTransients:
    joint_bytes: int  # the largest node transient less the saved bytes freed before it
    unreduced_bytes: int  # the largest node transient, no credit


def backward_transients(
    ledger: MemoryLedger,
    backward_order: Sequence[int],
    freeable: Set[int],
    transient: Callable[[int], int],
) -> BackwardTransients:
    """The credits above over `backward_order` (a stage's backward nodes, execution order);
    `transient(v)` is node v's transient bytes."""
    root, size, preds = ledger.storage_root, ledger.storage_bytes, ledger.predecessors
    inside = set(backward_order)
    formulas = _formulas(ledger, backward_order)
    formula_end = _formula_ends(formulas)
    co_live = _formula_co_live(ledger, backward_order, formulas)
    last: dict[int, int] = {}  # freeable root -> position after which autograd frees it
    for j, w in enumerate(backward_order):
        for p in preds[w]:
            r = root[p]
            if p not in inside and r in freeable:
                last[r] = max(last.get(r, -1), formula_end[j])
    freed_after: dict[int, int] = {}  # position -> bytes freed after it
    for r, j in last.items():
        freed_after[j] = freed_after.get(j, 0) + size[r]
    joint = unreduced = freed = 0
    for j, w in enumerate(backward_order):
        t = transient(w) + co_live[j]
        unreduced = max(unreduced, t)
        joint = max(joint, t - freed)
        freed += freed_after.get(j, 0)
    return BackwardTransients(joint, unreduced)


def _formulas(ledger: MemoryLedger, backward_order: Sequence[int]) -> list[int]:
    """Per position a formula id: the backward nodes of one module that read a common
    gradient root (a received one included) are one eager autograd formula (a linear's
    input, weight and bias gradients from its output's gradient)."""
    graph = ledger.graph
    root, preds = ledger.storage_root, ledger.predecessors
    backward = ({n.id for n in graph.nodes if n.phase.value == "backward"}
                if graph is not None else set(backward_order))
    parent = list(range(len(backward_order)))  # union-find over positions

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first: dict[tuple[int, str], int] = {}  # (gradient root, module) -> first reader
    for j, w in enumerate(backward_order):
        module = graph.index.node(w).module_path if graph is not None else ""
        for p in preds[w]:
            if p in backward:
                key = (root[p], module)
                if key in first:
                    parent[find(j)] = find(first[key])
                else:
                    first[key] = j
    return [find(j) for j in range(len(backward_order))]


def _formula_ends(formulas: Sequence[int]) -> list[int]:
    """Per position, the last position of its formula: eager autograd releases a node's saved
    tensors when its whole formula has run, not after the op that last reads them."""
    end: dict[int, int] = {}
    for j, f in enumerate(formulas):
        end[f] = j
    return [end[f] for f in formulas]


def _formula_co_live(ledger: MemoryLedger, backward_order: Sequence[int],
                     formulas: Sequence[int]) -> list[int]:
    """Per position, the outputs of the earlier nodes of its formula that it does not read:
    eager returns a formula's gradients together, so they are all alive until it returns (a
    linear's input gradient with its weight and bias gradients: GPT, GPipe, 2 gloo ranks,
    7,930 B under without them)."""
    root, preds = ledger.storage_root, ledger.predecessors
    members: dict[int, list[int]] = {}
    out = []
    for j, w in enumerate(backward_order):
        reads = {root[p] for p in preds[w]}
        earlier = [v for v in members.get(formulas[j], []) if root[v] not in reads]
        out.append(sum(ledger.accumulating_transient_bytes(v) for v in earlier))
        members.setdefault(formulas[j], []).append(w)
    return out
