"""The rematerialization problem in position form, and plans in Checkmate's stage form.

Nodes are numbered by their position in the graph's topological order. A *staged schedule* is
Checkmate's frontier-advancing form: stage t computes node t for the first time, after
recomputing (in ascending position, each at most once) the earlier nodes in `computed[t]`;
`retained[t]` is what is resident when stage t begins. Frees are implied: a value is freed right
after its last use in the stage unless it is retained into the next stage; a value retained into
stage t that stage t neither uses nor passes on is freed at the end of the stage. This module
turns staged schedules into actions and accounts their memory with the simulator's ledger
(planner.sim.ledger: `replay`), so that every formulation built on it can be checked against
`planner.sim.simulator`; the formulations' own memory rows and cumulatives are separate
arithmetic, held to the simulator by tests/sim/test_memory_model_props.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp, compute, free
from planner.sim.ledger import MemoryLedger, ReplayFigures, ViewRule
from planner.solvers.order import schedule_order


@dataclass(frozen=True)
class RematProblem:
    node_ids: tuple[int, ...]  # position -> node id
    deps: tuple[tuple[int, ...], ...]  # position -> positions of its inputs
    users: tuple[tuple[int, ...], ...]  # position -> positions of its consumers (ascending)
    cost: tuple[float, ...]
    mem_bytes: tuple[int, ...]  # bytes of a position's output (views: their base's)
    workspace_bytes: tuple[int, ...]
    recomputable: tuple[bool, ...]
    fixed_bytes: int  # resident for the whole step (planner.sim.step_memory's start_bytes)
    budget_bytes: int
    # position -> bytes that become resident at the node's first computation and stay to the
    # end of the step (gradient buffers, gradient_lifetime 'backward'); () when there are none
    held_bytes: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return len(self.node_ids)

    @property
    def total_cost(self) -> float:
        return math.fsum(self.cost)

    @property
    def memory_unit(self) -> int:
        """gcd of every byte count: dividing by it keeps memory arithmetic exact and small."""
        g = 0
        for b in (*self.mem_bytes, *self.workspace_bytes, self.fixed_bytes, *self.held_bytes):
            g = math.gcd(g, b)
        return g or 1

    @property
    def budget_units(self) -> int:
        """The budget in memory units, rounded down: exact, as every sum is a multiple."""
        return self.budget_bytes // self.memory_unit

    def held(self, position: int) -> int:
        """Bytes held from `position`'s first computation on (0 for most nodes)."""
        return self.held_bytes[position] if self.held_bytes else 0

    def held_before(self) -> list[int]:
        """Stage t -> bytes held by nodes 0..t-1 (first computed before stage t)."""
        out, acc = [], 0
        for t in range(self.n):
            out.append(acc)
            acc += self.held(t)
        return out

    def stage_floor_bytes(self) -> list[int]:
        """Stage t -> bytes resident all through stage t besides activations: the fixed bytes
        and the gradient bytes held by nodes first computed before it (the ledger's rules in
        stage form: node t's own held bytes enter at its computation)."""
        return [self.fixed_bytes + b for b in self.held_before()]

    def first_computation_bytes(self) -> list[int]:
        """Position -> bytes its first computation adds: its output and its held bytes."""
        return [self.mem_bytes[v] + self.held(v) for v in range(self.n)]

    @cached_property
    def ledger(self) -> MemoryLedger:
        """The memory ledger of the problem's positions (node ids; views already charged their
        base's bytes in `mem_bytes`), built once per problem."""
        return MemoryLedger.from_columns(
            self.node_ids, self.deps, self.mem_bytes, self.workspace_bytes, self.cost,
            self.recomputable, self.fixed_bytes, self.held_bytes,
        )

    def replay(self, actions: Sequence[Action]) -> ReplayFigures:
        """Peak (views charged as in `mem_bytes`), cost and where, of a plan valid by
        construction: the ledger's unchecked replay."""
        return self.ledger.replay(actions, views=ViewRule.charge_base, check=False)

    @cached_property
    def stage_bytes(self) -> StageBytes:
        """The stage arithmetic of staged and store-all schedules, built once per problem."""
        return StageBytes(self)

    def with_budget(self, budget_bytes: int) -> RematProblem:
        other = dataclasses.replace(self, budget_bytes=budget_bytes)
        for memo in ("ledger", "stage_bytes"):  # no memory fact depends on the budget
            if memo in self.__dict__:
                other.__dict__[memo] = self.__dict__[memo]
        return other


