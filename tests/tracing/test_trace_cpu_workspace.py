"""CPU convolutions' and batch norms' own buffers (planner.tracing.cpu_workspace): a CPU trace
records what they allocate and free while they run as the nodes' `workspace_bytes`, measured in
one profiler session; a store-all step run by planner.runtime.apply and counted by the
allocator's own records then stays at most its prediction, within 1 %."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
from torch import nn  # noqa: E402

from planner.tracing import cpu_workspace  # noqa: E402
from planner.tracing.cpu_workspace import (  # noqa: E402
    MARK_BASE,
    measure_cpu_workspace_bytes,
    window_peaks,
)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)  # the same call as conv2: measured once
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv3(torch.relu(self.conv2(x))))
        return nn.functional.cross_entropy(self.head(x.mean(dim=(2, 3))), target)


def _conv_net() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return ConvNet(), (torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,)))


def _mark(i: int) -> int:
    return MARK_BASE + 2 * i


def test_window_peaks_split_the_records_at_the_markers() -> None:
    deltas = [
        100,  # before any window: only raises the base
        _mark(0), -_mark(0),
        64, 512, -512,  # op 0: an output of 64, 512 transient above it
        _mark(1), -_mark(1),
        -64, 4096, -4096,  # between windows: not counted
        _mark(2), -_mark(2),
        -100, 32,  # op 1: frees first, peaks below its start
        _mark(3), -_mark(3),
    ]
    assert window_peaks(deltas) == {0: 576, 1: 0}


def test_window_peaks_ignore_an_unclosed_window() -> None:
    assert window_peaks([_mark(0), -_mark(0), 1000]) == {}


def test_conv_and_batch_norm_nodes_get_workspace_and_others_none() -> None:
    from planner.tracing.capture import capture_joint

    torch.set_num_threads(1)
    model, inputs = _conv_net()
    cap = capture_joint(model, inputs, None)
    ws = measure_cpu_workspace_bytes(cap.gm)
    targets = {n.name: n.target for n in cap.gm.graph.nodes}
    aten = torch.ops.aten
    convs = [n for n, t in targets.items() if t == aten.convolution.default]
    backwards = [n for n, t in targets.items() if t == aten.convolution_backward.default]
    assert len(convs) == 3 and len(backwards) == 3
    assert all(ws.get(n, 0) > 0 for n in convs + backwards), ws
    assert all("conv" in str(targets[n]) or "batch_norm" in str(targets[n]) for n in ws), ws
    assert ws[convs[1]] == ws[convs[2]]  # identical calls


def test_identical_calls_are_measured_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.tracing.capture import capture_joint

    torch.set_num_threads(1)
    model, inputs = _conv_net()
    cap = capture_joint(model, inputs, None)
    monkeypatch.setattr(cpu_workspace, "_PEAKS", {})
    sessions: list[int] = []
    measure = cpu_workspace._measure_peaks

    def counted(todo: dict[Any, Any]) -> dict[Any, int]:
        sessions.append(len(todo))
        return measure(todo)

    monkeypatch.setattr(cpu_workspace, "_measure_peaks", counted)
    first = measure_cpu_workspace_bytes(cap.gm)
    second = measure_cpu_workspace_bytes(cap.gm)
    assert first == second
    n_measured = sum(1 for n in cap.gm.graph.nodes if cpu_workspace.is_measured(n.target))
    assert len(sessions) == 1 and sessions[0] < n_measured, (sessions, n_measured)


def test_under_an_open_profiler_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.tracing.capture import capture_joint

    model, inputs = _conv_net()
    cap = capture_joint(model, inputs, None)
    monkeypatch.setattr(cpu_workspace, "_PEAKS", {})
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert measure_cpu_workspace_bytes(cap.gm) == {}


def _store_all_measured_and_predicted(model: nn.Module, inputs: tuple[Any, ...]
                                      ) -> tuple[int, int, Any]:
    from planner.engine.solve import solve
    from planner.runtime.apply import apply
    from planner.tracing.allocator_events import measure_allocator_peak
    from planner.tracing.api import trace

    result = trace(model, inputs)
    graph = result.graph
    plan = solve(graph, 10**12, "store-all")
    planned = apply(model, plan, inputs, trace=result)

    def step() -> None:
        loss = planned(*inputs)
        loss.backward()

    model.zero_grad(set_to_none=True)
    step()  # warm: lazily made state is not the step's
    model.zero_grad(set_to_none=True)
    measured = measure_allocator_peak(step).peak_bytes
    assert plan.predicted is not None
    return measured, plan.predicted.peak_bytes - graph.fixed_bytes, graph


def test_a_conv_nets_store_all_step_is_at_most_its_prediction_within_1_percent() -> None:
    torch.set_num_threads(1)
    model, inputs = _conv_net()
    measured, predicted, graph = _store_all_measured_and_predicted(model, inputs)
    convs = [n for n in graph.nodes if n.op in ("aten.convolution", "aten.convolution_backward")]
    assert convs and all(n.workspace_bytes > 0 for n in convs)
    assert measured <= predicted <= 1.01 * measured, (measured, predicted)


def test_a_densenets_store_all_step_is_at_most_its_prediction_within_1_percent() -> None:
    from planner import zoo

    torch.set_num_threads(1)
    model, inputs = zoo.densenet(batch_size=2, image=16, growth=8, blocks=(2, 2), stem=8)
    measured, predicted, _graph = _store_all_measured_and_predicted(model, inputs)
    assert measured <= predicted <= 1.01 * measured, (measured, predicted)
