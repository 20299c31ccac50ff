"""A model that computes its own loss (a transformers model given labels returns `.loss`):
no op runs outside the model, yet the graph must have its loss node, or a solver may place a
backward op that reads only the incoming gradient before the loss, which the runtime refuses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.tracing.api import trace  # noqa: E402


class OwnLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        # divided as the HF Trainer divides by num_items_in_batch: its backward reads only the
        # incoming gradient
        return {"loss": self.b(torch.relu(self.a(x))).pow(2).mean() / 3.0, "logits": x}


def test_the_models_own_loss_is_the_graphs_loss_node() -> None:
    model, x = OwnLoss(), torch.randn(4, 8)
    result = trace(model, (x,))
    graph = result.graph
    losses = [n for n in graph.nodes if n.phase.value == "loss"]
    assert [n.name for n in losses] == ["div"]
    assert all(n.phase.value == "forward" for n in graph.nodes if n.id < losses[0].id)
    model.zero_grad(set_to_none=True)
    model(x)["loss"].backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    module = apply(model, solve(graph, 10**15, "recompute-all"), (x,), trace=result)
    module(x).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[k])