class StageBytes:
    """The ledger's rules in stage form, written once for every stage-by-stage accounting
    (`checkpoints`, `retention`: Checkmate's stages; `order_eval`, `late_orders`: store-all
    orders). A node adds its output (views: their base's bytes, `ViewRule.charge_base`, as in
    `mem_bytes`) when computed and its held bytes at its first computation; its workspace
    counts only while it runs; fixed bytes are resident throughout.

    The columns are the problem's, which `problem_from_graph` takes from the graph's ledger:
    read here as plain lists (and numpy arrays for whole orders), since these loops are the
    solvers' hottest and a lookup through the ledger's dicts would slow them down."""

    def __init__(self, problem: RematProblem) -> None:
        n = problem.n
        self.fixed = problem.fixed_bytes
        self.out = list(problem.mem_bytes)  # position -> bytes resident while computed
        self.ws = list(problem.workspace_bytes)
        self.held = list(problem.held_bytes) if problem.held_bytes else [0] * n
        self.floor = problem.stage_floor_bytes()  # stage -> fixed and earlier held bytes
        self.first = problem.first_computation_bytes()  # output and held bytes
        self.load = [m + w for m, w in zip(self.out, self.ws, strict=True)]  # while it runs
        self.out_np = np.array(self.out, dtype=np.int64)
        self.first_np = np.array(self.first, dtype=np.int64)
        # store-all steps are first computations: held bytes count while the node runs
        self.first_load = [f + w for f, w in zip(self.first, self.ws, strict=True)]
        self.first_load_np = np.array(self.first_load, dtype=np.int64)

    # -- Checkmate's stages: stage t first computes t, after recomputing earlier nodes -------
    def alone(self, t: int) -> int:
        """Bytes above what is resident as stage t begins, while t runs, when the stage
        computes t alone: its output, held bytes (a first computation) and workspace."""
        return self.first[t] + self.ws[t]

    def running(self, t: int, x: int) -> int:
        """Bytes x adds while it runs in stage t: output, workspace, and held bytes when it is
        t (its first computation)."""
        return self.load[x] + (self.held[t] if x == t else 0)

    def work(self, t: int, steps: list[int]) -> int:
        """Bytes above what is resident as stage t begins, at the stage's peak, for its own
        steps (x: compute x, ~x: free x); t's held bytes enter at t's computation (its
        first), the recomputations' held bytes are already resident (the stage floor)."""
        out, ws = self.out, self.ws
        live = work = 0
        for k in steps:
            if k < 0:
                live -= out[~k]
                continue
            live += out[k]
            if k == t:
                live += self.held[t]
            during = live + ws[k]
            if during > work:
                work = during
        return work

    # -- store-all orders: every value kept until its last reader has run ------------------
    def freed_at(self, last: np.ndarray) -> np.ndarray:
        """Index -> bytes freed there, when value v is freed at index last[v] (a position or
        a step: after its last reader, or its own step when nobody reads it)."""
        freed = np.zeros(len(self.out), dtype=np.int64)
        np.add.at(freed, last, self.out_np)
        return freed

    def run(self, segment: np.ndarray, change: np.ndarray, resident: int
            ) -> tuple[np.ndarray, np.ndarray]:
        """(bytes while each step of `segment` runs, bytes resident before each) when
        `resident` bytes (fixed excluded) are resident before the first step and step k then
        adds change[k] (its first computation's bytes less what it frees)."""
        before = np.cumsum(change)
        before -= change
        before += resident
        during = before + self.first_load_np[segment]
        during += self.fixed
        return during, before

    def run_short(self, segment: list[int], change: list[int], resident: int, target: int
                  ) -> tuple[int, int, list[int], list[int]]:
        """`run` in plain Python (numpy's per-call cost dominates on short segments), with the
        peak and the bytes over `target` summed over the steps: (peak, over, during, before)."""
        load, fixed = self.first_load, self.fixed
        before: list[int] = []
        during: list[int] = []
        top = excess = 0
        r = resident
        for w, c in zip(segment, change, strict=True):
            st = fixed + r + load[w]
            before.append(r)
            during.append(st)
            if st > top:
                top = st
            if st > target:
                excess += st - target
            r += c
        return top, excess, during, before


