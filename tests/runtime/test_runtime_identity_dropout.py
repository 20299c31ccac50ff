"""Dropout with p = 0 is the identity in eager; the joint graph's clone of it is sized as a view
by the tracer, and the runtime runs it as that alias (no copy), with gradients equal to eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from models import attention  # noqa: E402
from runtime_helpers import eager_step, planned_step  # noqa: E402

from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.tracing import trace  # noqa: E402


@pytest.mark.parametrize("method", ["store-all", "recompute-all"])
def test_identity_dropout_runs_as_an_alias(method: str) -> None:
    torch.manual_seed(0)
    model = attention(0.0)
    inputs = (torch.randn(4, 8, 16),)
    result = trace(model, inputs, dropout_masks="graph")
    assert result.details["identity_dropout_fx_names"]
    plan = solve(result.graph, 10**12, method)
    module = apply(model, plan, inputs, trace=result)
    ref_loss, ref_grads = eager_step(model, inputs, seed=3)
    loss, grads = planned_step(module, inputs, seed=3)
    torch.testing.assert_close(loss, ref_loss)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad)
    program = module.program
    assert program.identity_fx == frozenset(result.details["identity_dropout_fx_names"])
    (name,) = program.identity_fx
    code = program.forward_code
    line = next(ln for ln in code.source.splitlines() if ln.strip().startswith(f"V[{name!r}] ="))
    constants = code.function.__globals__["C"]
    index = int(line.split("C[", 1)[1].split("]", 1)[0])
    assert constants[index] is torch.ops.aten.alias.default, line  # no copy of the input
