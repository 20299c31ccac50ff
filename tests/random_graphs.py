"""Random small training graphs and plans for the memory-model property tests (shared by
tests/sim/test_memory_model_props.py, tests/sim/test_ledger.py, tests/sim/test_held_lower_bound.py
and tests/solvers/test_remat_retention.py)."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from planner.core.graph import Edge, FixedMemory, Graph, Node, Phase
from planner.core.model_state import ModelState, ParameterState
from planner.core.plan import Action, compute, free
from planner.solvers.remat.lp_rounding import rebuild
from planner.solvers.remat.problem import RematProblem

UNIT = 4  # bytes: every size a multiple, as real tensors are


def random_training_graph(seed: int, forward: int, *, views: bool = True,
                          lifetime: str = "backward") -> Graph:
    rng = random.Random(seed)
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []

    def add(phase: Phase, inputs: list[int], **extra: object) -> int:
        nid = len(nodes)
        nodes.append(Node(id=nid, name=f"{phase.value}{nid}", phase=phase,
                          compute_ms=float(rng.randint(1, 6)),
                          output_bytes=UNIT * rng.randint(1, 12),
                          workspace_bytes=UNIT * rng.choice((0, 0, 0, 3)), **extra))  # type: ignore[arg-type]
        edges.extend((u, nid) for u in dict.fromkeys(inputs))
        return nid

    fwd: list[int] = []
    for i in range(forward):
        inputs = [fwd[-1]] if fwd else []
        if len(fwd) > 1 and rng.random() < 0.4:
            inputs.append(rng.choice(fwd[:-1]))
        extra: dict[str, object] = {}
        if views and fwd and rng.random() < 0.2:
            extra["alias_of"] = fwd[-1]  # a view of its input
        elif i > 0 and rng.random() < 0.15:
            extra["recomputable"] = False
        fwd.append(add(Phase.forward, inputs, **extra))
    loss = add(Phase.loss, [fwd[-1]])
    upstream = loss
    grads: list[int] = []
    for i in reversed(range(forward)):
        inputs = [upstream, fwd[i]] + ([fwd[i - 1]] if i else [])
        upstream = add(Phase.backward, inputs)
        grads.append(upstream)
        if rng.random() < 0.3:  # e.g. a weight's transpose: backward, no gradient input
            grads.append(add(Phase.backward, [fwd[rng.randrange(forward)]]))
    params = [
        ParameterState(name=f"p{k}", bytes=UNIT * rng.randint(1, 6),
                       gradient_node=g if rng.random() < 0.8 else None)
        for k, g in enumerate(grads)
    ]
    return Graph(
        nodes=nodes,
        edges=[Edge(source=u, target=v) for u, v in edges],
        fixed=FixedMemory(inputs_bytes=UNIT * rng.randint(0, 5)),
        model_state=ModelState(parameters=params, gradient_lifetime=lifetime),  # type: ignore[arg-type]
    )


graphs = st.builds(
    random_training_graph,
    seed=st.integers(0, 10**6),
    forward=st.integers(2, 6),
    views=st.booleans(),
    lifetime=st.sampled_from(("backward", "backward", "step")),
)
tiny_graphs = st.builds(
    random_training_graph,
    seed=st.integers(0, 10**6),
    forward=st.integers(2, 3),
    views=st.booleans(),
    lifetime=st.just("backward"),
)


def has_views(graph: Graph) -> bool:
    return any(n.alias_of is not None for n in graph.nodes)


def random_schedule(problem: RematProblem, rng: random.Random):
    retained = [{i for i in range(t) if rng.random() < 0.5} for t in range(problem.n)]
    return rebuild(problem, retained)


def random_valid_plan(graph: Graph, rng: random.Random) -> list[Action]:
    """A random valid compute/free plan: topological first computations, random frees of values
    no longer needed and random early frees recomputed later (when recomputable)."""
    index = graph.index
    order = index.topological_order
    pos = {v: i for i, v in enumerate(order)}
    last_use = {v: max((pos[w] for w in index.successors[v]), default=pos[v]) for v in order}
    actions: list[Action] = []
    resident: set[int] = set()

    def ensure(v: int) -> None:  # compute v (recomputing missing inputs first)
        for u in index.predecessors[v]:
            if u not in resident:
                ensure(u)
        actions.append(compute(v))
        resident.add(v)

    for t, v in enumerate(order):
        ensure(v)
        for u in sorted(resident):
            if u == v:
                continue
            node = index.node(u)
            if last_use[u] <= t or (node.recomputable and rng.random() < 0.3):
                if last_use[u] > t and not _recomputable_closure(graph, u):
                    continue
                actions.append(free(u))
                resident.discard(u)
    for u in sorted(resident):
        actions.append(free(u))
    return actions


def _recomputable_closure(graph: Graph, v: int) -> bool:
    """Whether v and all its ancestors are recomputable (v can always be computed again)."""
    index = graph.index
    stack, seen = [v], {v}
    while stack:
        x = stack.pop()
        if not index.node(x).recomputable:
            return False
        for u in index.predecessors[x]:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return True