def problem_from_graph(graph: Graph, budget_bytes: int) -> RematProblem:
    """The graph's memory ledger in position form. Views (alias_of) are charged their base's
    bytes (`ViewRule.charge_base`): never less than the simulator counts (a view keeps its base
    alive), so plans stay within budget; exact for alias-free graphs. Fixed and held bytes are
    the ledger's: the start bytes for the whole step, and gradient buffers from their node's
    first computation on."""
    ledger = MemoryLedger.of(graph)
    order = schedule_order(graph)
    pos = {v: i for i, v in enumerate(order)}
    held = ledger.held_bytes
    return RematProblem(
        node_ids=tuple(order),
        deps=tuple(tuple(sorted(pos[u] for u in ledger.predecessors[v])) for v in order),
        users=tuple(tuple(sorted(pos[w] for w in ledger.successors[v])) for v in order),
        cost=tuple(ledger.compute_ms[v] for v in order),
        mem_bytes=tuple(ledger.charged_bytes[v] for v in order),
        workspace_bytes=tuple(ledger.workspace_bytes[v] for v in order),
        recomputable=tuple(ledger.recomputable[v] for v in order),
        fixed_bytes=ledger.fixed_bytes,
        budget_bytes=budget_bytes,
        held_bytes=tuple(held.get(v, 0) for v in order) if held else (),
    )


@dataclass(frozen=True)
class StagedSchedule:
    computed: tuple[frozenset[int], ...]  # stage t -> positions computed in stage t (t included)
    retained: tuple[frozenset[int], ...]  # stage t -> positions resident when stage t begins

    def cost(self, problem: RematProblem) -> float:
        return math.fsum(problem.cost[i] for stage in self.computed for i in stage)


def staged_actions(problem: RematProblem, sched: StagedSchedule) -> tuple[list[Action], int]:
    """Actions of a staged schedule and its peak bytes by the simulator's accounting (the
    problem's ledger).

    Raises ValueError when the schedule is not valid (an input not resident, a value retained
    that was not available, a resident value computed again).
    """
    n = problem.n
    ids, deps, users = problem.node_ids, problem.deps, problem.users
    actions: list[Action] = []
    resident: set[int] = set()
    for t in range(n):
        if resident != set(sched.retained[t]):
            raise ValueError(f"stage {t}: retained set differs from what is resident")
        stage = sched.computed[t]
        if t not in stage or any(i > t for i in stage):
            raise ValueError(f"stage {t}: must compute node {t} and nothing after it")
        keep_next = sched.retained[t + 1] if t + 1 < n else frozenset()
        if not keep_next <= resident | stage:
            raise ValueError(f"stage {t}: retains a value that is not available")
        ordered = sorted(stage)
        for k in ordered:
            if k in resident:
                raise ValueError(f"stage {t}: node {k} is computed while resident")
            for i in deps[k]:
                if i not in resident:
                    raise ValueError(f"stage {t}: input {i} of {k} is not resident")
            actions.append(compute(ids[k]))
            resident.add(k)
            for i in (*deps[k], k):
                later = any(k < j <= t and j in stage for j in users[i])
                if i in resident and i not in keep_next and not later:
                    actions.append(free(ids[i]))
                    resident.discard(i)
        for i in sorted(resident - keep_next):
            actions.append(free(ids[i]))
            resident.discard(i)
    return actions, problem.replay(actions).peak_bytes


def staged_from_actions(problem: RematProblem, actions: Sequence[Action]) -> StagedSchedule | None:
    """The staged form of a plan whose first computations follow the topological order and
    whose recomputations between them ascend; None for any other plan."""
    pos = {v: i for i, v in enumerate(problem.node_ids)}
    computed: list[frozenset[int]] = []
    retained: list[frozenset[int]] = []
    resident: set[int] = set()
    current: list[int] = []
    start = frozenset[int]()
    for a in actions:
        p = pos.get(a.node)
        if p is None:
            return None
        if a.op is ActionOp.compute:
            if not current:
                start = frozenset(resident)
            if current and p <= current[-1]:
                return None
            t = len(computed)
            if p > t:
                return None
            current.append(p)
            resident.add(p)
            if p == t:
                computed.append(frozenset(current))
                retained.append(start)
                current = []
        else:
            resident.discard(p)
    if current or len(computed) != problem.n:
        return None
    return StagedSchedule(tuple(computed), tuple(retained))
