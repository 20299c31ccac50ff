"""Decide a tight budget exactly on a single-sink DAG: search the plan backwards from the sink.

When the sink runs, every value it reads is resident. Read backwards, a plan is a walk over
resident sets from that set to the empty one: undoing a computation of x removes x and needs
x's inputs resident (they were, when x ran: the set then, plus x, is what memory held), and
undoing a free adds a value at no cost. A smaller set is never worse (it can always add what
the larger one holds), so two moves suffice, and the search is exact:
- *closure*: remove at once every value whose inputs are all resident (undoing it adds
  nothing), as long as memory while it runs (the set, its workspace, the fixed bytes) fits;
- *undo x*: add x's missing inputs, remove x (memory: the set with them, and x's workspace),
  then the closure.
Every resident set reachable this way within the budget is visited, but for those holding a
visited one (`_Dominance`). When the empty set is among them, the walk read forwards is a plan
(any order of first computations, any recomputation); when it is not and every reachable set
was visited, no plan fits: a proof that holds for every order. Tight budgets leave few
reachable sets (random_layered_dag(500) at 0.6 of store-all: 65,009, the room beyond the
sink's inputs being 3-4 values; at 0.61, 834,004); loose ones explode, so the search stops
after a count of sets (deterministic) or at the deadline (the safety net) and then decides
nothing.

It covers graphs whose data edges are all the order there is (no loss/backward control edges),
without views or held bytes (gradient buffers), and with one node nobody reads (so every node
is its ancestor): the random layered DAGs. Non-recomputable nodes are treated as recomputable,
which only relaxes the proof; auto's simulator judges a plan found.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action, compute, free
from planner.solvers.remat.auto_search import AutoResult, AutoSearch
from planner.solvers.remat.problem import RematProblem

# Resident sets visited before the search gives up (random500 at 0.61: 250,000 in 9.8 s,
# 190 MB), and at most this many mask bits in all (random5000: 40,000 sets, about 8 s)
DEFAULT_MAX_STATES = 250_000
MAX_STATE_BITS = 200_000_000
DEADLINE_CHECK_EVERY = 2048  # sets expanded between clock readings
# auto runs the search first where the sink's own need is at least this share of the budget
# (random_layered_dag(500) at 0.6: 0.92, decided in 65,009 sets; the undecided rows there are
# 0.64-0.78, with 13-46 values of room beyond the sink's inputs: at 0.61, with 4, random500
# takes 834,004 sets)
TIGHT_SHARE = 0.85
TIME_SHARE = 0.5  # of auto's limit at most: a safety net on a loaded machine (counts decide)
# Best-first sets while no plan fits after auto's first phase (random500: about 10,000 a
# second on a quiet core), within half of what is left of its time at most
PLAN_MAX_STATES = 100_000


@dataclass(frozen=True)
class SinkSearchResult:
    status: str  # "infeasible" (every reachable set visited), "plan", or "unknown" (gave up)
    actions: list[Action] | None
    states: int  # resident sets visited
    reason: str


def sink_position(graph: Graph, problem: RematProblem) -> int | None:
    """The position of the only node nobody reads, where the search applies (module doc);
    None on graphs it does not cover."""
    index = graph.index
    if index.control_predecessors or problem.held_bytes and any(problem.held_bytes):
        return None
    if any(node.alias_of is not None for node in graph.nodes):
        return None
    sinks = [t for t in range(problem.n) if not problem.users[t]]
    return sinks[0] if len(sinks) == 1 else None


def _bits(mask: int) -> Iterator[int]:
    """Set bit positions of mask (lowest first)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Space:
    """The problem's columns as bitmasks over positions (bit p: position p resident)."""

    def __init__(self, problem: RematProblem, sink: int) -> None:
        self.problem, self.sink = problem, sink
        n = problem.n
        self.size = list(problem.mem_bytes)  # position -> bytes while resident
        self.ws = list(problem.workspace_bytes)
        self.inputs = [sum(1 << u for u in problem.deps[v]) for v in range(n)]  # position -> mask
        self.readers = [sum(1 << w for w in problem.users[v]) for v in range(n)]
        self.deps = problem.deps
        self.limit = problem.budget_bytes - problem.fixed_bytes  # bytes for resident values

    def bytes_of(self, mask: int) -> int:
        return sum(self.size[p] for p in _bits(mask))

    def grown(self, mask: int, used: int, x: int) -> int:
        """Bytes resident once x's missing inputs are added, or -1 when undoing x does not
        fit (stops adding at the first input over: most moves do not fit)."""
        room = self.limit - self.ws[x] - used
        size = self.size
        for u in self.deps[x]:
            if not mask >> u & 1:
                room -= size[u]
                if room < 0:
                    return -1
        return self.limit - self.ws[x] - room

    def undo(self, mask: int, grown: int, x: int) -> tuple[int, int, list[int]]:
        """Undo x's computation in `mask` (`grown`: the bytes with its missing inputs added),
        then the closure over what that can have made removable: the added inputs and their
        readers. (mask, bytes, positions the closure removed, highest first)."""
        added = self.inputs[x] & ~mask
        candidates = added
        for p in _bits(added):
            candidates |= self.readers[p]
        return self.closure((mask | added) & ~(1 << x), grown - self.size[x], candidates)

    def closure(self, mask: int, used: int, candidates: int) -> tuple[int, int, list[int]]:
        """Remove every candidate whose inputs are resident (readers before what they read, so
        that each still finds its inputs), where its workspace fits; (mask, bytes, removed
        highest first). Removing a value never completes another's inputs: one pass."""
        removed = []
        for p in sorted(_bits(candidates & mask), reverse=True):
            if self.inputs[p] & mask == self.inputs[p] and used + self.ws[p] <= self.limit:
                mask ^= 1 << p
                used -= self.size[p]
                removed.append(p)
        return mask, used, removed


