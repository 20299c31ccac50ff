"""planner.runtime.apply with host copies (O/P/D): gradient parity with eager PyTorch, device
memory as
the simulator predicts it, host bytes exactly as it counts them, and bad plans refused in one
line naming the action. CPU: copies are real copies into a host pool the storage tracker does
not count as device memory. The CUDA path is tested in test_runtime_offload_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import Traced, eager_step, planned_step, traced  # noqa: E402

from planner.core.errors import InputError  # noqa: E402
from planner.core.plan import Action, Plan, PlanKind, PlanStatus, actions_from_text  # noqa: E402
from planner.core.resources import resources_preset  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.runtime.measure import measure_step, training_step  # noqa: E402
from planner.runtime.offload_plans import boundary_offload, boundary_offload_plan  # noqa: E402
from planner.sim.simulator import simulate  # noqa: E402
from planner.solvers.baselines import chen_sqrt, store_all  # noqa: E402

TOLERANCE = 1.10  # measured device peak vs predicted, as tests/runtime/test_runtime_memory.py
RESOURCES = resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})
_CACHE: dict[str, Traced] = {}


def model_named(name: str) -> Traced:
    if name not in _CACHE:
        _CACHE[name] = traced(name)
    return _CACHE[name]


def plain_plan(t: Traced, actions: list[Action]) -> Plan:
    sim = simulate(t.graph, actions)
    return Plan(graph_hash=t.graph.content_hash(), method="hand", status=PlanStatus.feasible,
                actions=actions, predicted=sim.predicted())


def assert_parity(t: Traced, module: object, seed: int) -> None:
    buffers = {k: v.clone() for k, v in t.model.named_buffers()}
    ref_loss, ref_grads = eager_step(t.model, t.inputs, seed=seed)
    with torch.no_grad():  # BatchNorm running statistics: both steps start from the same
        for k, v in t.model.named_buffers():
            v.copy_(buffers[k])
    loss, grads = planned_step(module, t.inputs, seed=seed)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("model", ["mlp", "cnn", "gpt"])
@pytest.mark.slow
def test_offload_everything_matches_eager_and_the_simulator(model: str) -> None:
    t = model_named(model)
    graph = t.graph
    plan = boundary_offload_plan(graph, store_all(graph), RESOURCES)
    assert plan.kind is PlanKind.offload and plan.predicted is not None
    offloaded = [a.node for a in plan.actions if a.op.value == "offload"]
    assert len(offloaded) >= 5, plan.text
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    assert_parity(t, module, seed=11)

    stats = module.last_transfer_stats
    expected = sum(graph.index.storage_bytes[v] for v in offloaded)
    assert stats.offloads == stats.prefetches == len(offloaded)
    assert stats.d2h_bytes == stats.h2d_bytes == expected  # each storage once, each way
    assert stats.host_peak_bytes == plan.predicted.host_peak_bytes  # host bytes: exact

    measured = measure_step(training_step(module, t.inputs), t.model)
    predicted = plan.predicted.peak_bytes - graph.fixed_bytes
    assert measured.activation_peak_bytes <= predicted * TOLERANCE, (measured, predicted)
    # the host copies really leave the device: well below the same step keeping everything
    keep = apply(t.model, plain_plan(t, store_all(graph)), t.inputs, trace=t.trace)
    kept = measure_step(training_step(keep, t.inputs), t.model)
    assert measured.activation_peak_bytes < 0.75 * kept.activation_peak_bytes, (measured, kept)


def test_offload_with_recomputation_replays_dropout() -> None:
    """chen-sqrt's checkpoints offloaded (remat+offload): gradients as eager, dropout replayed."""
    t = model_named("gpt")
    graph = t.graph
    plan = boundary_offload_plan(graph, chen_sqrt(graph), RESOURCES, lead=2)
    assert plan.kind is PlanKind.remat_offload and plan.predicted is not None
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    assert_parity(t, module, seed=5)
    assert module.last_computations > len(graph.nodes)  # recomputation did run
    stats = module.last_transfer_stats
    assert stats.offloads > 0 and stats.host_peak_bytes == plan.predicted.host_peak_bytes
    measured = measure_step(training_step(module, t.inputs), t.model)
    assert measured.activation_peak_bytes <= (
        plan.predicted.peak_bytes - graph.fixed_bytes) * TOLERANCE
    other_loss, _ = planned_step(module, t.inputs, seed=6)  # another mask, another loss
    same_loss, _ = planned_step(module, t.inputs, seed=5)
    assert not torch.equal(other_loss, same_loss)


def test_host_pool_is_reused_across_steps() -> None:
    t = model_named("mlp")
    plan = boundary_offload_plan(t.graph, store_all(t.graph), RESOURCES)
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    planned_step(module, t.inputs, seed=1)
    pool = module.program.streams_for(torch.device("cpu")).pool
    first = pool.stats()
    for seed in (2, 3):
        planned_step(module, t.inputs, seed=seed)
    again = pool.stats()
    assert again.allocations == first.allocations and again.allocated_bytes == first.allocated_bytes
    assert again.in_use_bytes == 0  # every host copy returned at the end of the step
    assert first.allocated_bytes <= module.last_transfer_stats.d2h_bytes


