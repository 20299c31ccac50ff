"""Chain plans as plan.json actions: the simulator agrees with the chain model exactly on chains
given directly, and never exceeds it (nor the budget) on linearised graphs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from planner.core.graph import Edge, Graph, Node, Phase
from planner.core.plan import PlanStatus
from planner.core.synthetic import training_graph
from planner.engine.solve import solve
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.chain.layout import chain_graph, chain_of_graph
from planner.solvers.chain.linearize import linearize
from planner.solvers.chain.model import Chain, Stage
from planner.solvers.chain.revolve import revolve_ops
from planner.solvers.chain.rotor import solve_rotor
from planner.solvers.chain.sequence import chen_sqrt_ops, run_sequence, store_all_ops
from planner.solvers.chain.translate import translate

CHAIN_METHODS = ("rotor", "revolve", "chain-chen-sqrt")


def random_chain(seed: int, length: int) -> Chain:
    rng = random.Random(seed)
    prev = rng.randint(1, 9) * 1000 + rng.randint(0, 99)
    x0, stages = prev, []
    for i in range(length):
        x = rng.randint(1, 9) * 1000 + rng.randint(0, 99)
        stages.append(
            Stage(
                forward_ms=rng.uniform(0.5, 5),
                backward_ms=rng.uniform(1, 10),
                output_bytes=x,
                saved_bytes=x + rng.randint(0, 20) * 1000,
                forward_tmp_bytes=rng.randint(0, 3) * 500,
                backward_tmp_bytes=rng.randint(0, 3) * 500,
                grad_input_bytes=prev,
                name=f"block{i}",
                forward_all_tmp_bytes=None if i % 3 else rng.randint(0, 6) * 500,
            )
        )
        prev = x
    return Chain(tuple(stages), input_bytes=x0, fixed_bytes=12345)


@pytest.mark.parametrize("seed", range(6))
def test_chain_sequences_simulate_exactly(seed: int) -> None:
    chain = random_chain(seed, 4 + 3 * seed)
    graph, layout = chain_graph(chain)
    assert chain_of_graph(graph) == chain
    length = chain.length
    sequences = [store_all_ops(length), chen_sqrt_ops(length), revolve_ops(length, 2)]
    full = run_sequence(chain, sequences[0]).peak_bytes
    assert store_all_peak_bytes(graph) == full  # store-all on the graph is F_all everywhere
    for fraction in (0.8, 0.6, 0.4):
        sol = solve_rotor(chain, int(fraction * full))
        if sol.ops is not None:
            sequences.append(list(sol.ops))
    for ops in sequences:
        predicted = run_sequence(chain, ops)
        sim = simulate(graph, translate(graph, layout, ops))
        assert sim.peak_bytes == predicted.peak_bytes
        assert sim.compute_cost == pytest.approx(predicted.cost)
        assert sim.computations - 1 == sum(  # the input node runs once
            len(layout.forward[o.stage]) if o.kind.value == "Fall" else 1
            for o in ops
            if o.kind.value in ("Fall", "Fck", "Fn", "B")
        )


@pytest.mark.parametrize("method", CHAIN_METHODS)
@pytest.mark.parametrize("fraction", [1.0, 0.7, 0.5])
def test_methods_on_chain_graph(method: str, fraction: float) -> None:
    chain = random_chain(42, 16)
    graph, _ = chain_graph(chain)
    budget = int(fraction * store_all_peak_bytes(graph))
    plan = solve(graph, budget, method)
    if plan.status is PlanStatus.infeasible:
        assert method != "rotor" or fraction < 0.6
        return
    assert plan.status in (PlanStatus.feasible, PlanStatus.optimal), plan.notes
    assert plan.predicted is not None and plan.predicted.peak_bytes <= budget
    predicted = plan.details["chain_predicted"]
    assert plan.predicted.peak_bytes == predicted["peak_bytes"]
    assert plan.predicted.compute_cost == pytest.approx(predicted["compute_cost"])
    assert plan.details["block_plan_text"].startswith("blocks 0")


def check_linearised(graph: Graph, fractions: tuple[float, ...]) -> int:
    """Rotor plans on a linearised graph: simulator ≤ chain model ≤ budget; returns plans."""
    full = store_all_peak_bytes(graph)
    plans = 0
    for fraction in fractions:
        budget = int(fraction * full)
        plan = solve(graph, budget, "rotor", options={"refine": 1})
        if plan.status is PlanStatus.infeasible:
            assert plan.actions == [] and plan.details["smallest_feasible_bytes"] > budget
            continue
        assert plan.status in (PlanStatus.feasible, PlanStatus.optimal), plan.notes
        model = plan.details["chain_predicted"]
        assert plan.predicted is not None
        assert plan.predicted.peak_bytes <= model["peak_bytes"] <= budget
        assert plan.predicted.compute_cost == pytest.approx(model["compute_cost"])
        assert plan.details["chain"]["source"] == "linearized"
        plans += 1
    return plans


@pytest.mark.parametrize("skip", [0, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_linearised_synthetic_graphs(skip: int, seed: int) -> None:
    graph = training_graph(14, skip=skip, seed=seed)
    lin = linearize(graph)
    assert lin.chain.length >= 2
    assert check_linearised(graph, (1.0, 0.9, 0.8, 0.7)) >= 1


def test_linearised_plain_chain_is_exact() -> None:
    """Without skips each layer is a segment: model and simulator agree to the byte."""
    graph = training_graph(10, seed=3)
    lin = linearize(graph)
    assert lin.chain.length == 10
    full = store_all_peak_bytes(graph)
    for fraction in (1.0, 0.8, 0.6):
        sol = solve_rotor(lin.chain, int(fraction * full), refine=2)
        assert sol.ops is not None
        sim = simulate(graph, translate(graph, lin.layout, sol.ops))
        assert sim.peak_bytes == sol.peak_bytes


@pytest.mark.parametrize(
    "name", ["vgg16_b256_train.json", "vgg_unet_b32_train.json", "mobilenet_b512_train.json"]
)
def test_linearised_corpus_graphs(shared_checkmate_dir: Path, name: str) -> None:
    from planner.engine.inputs import load_graph

    path = shared_checkmate_dir / name
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    graph = load_graph(path)
    assert check_linearised(graph, (1.0, 0.9, 0.8)) >= 2


def _with_side_value(layers: int) -> Graph:
    """A training chain whose every layer (forward and backward) also reads one small value
    computed at the start (a Llama's rotary tables or mask): no joint survives it."""
    base = training_graph(layers, seed=5)
    side_id = len(base.nodes)
    side = Node(id=side_id, name="mask", op="mask", phase=Phase.forward, compute_ms=0.5,
                output_bytes=4096)
    readers = [n.id for n in base.nodes if n.op in ("layer", "layer_backward")]
    edges = list(base.edges) + [Edge(source=side_id, target=r) for r in readers]
    return base.model_copy(update={"nodes": [side, *base.nodes], "edges": edges, "order": None})


def test_side_values_become_the_chain_input() -> None:
    graph = _with_side_value(20)
    lin = linearize(graph)
    mask = next(n.id for n in graph.nodes if n.name == "mask")
    assert lin.layout.joint[0] == (mask,)
    assert lin.chain.input_bytes == 4096
    assert lin.chain.length >= 18  # one segment per layer or close (before: a single segment)
    full = store_all_peak_bytes(graph)
    for fraction in (0.9, 0.7, 0.5):
        sol = solve_rotor(lin.chain, int(fraction * full), refine=2)
        if sol.ops is None:
            continue
        sim = simulate(graph, translate(graph, lin.layout, sol.ops))
        assert sim.peak_bytes <= sol.peak_bytes <= int(fraction * full)
    assert check_linearised(graph, (0.9, 0.7, 0.5)) >= 2