def search_from_sink(problem: RematProblem, sink: int, *, max_states: int = DEFAULT_MAX_STATES,
                     deadline: float = float("inf")) -> SinkSearchResult:
    """The backward search of the module doc; `sink` from `sink_position`."""
    space = _Space(problem, sink)
    start = space.inputs[sink]
    used = space.bytes_of(start)
    if used + space.size[sink] + space.ws[sink] > space.limit:
        return SinkSearchResult("infeasible", None, 1, "the sink's inputs, output and workspace "
                                "exceed the budget")
    start, used, first = space.closure(start, used, start)
    # resident set -> (set it was reached from, position undone); the closure is recomputed
    parent: dict[int, tuple[int, int] | None] = {start: None}
    kept = _Dominance(space, start)
    stack = [(start, used)]
    expanded = 0
    while stack:
        mask, used = stack.pop()
        if mask == 0:
            actions = _forward_actions(space, parent, first)
            return SinkSearchResult("plan", actions, len(parent), "the empty set is reachable")
        expanded += 1
        if expanded % DEADLINE_CHECK_EVERY == 0 and time.perf_counter() > deadline:
            return SinkSearchResult("unknown", None, len(parent), "out of time")
        for x in _bits(mask):
            grown = space.grown(mask, used, x)
            if grown < 0:
                continue
            nxt, nxt_used, _ = space.undo(mask, grown, x)
            if nxt not in parent and kept.admit(nxt):
                parent[nxt] = (mask, x)
                stack.append((nxt, nxt_used))
        if len(parent) > max_states:
            return SinkSearchResult("unknown", None, len(parent),
                                    f"more than {max_states} resident sets")
    return SinkSearchResult("infeasible", None, len(parent), (
        f"no order and recomputation fits: the resident sets reachable backwards from the "
        f"sink's inputs within the budget ({len(parent)} visited, the rest hold one of them) "
        f"are none empty"))


def plan_from_sink(problem: RematProblem, sink: int, *, max_states: int = PLAN_MAX_STATES,
                   deadline: float = float("inf")) -> SinkSearchResult:
    """A plan by the same moves, best first: the set with the fewest ancestors (each must
    still be undone at least once), then the fewest bytes. No proof when it gives up (it
    does not visit every set); random_layered_dag(500) at 0.75: a plan after 5,270 sets,
    where auto's other searches find none in 60 s."""
    space = _Space(problem, sink)
    ancestors = [0] * problem.n  # position -> mask of itself and its ancestors
    for v in range(problem.n):
        for u in problem.deps[v]:
            ancestors[v] |= ancestors[u]
        ancestors[v] |= 1 << v

    def left(mask: int) -> int:
        out = 0
        for p in _bits(mask):
            out |= ancestors[p]
        return out.bit_count()

    start = space.inputs[sink]
    used = space.bytes_of(start)
    if used + space.size[sink] + space.ws[sink] > space.limit:
        return SinkSearchResult("infeasible", None, 1, "the sink's inputs exceed the budget")
    start, used, first = space.closure(start, used, start)
    parent: dict[int, tuple[int, int] | None] = {start: None}  # as in search_from_sink
    heap = [(left(start), used, start)]
    expanded = 0
    while heap:
        _, used, mask = heapq.heappop(heap)
        if mask == 0:
            actions = _forward_actions(space, parent, first)
            return SinkSearchResult("plan", actions, len(parent), "the empty set is reachable")
        expanded += 1
        if expanded % DEADLINE_CHECK_EVERY == 0 and time.perf_counter() > deadline:
            return SinkSearchResult("unknown", None, len(parent), "out of time")
        for x in _bits(mask):
            grown = space.grown(mask, used, x)
            if grown >= 0:
                nxt, nxt_used, _ = space.undo(mask, grown, x)
                if nxt not in parent:
                    parent[nxt] = (mask, x)
                    heapq.heappush(heap, (left(nxt), nxt_used, nxt))
        if len(parent) > max_states:
            break
    return SinkSearchResult("unknown", None, len(parent), f"no plan in {len(parent)} sets")