def _refusal(t: Traced, text: str) -> str:
    plan = Plan(graph_hash=t.graph.content_hash(), method="hand", status=PlanStatus.feasible,
                actions=actions_from_text(text), resources=RESOURCES)
    with pytest.raises(InputError) as info:
        apply(t.model, plan, t.inputs, trace=t.trace)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_bad_plans_are_refused_naming_the_action() -> None:
    t = model_named("mlp")
    base = store_all(t.graph)
    good = boundary_offload_plan(t.graph, base, RESOURCES)
    # as written, before the frees are placed after their copies: "O v F v" side by side
    tokens = [str(a) for a in boundary_offload(t.graph, base)]
    o = next(i for i, tok in enumerate(tokens) if tok.startswith("O"))
    v = tokens[o][1:]
    # a prefetch of something never offloaded
    never = tokens[:o] + tokens[o + 2:]  # drop "O v F v"; the later "P v" is now bad
    p = never.index(f"P{v}")
    message = _refusal(t, " ".join(never))
    assert f"action {p} (P{v})" in message and "no host copy" in message, message
    # a use after the drop, without a prefetch
    used = [tok for tok in tokens if tok != f"P{v}"]
    d = used.index(f"D{v}")
    used.insert(o + 2, f"D{v}")
    del used[d + 1]
    message = _refusal(t, " ".join(used))
    assert f"input node {v} " in message and "is not resident" in message, message
    assert f"host copy dropped at action {o + 2}" in message, message
    # offloading needs a host tier
    no_host = good.model_copy(update={"resources": resources_preset("h100-pcie")})
    with pytest.raises(InputError, match=r"action \d+ \(O\d+\): moving memory to the host needs"):
        apply(t.model, no_host, t.inputs, trace=t.trace)
    # a host budget smaller than what the plan parks
    small = RESOURCES.model_copy(update={"host_memory_bytes": 64})
    with pytest.raises(InputError, match="host memory overflows"):
        apply(t.model, good, t.inputs, trace=t.trace, resources=small)


def test_registered_offload_planners_run_like_eager() -> None:
    """Plans of every registered offload planner (solvers/offload): parity on the GPT."""
    from planner.engine.offload_checks import is_offload_method
    from planner.engine.registry import BUILTIN_METHODS
    from planner.engine.solve import solve

    names = [m for m in BUILTIN_METHODS if is_offload_method(m)]
    assert names, "no offload planner is registered"  # renamed or removed: fail, not skip
    t = model_named("gpt")
    budget = int(0.8 * t.store_all_peak)
    ran = 0
    for name in names:
        plan = solve(t.graph, budget, name, time_limit_s=3, resources=RESOURCES)
        if plan.status not in (PlanStatus.optimal, PlanStatus.feasible):
            continue
        module = apply(t.model, plan, t.inputs, trace=t.trace)
        assert_parity(t, module, seed=9)
        ran += 1
    assert ran, f"no offload planner found a plan within {budget} bytes"


def test_tuple_elements_of_other_nodes_survive_the_round_trip() -> None:
    """A dropout offloaded before its mask's own node is computed: the mask lives only in the
    op's tuple, so it travels with it, and computing the mask node from the reloaded tuple
    gives eager's mask (and gradients)."""
    from planner.runtime.offload_program import OffloadProgram

    t = model_named("gpt")
    graph = t.graph
    probe = OffloadProgram(t.trace, store_all(graph), None)
    tuple_nodes = [g for g, layout in probe.layouts.items()
                   if any(isinstance(k, str) for m in layout.members for k in m.elements or ())]
    assert tuple_nodes, "the GPT should have dropout / layer-norm tuples"
    text = []
    for a in store_all(graph):
        text.append(str(a))
        if a.op.value == "compute" and a.node in tuple_nodes:
            v = a.node
            text += [f"O{v}", f"F{v}", f"P{v}", f"D{v}"]
    plan = Plan(graph_hash=graph.content_hash(), method="hand", status=PlanStatus.feasible,
                actions=actions_from_text(" ".join(text)), resources=RESOURCES)
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    assert_parity(t, module, seed=21)
    stats = module.last_transfer_stats
    own = sum(graph.index.storage_bytes[v] for v in tuple_nodes)
    assert stats.offloads == len(tuple_nodes) and stats.d2h_bytes > own  # elements came along

    # The element's node held at the offload, freed before the prefetch and computed again from
    # the reloaded tuple: the offload copies it all the same.
    element_of = {probe.group_of[k]: g for g, layout in probe.layouts.items()
                  for m in layout.members for k in m.elements or () if isinstance(k, str)}
    text = []
    redone = 0
    for a in store_all(graph):
        text.append(str(a))
        owner = element_of.get(a.node)
        if a.op.value == "compute" and owner is not None and redone < 3:
            g = a.node
            text += [f"O{owner}", f"F{owner}", f"F{g}", f"P{owner}", f"D{owner}", f"C{g}"]
            redone += 1
    plan = Plan(graph_hash=graph.content_hash(), method="hand", status=PlanStatus.feasible,
                actions=actions_from_text(" ".join(text)), resources=RESOURCES)
    assert plan.kind is PlanKind.remat_offload
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    assert_parity(t, module, seed=22)


def test_tensors_lifted_into_the_graph_are_read_where_needed() -> None:
    """`torch.tensor(2.0)` in a forward becomes a get_attr constant of the joint graph (Hugging
    Face GPT-2 on CUDA makes one): recomputed, offloaded or kept, its readers find it."""

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.b(torch.relu(self.a(x))) * torch.tensor(2.0)).sum()

    from planner.solvers.baselines import recompute_all
    from planner.tracing.api import trace

    model, inputs = Scaled(), (torch.randn(4, 8),)
    result = trace(model, inputs, dropout_masks="graph")
    assert any(n.op == "get_attr" for n in result.joint.graph.nodes)
    t = Traced("scaled", model, inputs, result, 0, 0)
    graph = result.graph
    for plan in (plain_plan(t, recompute_all(graph)),
                 boundary_offload_plan(graph, store_all(graph), RESOURCES, min_bytes=0)):
        assert_parity(t, apply(model, plan, inputs, trace=result), seed=1)
