"""Kernels' own buffers: on CUDA an op can allocate and free memory while it runs (attention and
loss backward, sorts, reductions) that no output shows; `trace(costs="measure")` on a GPU
records it as the node's `workspace_bytes`, which the simulator charges while the node runs.
On CPU neither the runtime's accounting nor the allocator exposes such buffers: nothing is
recorded there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from planner.tracing.costs import measure_fx_workspace_bytes  # noqa: E402


def _module(fn: object) -> SimpleNamespace:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> object:
            return fn(x)  # type: ignore[operator]

    return SimpleNamespace(gm=torch.fx.symbolic_trace(M()))


def test_cpu_records_no_workspace() -> None:
    cap = _module(lambda x: torch.ops.aten.sort.default(x))
    assert measure_fx_workspace_bytes(cap, [torch.randn(10_000)]) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measures_a_sorts_buffers_and_none_for_an_add() -> None:
    x = torch.randn(1 << 22, device="cuda")
    sort = measure_fx_workspace_bytes(_module(lambda t: torch.ops.aten.sort.default(t)), [x])
    add = measure_fx_workspace_bytes(_module(lambda t: torch.ops.aten.add.Tensor(t, t)), [x])
    assert sum(sort.values()) > 0, sort  # the radix sort's temporary storage
    assert add == {}, add


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_measured_cuda_trace_carries_workspaces() -> None:
    from planner import zoo
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=4, context=256, dim=256, layers=2, vocab=2048, dropout=0.1)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    graph = trace(model, inputs, costs="measure", dropout_masks="graph", repeats=1).graph
    with_workspace = [n for n in graph.nodes if n.workspace_bytes > 0]
    assert with_workspace, "no node of a GPT's step allocates a buffer of its own on CUDA?"
    assert all(n.workspace_bytes < 2**31 for n in with_workspace)
