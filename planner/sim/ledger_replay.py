"""The memory ledger's replays (planner.sim.ledger): the hot loops over an action list, the
view rules they apply, and the simulator's replay errors.

Kept apart from the ledger's facts so that each module stays small; `MemoryLedger.replay` is
the entry point.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from planner.core.graph import Graph, GraphIndex
from planner.core.plan import Action, ActionOp
from planner.sim.result import PlanError, SimulationAbandoned

if TYPE_CHECKING:
    from planner.sim.ledger import MemoryLedger

CHECK_EVERY = 1 << 13  # actions between deadline checks


class ViewRule(Enum):
    """How a view (alias_of) is charged."""

    share_base = "share-base"  # the simulator's: no bytes of its own, keeps its base alive
    # Solvers' relaxation: a view costs its base's bytes, as a copy would. Their memory is a
    # sum of per-node terms (MILP rows, cumulatives, stage sums), which storage sharing is not;
    # never below the simulator's figure, equal to it on graphs without views.
    charge_base = "charge-base"
    # The chain linearization's segment profiles: each node its own storage bytes (a view
    # none) and no keep-alive, so that a segment's bytes are a sum over its own actions,
    # relative to what was resident before it (planner.solvers.chain.linearize).
    own_storage = "own-storage"


@dataclass(frozen=True, eq=False)
class ReplayFigures:
    """What a replay measured."""

    peak_bytes: int  # fixed bytes included
    peak_action_index: int  # -1: the fixed bytes alone (no action raised the peak)
    peak_node: int | None  # the node computing at the peak (None: no action)
    compute_cost: float  # math.fsum of every computation's compute_ms (the simulator's sum)
    computations: int
    fixed_bytes: int
    computed: Mapping[int, int]  # node -> how many times it was computed
    live_bytes: list[int] | None = None  # after each action (during it, for a compute)
    end_bytes: int = 0  # live after the last action (the fast replay's)


def control_predecessors(index: GraphIndex) -> dict[int, list[int]]:
    """Node -> the order predecessors that are not data predecessors (the loss, for backward
    ops without a data path from it); empty for most graphs."""
    order = index.order_predecessors
    preds = index.predecessors
    if order is preds:
        return {}
    out: dict[int, list[int]] = {}
    for v, us in order.items():
        if us is not preds[v] and len(us) != len(preds[v]):
            data = set(preds[v])
            out[v] = [u for u in us if u not in data]
    return out


def loss_rule_error(graph: Graph, i: int, a: object, v: int, before: int) -> PlanError:
    return PlanError(
        f"action {i} ({a}): {graph.describe(v)} is a backward op and may not run before the "
        f"loss, {graph.describe(before)}, is computed",
        i,
        v,
    )


def describe_missing(graph: Graph, missing: list[int]) -> str:
    listed = ", ".join(graph.describe(v) for v in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"the plan never computes {listed}{more}"


def fast_replay(
    ledger: MemoryLedger, actions: Sequence[Action], views: ViewRule, record: bool,
    *, start_bytes: int | None = None, with_held: bool = True,
) -> ReplayFigures:
    """The unchecked replay (the hot loop of solvers' own checks); from `start_bytes` (default:
    the fixed bytes), held bytes left out unless `with_held`."""
    compute_op = ActionOp.compute
    ws = ledger.workspace_bytes
    held: Mapping[int, int] = ledger.held_bytes if with_held else {}
    charge = views is not ViewRule.share_base  # per-node bytes, no storage sharing
    own = ledger.charged_bytes if views is ViewRule.charge_base else ledger.storage_bytes
    root = ledger.storage_root
    refcount: dict[int, int] = {}
    computed: dict[int, int] = {}
    live = peak = ledger.fixed_bytes if start_bytes is None else start_bytes
    peak_index = -1
    timeline: list[int] = []
    flow = element_flow(ledger, actions)
    handed, kept = flow.handed, flow.kept
    element_op = ledger.element_op
    ops_resident: set[int] = set()  # resident ops with outputs of their own (for `kept`)
    prepaid: dict[int, int] = {}  # element node -> bytes taken at its op's computation
    for i, a in enumerate(actions):
        v = a.node
        if a.op is compute_op:
            times = computed.get(v, 0)
            computed[v] = times + 1
            if not times and held:
                live += held.get(v, 0)
            if charge:
                live += own[v]
            else:
                r = root[v]
                k = refcount.get(r, 0)
                refcount[r] = k + 1
                if not k:
                    live += own[r]
            if prepaid:
                live -= prepaid.pop(v, 0)  # an element taken at its op's computation
            during = live + ws[v]
            if i in handed:  # outputs of their own the plan takes from this run: live on
                live += born_bytes(ledger.storage_bytes, held, handed[i], computed, prepaid)
            if element_op and v in ledger.elements:
                ops_resident.add(v)
            if during > peak:
                peak, peak_index = during, i
            if record:
                timeline.append(during)
        else:
            ops_resident.discard(v)
            stays = i in kept and element_op[v] in ops_resident  # still in its op's tuple
            if charge:
                if stays:
                    prepaid[v] = own[v]
                else:
                    live -= own[v]
            else:
                r = root[v]
                refcount[r] -= 1
                if not refcount[r]:
                    if stays:
                        prepaid[v] = own[r]
                    else:
                        live -= own[r]
            if record:
                timeline.append(live)
    return _figures(ledger, actions, peak, peak_index, computed, timeline if record else None,
                    live)


def _figures(
    ledger: MemoryLedger,
    actions: Sequence[Action],
    peak: int,
    peak_index: int,
    computed: dict[int, int],
    timeline: list[int] | None,
    end_bytes: int = 0,
) -> ReplayFigures:
    return ReplayFigures(
        peak_bytes=peak,
        peak_action_index=peak_index,
        peak_node=actions[peak_index].node if peak_index >= 0 else None,
        compute_cost=ledger.cost_of(computed),
        computations=sum(computed.values()),
        fixed_bytes=ledger.fixed_bytes,
        computed=computed,
        live_bytes=timeline,
        end_bytes=end_bytes,
    )


def checked_replay(
    ledger: MemoryLedger, actions: Sequence[Action], record: bool, deadline: float | None
) -> ReplayFigures:
    """The simulator's one-stream replay: the fast replay's share_base rules, each action
    checked. A plan with host copies raises NeedsStreams."""
    facts, own, held, control = (ledger.node_facts, ledger.storage_bytes, ledger.held_bytes,
                                 ledger.control)
    compute_op, free_op = ActionOp.compute, ActionOp.free
    resident: set[int] = set()
    refcount: dict[int, int] = {}  # storage root -> resident nodes sharing it
    freed_at: dict[int, int] = {}  # node -> index of the action that last freed it
    computed: dict[int, int] = {}
    live = peak = ledger.fixed_bytes
    peak_index = -1
    timeline: list[int] = []
    flow = element_flow(ledger, actions)
    handed, kept = flow.handed, flow.kept
    element_op = ledger.element_op
    prepaid: dict[int, int] = {}  # element node -> bytes taken at its op's computation
    for i, a in enumerate(actions):
        if deadline is not None and not i % CHECK_EVERY and time.perf_counter() > deadline:
            raise SimulationAbandoned(f"replay stopped at action {i} of {len(actions)}")
        v = a.node
        op = a.op
        f = facts.get(v)
        if f is None:
            raise PlanError(f"action {i} ({a}): node {v} is not in the graph", i, v)
        if op is compute_op:
            preds, r, ws, recomputable = f
            times = computed.get(v, 0)
            if v in resident or (times and not recomputable):
                raise _compute_error(ledger, i, a, v in resident)
            for u in preds:
                if u not in resident:
                    raise _input_error(ledger, i, a, u, freed_at)
            if not times:
                if control and v in control:
                    for u in control[v]:
                        if u not in computed:
                            raise _loss_error(ledger, i, a, u)
                if held:
                    live += held.get(v, 0)
            resident.add(v)
            k = refcount.get(r, 0)
            refcount[r] = k + 1
            if not k:
                live += own[r]
            if prepaid:
                live -= prepaid.pop(v, 0)  # an element taken at its op's computation
            during = live + ws
            computed[v] = times + 1
            if i in handed:  # outputs of their own the plan takes from this run: live on
                live += born_bytes(ledger.storage_bytes, held, handed[i], computed, prepaid)
            if during > peak:
                peak, peak_index = during, i
            if record:
                timeline.append(during)
        elif op is free_op:
            if v not in resident:
                raise _free_error(ledger, i, a, freed_at)
            resident.discard(v)
            freed_at[v] = i
            r = f[1]
            refcount[r] -= 1
            if not refcount[r]:
                if i in kept and element_op[v] in resident:  # still in its op's tuple
                    prepaid[v] = own[r]
                else:
                    live -= own[r]
            if record:
                timeline.append(live)
        else:
            raise NeedsStreams
    if len(computed) < len(facts):
        order = ledger.graph.index.topological_order if ledger.graph else ledger.node_ids
        missing = [v for v in order if v not in computed]
        raise PlanError(_missing_text(ledger, missing), len(actions), missing[0])
    return _figures(ledger, actions, peak, peak_index, computed, timeline if record else None)


@dataclass(frozen=True)
class ElementFlow:
    """Where the outputs of multi-output ops that are nodes of their own (`ledger.elements`)
    live, for one action list. The runtime (planner.runtime.op_codegen) keeps such an output in
    its op's tuple exactly when the plan computes its node next, before it next touches the op;
    it drops the others right after the op (charged while the op runs: the ledger's workspace
    rule)."""

    # index of a computation of an op -> its outputs handed over from this run: their bytes
    # are live from the op's computation on, not from their own
    handed: dict[int, tuple[int, ...]]
    # indices of frees of such outputs kept in their op's tuple (while the op is resident) to
    # be handed over again: their bytes stay, and their next computation adds none
    kept: frozenset[int]


def element_flow(ledger: MemoryLedger, actions: Sequence[Action]) -> ElementFlow:
    """The `ElementFlow` of `actions`, in one backward scan."""
    elements, element_op = ledger.elements, ledger.element_op
    if not elements:
        return ElementFlow({}, frozenset())
    compute_op, free_op = ActionOp.compute, ActionOp.free
    end = len(actions)
    next_touch: dict[int, int] = {}  # node -> index of the next action on it
    next_compute: dict[int, int] = {}  # node -> index of its next computation
    handed: dict[int, tuple[int, ...]] = {}
    kept: set[int] = set()
    for i in range(end - 1, -1, -1):
        a = actions[i]
        v = a.node
        if a.op is compute_op:
            us = elements.get(v)
            if us is not None:
                touch = next_touch.get(v, end)
                taken = tuple(u for u in us if next_compute.get(u, end) < touch)
                if taken:
                    handed[i] = taken
            next_compute[v] = i
        elif a.op is free_op and v in element_op:
            if next_compute.get(v, end) < next_touch.get(element_op[v], end):
                kept.add(i)
        next_touch[v] = i
    return ElementFlow(handed, frozenset(kept))


def handed_elements(ledger: MemoryLedger, actions: Sequence[Action]) -> dict[int, tuple[int, ...]]:
    """`ElementFlow.handed` of `actions`."""
    return element_flow(ledger, actions).handed


def flow_by_run(ledger: MemoryLedger, actions: Sequence[Action]) -> tuple[
        dict[tuple[int, int], tuple[int, ...]], frozenset[tuple[int, int]]]:
    """The element flow keyed by runs, stable when frees move (planner.sim.free_placement):
    handed as (op node, its computations before), kept as (element node, its frees before)."""
    flow = element_flow(ledger, actions)
    if not flow.handed and not flow.kept:
        return {}, frozenset()
    runs: dict[tuple[ActionOp, int], int] = {}
    handed: dict[tuple[int, int], tuple[int, ...]] = {}
    kept: set[tuple[int, int]] = set()
    for i, a in enumerate(actions):
        k = runs.get((a.op, a.node), 0)
        runs[(a.op, a.node)] = k + 1
        if i in flow.handed:
            handed[(a.node, k)] = flow.handed[i]
        elif i in flow.kept:
            kept.add((a.node, k))
    return handed, frozenset(kept)


def born_bytes(storage: Mapping[int, int], held: Mapping[int, int], elements: tuple[int, ...],
               computed: Mapping[int, int], prepaid: dict[int, int]) -> int:
    """Bytes the elements take now (their storage, or a gradient's held bytes the first
    time), noted in `prepaid` so that their own computation does not take them again."""
    total = 0
    for u in elements:
        b = storage[u] or (held.get(u, 0) if u not in computed else 0)
        prepaid[u] = b
        total += b
    return total


class NeedsStreams(Exception):
    """The plan moves memory to the host: the one-stream replay cannot measure it."""


def _compute_error(ledger: MemoryLedger, i: int, a: Action, resident: bool) -> PlanError:
    v = a.node
    why = "is already resident" if resident else "is not recomputable but is computed again"
    return PlanError(f"action {i} ({a}): {ledger.describe(v)} {why}", i, v)


def _input_error(
    ledger: MemoryLedger, i: int, a: Action, u: int, freed_at: Mapping[int, int]
) -> PlanError:
    why = f"it was freed at action {freed_at[u]}" if u in freed_at else "it was never computed"
    return PlanError(
        f"action {i} ({a}): input {ledger.describe(u)} of {ledger.describe(a.node)} is not "
        f"resident: {why}",
        i,
        a.node,
    )


def _free_error(
    ledger: MemoryLedger, i: int, a: Action, freed_at: Mapping[int, int]
) -> PlanError:
    v = a.node
    why = (
        f"it was already freed at action {freed_at[v]}" if v in freed_at
        else "it was never computed"
    )
    return PlanError(f"action {i} ({a}): cannot free {ledger.describe(v)}: {why}", i, v)


def _loss_error(ledger: MemoryLedger, i: int, a: Action, before: int) -> PlanError:
    assert ledger.graph is not None  # control predecessors come from a graph
    return loss_rule_error(ledger.graph, i, a, a.node, before)


def _missing_text(ledger: MemoryLedger, missing: list[int]) -> str:
    if ledger.graph is not None:
        return describe_missing(ledger.graph, missing)
    return f"the plan never computes node {missing[0]}"