class _Dominance:
    """Sets that hold a superset of a visited set are not visited (the smaller one does
    everything the larger can), checked where it is cheap: among sets with the same values
    besides the sink-only ones (read by the sink alone, never needed again once undone),
    whose sink-only parts are compared. random_layered_dag(500) at 0.6: 65,009 sets, was
    96,487 (at 0.61: 775,300, 75 s)."""

    def __init__(self, space: _Space, start: int) -> None:
        problem = space.problem
        self.sink_only = sum(1 << u for u in problem.deps[space.sink]
                             if problem.users[u] == (space.sink,))
        self.parts: dict[int, list[int]] = {}  # the rest of a set -> its sink-only parts
        self.admit(start)

    def admit(self, mask: int) -> bool:
        """Whether `mask` is not dominated; it is then recorded (and the parts it dominates
        forgotten: they are already visited or on the stack)."""
        part = mask & self.sink_only
        parts = self.parts.setdefault(mask & ~self.sink_only, [])
        if any(other & part == other for other in parts):
            return False
        parts[:] = [other for other in parts if other & part != part]
        parts.append(part)
        return True


def _forward_actions(space: _Space, parent: dict[int, tuple[int, int] | None],
                     first: list[int]) -> list[Action]:
    """The walk from the start set to the empty set, read forwards: each backward step
    (add inputs, undo x, closure) becomes compute the closure's values (lowest first),
    compute x, free the inputs it added; then the start set's closure, the sink, free all."""
    ids, sink = space.problem.node_ids, space.sink
    actions: list[Action] = []
    mask = 0
    while (step := parent[mask]) is not None:
        before, x = step
        _, _, removed = space.undo(before, space.bytes_of(before | space.inputs[x]), x)
        actions += [compute(ids[p]) for p in reversed(removed)]
        actions.append(compute(ids[x]))
        resident = mask | sum(1 << p for p in removed) | (1 << x)
        actions += [free(ids[p]) for p in _bits(resident & ~before)]
        mask = before
    actions += [compute(ids[p]) for p in reversed(first)]
    actions.append(compute(ids[sink]))
    resident = mask | sum(1 << p for p in first) | (1 << sink)
    actions += [free(ids[p]) for p in _bits(resident)]
    return actions


def is_tight(problem: RematProblem, sink: int) -> bool:
    """Whether what the sink alone needs resident is within TIGHT_SHARE of the budget: there
    the search is small (a few values of room beyond the sink's inputs) and decides."""
    need = (problem.fixed_bytes + problem.mem_bytes[sink] + problem.workspace_bytes[sink]
            + sum(problem.mem_bytes[u] for u in problem.deps[sink]))
    return need >= TIGHT_SHARE * problem.budget_bytes


def decide_from_sink(search: AutoSearch, max_states: int = DEFAULT_MAX_STATES
                     ) -> AutoResult | None:
    """auto's first step on a tight budget (`is_tight`) on a graph the search covers: an
    AutoResult when it proves that no plan fits; a plan found is offered to `search`. Runs
    within TIME_SHARE of the limit (the safety net: the count of sets decides)."""
    problem = search.problem
    sink = sink_position(search.graph, problem)
    if sink is None or not is_tight(problem, sink):
        return None
    started = time.perf_counter()
    deadline = min(search.deadline, started + TIME_SHARE * search.config.time_limit_s)
    found = search_from_sink(problem, sink, deadline=deadline,
                             max_states=min(max_states, MAX_STATE_BITS // problem.n))
    search.timings["sink_search_s"] = time.perf_counter() - started
    if found.status == "infeasible":
        return AutoResult(None, None, "none", search.problem.total_cost, False, True,
                          [*search.notes, f"no schedule fits: {found.reason}"], search.timings)
    if found.status == "plan":
        search.offer(found.actions, "sink-search")
    else:
        search.notes.append(f"sink search: undecided after {found.states} resident sets "
                            f"({found.reason})")
    return None


def plan_when_none_fits(search: AutoSearch, max_states: int = PLAN_MAX_STATES) -> None:
    """auto's step after its first phase where nothing fits yet, on a graph the search
    covers: `plan_from_sink` within half of what is left; a plan found is offered."""
    problem = search.problem
    sink = sink_position(search.graph, problem)
    if search.best is not None or sink is None:
        return
    started = time.perf_counter()
    found = plan_from_sink(problem, sink, deadline=started + search.left() / 2,
                           max_states=min(max_states, MAX_STATE_BITS // problem.n))
    search.timings["sink_plan_s"] = time.perf_counter() - started
    if found.actions is not None:
        search.offer(found.actions, "sink-plan")
    else:
        search.notes.append(f"sink plan search: {found.reason}")
