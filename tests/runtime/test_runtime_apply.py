"""planner.runtime.apply: gradient parity with eager PyTorch under plans of every method, and
refusals."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import (  # noqa: E402
    Traced,
    eager_step,
    plan_or_skip,
    planned_step,
    traced,
)

from planner.core.errors import InputError  # noqa: E402
from planner.core.plan import PlanStatus  # noqa: E402
from planner.runtime.apply import PlanMismatch, apply  # noqa: E402

MODELS = ("mlp", "cnn", "gpt")
_CACHE: dict[str, Traced] = {}


def model_named(name: str) -> Traced:
    if name not in _CACHE:
        _CACHE[name] = traced(name)
    return _CACHE[name]


def budgets(t: Traced, method: str) -> list[int]:
    """Two budgets: the store-all peak and one between it and recompute-all's peak.

    Baselines ignore the budget, so they get the store-all peak and twice that instead.
    """
    hi, lo = t.store_all_peak, t.recompute_all_peak
    if method in ("store-all", "chen-sqrt"):
        return [hi, 2 * hi]
    return [hi, (hi + lo) // 2]


@pytest.mark.parametrize("which", [0, 1], ids=["budget-high", "budget-low"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", ["store-all", "chen-sqrt", "rotor", "milp", "auto"])
@pytest.mark.slow
def test_gradients_match_eager(model: str, method: str, which: int) -> None:
    t = model_named(model)
    for budget in budgets(t, method)[which : which + 1]:
        plan = plan_or_skip(t, method, budget)
        module = apply(t.model, plan, t.inputs, trace=t.trace)
        buffers_before = {k: v.clone() for k, v in t.model.named_buffers()}
        ref_loss, ref_grads = eager_step(t.model, t.inputs, seed=1234)
        ref_buffers = {k: v.clone() for k, v in t.model.named_buffers()}
        for k, v in t.model.named_buffers():
            v.copy_(buffers_before[k])
        loss, grads = planned_step(module, t.inputs, seed=1234)
        torch.testing.assert_close(loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")
        for name, value in t.model.named_buffers():  # BatchNorm running statistics
            torch.testing.assert_close(value, ref_buffers[name], msg=lambda m, n=name: f"{n}: {m}")


def test_recomputation_happens_and_dropout_replays() -> None:
    """recompute-all recomputes the dropout ops in backward; gradients still match eager."""
    t = model_named("gpt")
    assert any(n.random for n in t.graph.nodes), "the GPT graph should contain dropout"
    plan = plan_or_skip(t, "recompute-all", t.recompute_all_peak)
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    ref_loss, ref_grads = eager_step(t.model, t.inputs, seed=7)
    loss, grads = planned_step(module, t.inputs, seed=7)
    assert module.last_computations > len(t.graph.nodes)  # recomputation did run
    torch.testing.assert_close(loss, ref_loss)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad)
    # Another seed gives another mask: the replay is not a constant.
    other_loss, _ = planned_step(module, t.inputs, seed=8)
    assert not torch.equal(other_loss, loss)


def test_module_shares_parameters_and_trains() -> None:
    t = traced("mlp")
    plan = plan_or_skip(t, "chen-sqrt", 2 * t.store_all_peak)
    module = apply(t.model, plan.model_dump(mode="json"), t.inputs, trace=t.trace)
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in t.model.named_parameters()]
    assert all(a is b for a, b in zip(module.parameters(), t.model.parameters(), strict=True))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        optimizer.zero_grad(set_to_none=True)
        loss = module(*t.inputs)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    # Evaluation runs the model itself (dropout off); training resumes under the plan.
    module.eval()
    with torch.no_grad():
        eval_loss = module(*t.inputs)
    assert eval_loss.shape == () and not eval_loss.requires_grad
    module.train()
    loss = module(*t.inputs)
    loss.backward()
    with pytest.raises(RuntimeError, match="one backward per forward"):
        loss.backward()


def test_plan_for_another_graph_is_refused(tmp_path: object) -> None:
    t = traced("mlp")
    plan = plan_or_skip(t, "store-all", t.store_all_peak)
    bigger = (torch.randn(8, 16), torch.randint(0, 10, (8,)))
    # Without a trace, apply traces again and the hash is reproducible: accepted.
    assert apply(t.model, plan, t.inputs).plan is plan
    # Another batch size: the model traces to another graph.
    with pytest.raises(PlanMismatch, match="now traces to"):
        apply(t.model, plan, bigger)
    # With the plan's graph, the error says what differs.
    with pytest.raises(PlanMismatch, match="batch size 4 in the plan's graph, 8 now"):
        apply(t.model, plan, bigger, graph=t.graph)
    # Another dtype.
    double_inputs = (t.inputs[0].double(), t.inputs[1])
    with pytest.raises(PlanMismatch, match="dtype float32 in the plan's graph, float64 now"):
        apply(t.model.double(), plan, double_inputs, graph=t.graph)
    t.model.float()
    # A plan whose hash was tampered with.
    other = plan.model_copy(update={"graph_hash": "sha256:" + "0" * 64})
    with pytest.raises(PlanMismatch, match="sha256:0000"):
        apply(t.model, other, t.inputs, trace=t.trace)
    # A module applied for one shape refuses another at call time.
    module = apply(t.model, plan, t.inputs, trace=t.trace)
    with pytest.raises(PlanMismatch, match=r"input .*shape \[8, 16\] float32 now.*\[4, 16\]"):
        module(*bigger)


def test_unusable_plans_are_refused() -> None:
    t = traced("mlp")
    plan = plan_or_skip(t, "store-all", t.store_all_peak)
    infeasible = plan.model_copy(update={"status": PlanStatus.infeasible})
    with pytest.raises(InputError, match="only a feasible or optimal plan"):
        apply(t.model, infeasible, t.inputs, trace=t.trace)
    broken = plan.model_copy(update={"actions": plan.actions[1:]})
    with pytest.raises(InputError, match="does not run on the traced graph"):
        apply(t.model, broken, t.inputs, trace=t.trace)
    with pytest.raises(InputError, match="no such file"):
        apply(t.model, "/nonexistent/plan.json", t.inputs, trace=t.trace)
