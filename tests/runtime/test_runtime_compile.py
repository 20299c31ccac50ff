"""planner.runtime.compile: a plan's save/recompute decisions executed by torch.compile.

Fast tests run the plan -> policy mapping and the partition through AOTAutograd with inductor's
decompositions and min-cut partitioner but no code generation (`_partition_only`); the two slow
tests compile with inductor (30-60 s each on CPU) and compare with eager.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy  # noqa: E402

from planner.core.errors import InputError  # noqa: E402
from planner.core.graph import Phase  # noqa: E402
from planner.core.plan import Plan, compute, offload, prefetch  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.compiled import (  # noqa: E402
    OpPolicy,
    compiled_schedule,
    decide,
    execution,
    functional_variant,
)
from planner.runtime.compiled import compile as compile_plan  # noqa: E402
from planner.tracing.api import trace  # noqa: E402
from planner.tracing.capture import compute_loss  # noqa: E402

aten = torch.ops.aten


def tiny_mlp() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    return model, (torch.randn(4, 16),)


@pytest.fixture(scope="module")
def gpt() -> tuple[nn.Module, tuple[Any, ...], Any]:
    model, inputs = tiny_gpt(dropout=0.0)
    return model, inputs, trace(model, inputs, dropout_masks="graph")


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
    yield
    if old is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def store_all(graph: Any) -> Plan:
    return solve(graph, 10**15, "store-all")


def with_actions(plan: Plan, actions: list[Any], method: str) -> Plan:
    return plan.model_copy(update={"actions": list(actions), "method": method})


def heavy_plan(graph: Any, every: int = 2) -> tuple[Plan, frozenset[int]]:
    """Every `every`-th recomputable forward value recomputed once in the backward (the plan
    the compiled step runs: expressible)."""
    forward = [n.id for n in graph.nodes if n.phase is not Phase.backward and n.recomputable]
    recomputed = frozenset(forward[::every])
    return with_actions(store_all(graph), compiled_schedule(graph, recomputed), "heavy"), recomputed


def eager_step(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, dict[str, Any], int]:
    """Loss, gradients and the bytes autograd saves (parameters aside) of one eager step."""
    model.zero_grad(set_to_none=True)
    saved: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: (saved.append(x), x)[1], lambda x: x):
        loss = compute_loss(model(*inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, saved_bytes(saved, model)


def saved_bytes(saved: list[Any], model: nn.Module) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in saved}
    return sum(b for ptr, b in storages.items() if ptr not in params)


def compiled_step(module: Any, model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, Any, int]:
    model.zero_grad(set_to_none=True)
    saved: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: (saved.append(x), x)[1], lambda x: x):
        loss = module(*inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, saved_bytes(saved, model)


def assert_same_step(loss: Any, grads: dict[str, Any], ref_loss: Any, ref: dict[str, Any]) -> None:
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    assert grads.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-4, atol=1e-4, msg=name)


class PartitionOnly:
    """AOTAutograd with inductor's decompositions and min-cut partitioner, no code generation:
    the partition inductor would compile, recorded."""

    def __init__(self) -> None:
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        from torch._inductor.decomposition import select_decomp_table

        self.graphs: dict[str, Any] = {}

        def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
            fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
            self.graphs.update(joint=joint, fw=fw, bw=bw)
            return fw, bw

        def boxed(gm: Any, _example: Any) -> Any:
            from functorch.compile import make_boxed_func

            return make_boxed_func(gm)

        self.backend = aot_autograd(fw_compiler=boxed, bw_compiler=boxed, partition_fn=partition,
                                    decompositions=select_decomp_table())

    def saved_tags(self) -> list[Any]:
        """The recompute tag of every value the forward saves for the backward."""
        fw, joint = self.graphs["fw"], self.graphs["joint"]
        joint_nodes = {n.name: n for n in joint.graph.nodes}
        output = next(n for n in fw.graph.nodes if n.op == "output")
        names = [o.name for o in output.args[0][1:] if o is not None]  # [0]: the loss
        return [joint_nodes[n].meta.get("recompute") for n in names if n in joint_nodes]

    def recomputed_in_backward(self) -> int:
        joint_nodes = {n.name: n for n in self.graphs["joint"].graph.nodes}
        return sum(
            1 for n in self.graphs["bw"].graph.nodes
            if n.name in joint_nodes
            and joint_nodes[n.name].meta.get("recompute") is CheckpointPolicy.MUST_RECOMPUTE
        )


# -- decisions and refusals (no compile) --------------------------------------------------------
def test_store_all_saves_every_value_the_backward_reads(gpt: Any) -> None:
    graph = gpt[2].graph
    decisions = decide(store_all(graph), graph)
    assert decisions.exact and not decisions.recomputed
    backward_reads = {
        u for n in graph.nodes if n.phase is Phase.backward for u in graph.index.predecessors[n.id]
        if graph.node(u).phase is not Phase.backward
    }
    assert decisions.saved == backward_reads


def test_expressible_plan_decided_exactly_and_simulated_as_itself(gpt: Any) -> None:
    graph = gpt[2].graph
    plan, recomputed = heavy_plan(graph)
    decisions = decide(plan, graph)
    assert decisions.exact
    # The schedule recomputes only what the backward reads: a subset of the request, not empty.
    assert decisions.recomputed and decisions.recomputed <= recomputed
    assert not decisions.saved & decisions.recomputed
    run = execution(plan, graph, decisions)
    assert (run.peak_bytes, run.compute_cost) == (run.plan_peak_bytes, run.plan_compute_cost)
    assert "exact" in run.describe()


def test_recompute_in_the_forward_refused_in_one_line(gpt: Any) -> None:
    graph = gpt[2].graph
    plan = solve(graph, 10**15, "recompute-all")
    with pytest.raises(InputError) as e:
        decide(plan, graph)
    text = str(e.value)
    assert "\n" not in text and "recomputed in the forward" in text and "project=True" in text


def test_projection_reports_its_cost(gpt: Any) -> None:
    graph = gpt[2].graph
    plan = solve(graph, 10**15, "recompute-all")
    decisions = decide(plan, graph, project=True)
    assert not decisions.exact and any("in the forward" in p for p in decisions.projected)
    run = execution(plan, graph, decisions)
    # Recomputing once instead of once per use: less compute, more memory than the plan.
    assert run.compute_cost < run.plan_compute_cost
    assert run.peak_bytes > run.plan_peak_bytes
    assert "projected" in run.describe()


def test_recompute_twice_in_the_backward_refused(gpt: Any) -> None:
    graph = gpt[2].graph
    plan, _ = heavy_plan(graph)
    actions = list(plan.actions)
    first = next(a.node for a in reversed(actions) if a.op.value == "compute"
                 and graph.node(a.node).phase is not Phase.backward)
    actions.append(compute(first))  # a second recomputation in the backward (not simulated)
    with pytest.raises(InputError, match=r"recomputed 2 times in the backward"):
        decide(with_actions(plan, actions, "twice"), graph)


def test_offload_refused_naming_the_action(gpt: Any) -> None:
    graph = gpt[2].graph
    plan = store_all(graph)
    actions = [*plan.actions[:1], offload(plan.actions[0].node), prefetch(plan.actions[0].node)]
    with pytest.raises(InputError, match=r"action O\d+ copies to the host.*runtime.apply"):
        decide(with_actions(plan, actions, "offload"), graph)


def test_infeasible_plan_refused(gpt: Any) -> None:
    model, inputs, traced = gpt
    plan = store_all(traced.graph).model_copy(update={"status": "infeasible", "actions": []})
    with pytest.raises(InputError, match="only a feasible or optimal plan"):
        compile_plan(model, plan, inputs, trace=traced)


def test_policy_mismatch_is_one_line(gpt: Any) -> None:
    policy = OpPolicy(gpt[2], frozenset())
    policy.reset()
    policy(None, aten.cos.default, torch.zeros(1))
    with pytest.raises(InputError) as e:
        policy.check()
    assert "\n" not in str(e.value) and "aten.cos" in str(e.value)


def test_in_place_ops_match_their_functional_form() -> None:
    assert functional_variant(aten.add_.Tensor) is aten.add.Tensor
    assert functional_variant(aten.relu_.default) is aten.relu.default
    assert functional_variant(aten.addmm.default) is aten.addmm.default


# -- the partition inductor runs (AOTAutograd, no code generation) -----------------------------
def test_partition_follows_the_plan(gpt: Any) -> None:
    model, inputs, traced = gpt
    ref_loss, ref, _ = eager_step(model, inputs)
    saved_bytes_of: dict[str, int] = {}
    plans = {"store-all": store_all(traced.graph), "heavy": heavy_plan(traced.graph)[0]}
    for name, plan in plans.items():
        torch._dynamo.reset()
        backend = PartitionOnly()
        module = compile_plan(model, plan, inputs, trace=traced, backend=backend.backend)
        loss, grads, saved_bytes_of[name] = compiled_step(module, model, inputs)
        assert_same_step(loss, grads, ref_loss, ref)
        recomputed = module.execution.decisions.recomputed
        calls = module.policy.calls
        assert calls and all(node is not None for _, node, _ in calls)
        must = CheckpointPolicy
        for _op, node, policy in calls:  # every traced forward op tagged as the plan says
            assert policy is (must.MUST_RECOMPUTE if node in recomputed else must.MUST_SAVE)
        tags = backend.saved_tags()
        assert CheckpointPolicy.MUST_RECOMPUTE not in tags  # nothing recomputed is saved
        if name == "heavy":
            assert backend.recomputed_in_backward() > 0
        else:
            assert backend.recomputed_in_backward() == 0
    assert saved_bytes_of["heavy"] < saved_bytes_of["store-all"]


# -- inductor (slow: one compile each) ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("which", ["mlp", "gpt"])
def test_inductor_matches_eager_and_saves_less(which: str, gpt: Any) -> None:
    if which == "gpt":
        model, inputs, traced = gpt
    else:
        model, inputs = tiny_mlp()
        traced = trace(model, inputs, dropout_masks="graph")
    ref_loss, ref, eager_saved = eager_step(model, inputs)
    plan, _ = heavy_plan(traced.graph, every=1)  # every forward value the backward reads
    torch._dynamo.reset()
    module = compile_plan(model, plan, inputs, trace=traced)
    loss, grads, compiled_saved = compiled_step(module, model, inputs)
    assert_same_step(loss, grads, ref_loss, ref)
    assert module.execution.decisions.recomputed
    assert any(p is CheckpointPolicy.MUST_RECOMPUTE for _, _, p in module.policy.calls)
    assert compiled_saved < eager_saved  # what the plan recomputes is not saved
    loss_again, grads_again, _ = compiled_step(module, model, inputs)  # no recompilation needed
    assert_same_step(loss_again, grads_again, ref_loss, ref)
