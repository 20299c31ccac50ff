"""The rematerialization problem in position form, and plans in Checkmate's stage form.

Nodes are numbered by their position in the graph's topological order. A *staged schedule* is
Checkmate's frontier-advancing form: stage t computes node t for the first time, after
recomputing (in ascending position, each at most once) the earlier nodes in `computed[t]`;
`retained[t]` is what is resident when stage t begins. Frees are implied: a value is freed right
after its last use in the stage unless it is retained into the next stage; a value retained into
stage t that stage t neither uses nor passes on is freed at the end of the stage. This module
turns staged schedules into actions and accounts memory exactly as the simulator does, so that
every formulation built on it can be checked against `planner.sim.simulator`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.graph import Graph
from planner.core.plan import Action, ActionOp, compute, free
from planner.sim.step_memory import step_memory
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
    fixed_bytes: int  # resident for the whole step (memory_model.step_memory's start_bytes)
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

    def with_budget(self, budget_bytes: int) -> RematProblem:
        return RematProblem(**{**self.__dict__, "budget_bytes": budget_bytes})


def problem_from_graph(graph: Graph, budget_bytes: int) -> RematProblem:
    """Views (alias_of) are charged their base's bytes: never less than the simulator counts
    (a view keeps its base alive), so plans stay within budget; exact for alias-free graphs.

    Fixed and held bytes are the memory model's (`planner.sim.step_memory.step_memory`): the start
    bytes for the whole step, and gradient buffers from their node's first computation on."""
    index = graph.index
    step = step_memory(graph)
    order = schedule_order(graph)
    pos = {v: i for i, v in enumerate(order)}
    mem = [index.storage_bytes[index.storage_root(v)] for v in order]
    return RematProblem(
        node_ids=tuple(order),
        deps=tuple(tuple(sorted(pos[u] for u in index.predecessors[v])) for v in order),
        users=tuple(tuple(sorted(pos[w] for w in index.successors[v])) for v in order),
        cost=tuple(index.node(v).compute_ms for v in order),
        mem_bytes=tuple(mem),
        workspace_bytes=tuple(index.node(v).workspace_bytes for v in order),
        recomputable=tuple(index.node(v).recomputable for v in order),
        fixed_bytes=step.start_bytes,
        budget_bytes=budget_bytes,
        held_bytes=(
            tuple(step.held_from_node.get(v, 0) for v in order) if step.held_from_node else ()
        ),
    )


@dataclass(frozen=True)
class StagedSchedule:
    computed: tuple[frozenset[int], ...]  # stage t -> positions computed in stage t (t included)
    retained: tuple[frozenset[int], ...]  # stage t -> positions resident when stage t begins

    def cost(self, problem: RematProblem) -> float:
        return math.fsum(problem.cost[i] for stage in self.computed for i in stage)


def staged_actions(problem: RematProblem, sched: StagedSchedule) -> tuple[list[Action], int]:
    """Actions of a staged schedule and its peak bytes by the simulator's accounting.

    Raises ValueError when the schedule is not valid (an input not resident, a value retained
    that was not available, a resident value computed again).
    """
    n = problem.n
    ids, deps, users, mem = problem.node_ids, problem.deps, problem.users, problem.mem_bytes
    actions: list[Action] = []
    resident: set[int] = set()
    live = problem.fixed_bytes
    peak = live
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
            live += mem[k] + (problem.held(k) if k == t else 0)  # t's first computation
            peak = max(peak, live + problem.workspace_bytes[k])
            for i in (*deps[k], k):
                later = any(k < j <= t and j in stage for j in users[i])
                if i in resident and i not in keep_next and not later:
                    actions.append(free(ids[i]))
                    resident.discard(i)
                    live -= mem[i]
        for i in sorted(resident - keep_next):
            actions.append(free(ids[i]))
            resident.discard(i)
            live -= mem[i]
    return actions, peak


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
