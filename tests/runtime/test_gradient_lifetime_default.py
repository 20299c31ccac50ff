"""The gradient lifetime follows torch's defaults: traced "backward" unless the loop accumulates,
and a planned module says (once) when the training loop keeps gradients otherwise."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.errors import InputError  # noqa: E402
from planner.core.graph import Graph  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime import apply  # noqa: E402
from planner.runtime.grad_lifetime import GradientLifetimeWarning  # noqa: E402
from planner.tracing.api import trace  # noqa: E402


def tiny_mlp() -> Any:
    """The CLI's factory (MODULE:FACTORY) for these tests."""
    return zoo.mlp(batch_size=4, in_features=16, hidden=32, depth=2)


def _gradient_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# -- tracing ---------------------------------------------------------------------------------
def test_default_trace_writes_backward_explicitly() -> None:
    model, inputs = tiny_gpt(context=16, dim=32, vocab=64)
    graph = trace(model, inputs).graph
    assert graph.model_state is not None
    assert graph.model_state.gradient_lifetime == "backward"
    # Written even by a dump that leaves defaults out: the file states it.
    dumped = graph.model_dump(mode="json", exclude_unset=True)
    assert dumped["model_state"]["gradient_lifetime"] == "backward"
    # The gradients are charged from their nodes on, so the fixed bytes leave them out.
    step = trace(model, inputs, gradient_lifetime="step").graph
    held = graph.index.model_state_resident[1]
    assert sum(held.values()) == _gradient_bytes(model)
    assert step.fixed_bytes - graph.fixed_bytes == _gradient_bytes(model)


@pytest.mark.parametrize(
    "lifetime, steps, expected",
    [(None, 1, "backward"), (None, 4, "step"), ("step", 1, "step"), ("backward", 1, "backward"),
     ("step", 8, "step")],
)
def test_accumulation_means_step(lifetime: str | None, steps: int, expected: str) -> None:
    model, inputs = tiny_mlp()
    graph = trace(model, inputs, gradient_lifetime=lifetime,
                  grad_accumulation_steps=steps).graph
    assert graph.model_state is not None and graph.model_state.gradient_lifetime == expected


@pytest.mark.parametrize(
    "lifetime, steps, needles",
    [
        ("backward", 4, ("--gradient-lifetime backward", "--grad-accumulation-steps 4")),
        (None, 0, ("--grad-accumulation-steps 0",)),
        ("forever", 1, ("--gradient-lifetime forever",)),
    ],
)
def test_bad_lifetime_is_one_line(
    lifetime: str | None, steps: int, needles: tuple[str, ...]
) -> None:
    model, inputs = tiny_mlp()
    with pytest.raises(InputError) as err:
        trace(model, inputs, gradient_lifetime=lifetime, grad_accumulation_steps=steps)
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_graph_without_the_field_means_step() -> None:
    """Files written before the tracer stated the lifetime held gradients all step."""
    model, inputs = tiny_mlp()
    doc = trace(model, inputs).graph.model_dump(mode="json")
    del doc["model_state"]["gradient_lifetime"]
    old = Graph.model_validate(doc)
    assert old.model_state is not None and old.model_state.gradient_lifetime == "step"


def _cli_trace(monkeypatch: Any, capsys: Any, *args: str) -> tuple[int, str]:
    from planner.cli.main import main

    target = f"{__name__}:tiny_mlp"
    monkeypatch.setattr(sys, "argv", ["planner-cli", "trace", target, "--json", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_cli_default_and_accumulation(monkeypatch: Any, capsys: Any, tmp_path: Any) -> None:
    for args, expected in (((), "backward"), (("--grad-accumulation-steps", "2"), "step")):
        out = tmp_path / "graph.json"
        code, err = _cli_trace(monkeypatch, capsys, "-o", str(out), *args)
        assert code == 0, err
        state = json.loads(out.read_text())["model_state"]
        assert state["gradient_lifetime"] == expected, args
    code, err = _cli_trace(monkeypatch, capsys, "--gradient-lifetime", "backward",
                           "--grad-accumulation-steps", "3")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "--gradient-lifetime backward" in lines[0]
    assert "--grad-accumulation-steps 3" in lines[0]


# -- the planned module checks the loop ------------------------------------------------------
def _planned(lifetime: str) -> tuple[Any, Any, Any, Graph]:
    model, inputs = tiny_mlp()
    graph = trace(model, inputs, dropout_masks="graph", gradient_lifetime=lifetime).graph
    plan = solve(graph, 10**12, "store-all")
    return apply(model, plan, inputs), model, inputs, graph


def _steps(module: Any, inputs: Any, set_to_none: list[bool]) -> list[str]:
    """Training steps (zero_grad before each, as said) -> the lifetime warnings they raised."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for none in set_to_none:
            optimizer.zero_grad(set_to_none=none)
            module(*inputs).backward()
            optimizer.step()
    return [str(w.message) for w in caught if issubclass(w.category, GradientLifetimeWarning)]


def test_backward_graph_in_a_loop_that_keeps_gradients_warns_once() -> None:
    module, model, inputs, _ = _planned("backward")
    said = _steps(module, inputs, [False] * 5)
    assert len(said) == 1, said
    expected = _gradient_bytes(model)  # every .grad, all of them charged from backward on
    assert "underestimates" in said[0] and f"up to {expected} B " in said[0]
    assert "--gradient-lifetime step" in said[0] and "set_to_none=True" in said[0]
    assert "\n" not in said[0]
    # Kept gradients are what the loop does: releasing them later says nothing new.
    assert _steps(module, inputs, [True, True, False]) == []


def test_step_graph_in_a_loop_that_releases_gradients_warns_once() -> None:
    module, model, inputs, graph = _planned("step")
    said = _steps(module, inputs, [True] * 5)
    assert len(said) == 1, said
    assert graph.model_state is not None
    expected = graph.model_state.total().gradients_bytes
    assert expected == _gradient_bytes(model)
    assert "pessimistic" in said[0] and f"up to {expected} B " in said[0]
    assert "--gradient-lifetime backward" in said[0]
    # The loop changes to keeping them: that agrees with the graph, so nothing more is said.
    assert _steps(module, inputs, [False] * 3) == []


@pytest.mark.parametrize("lifetime, set_to_none", [("backward", True), ("step", False)])
def test_agreeing_loop_says_nothing(lifetime: str, set_to_none: bool) -> None:
    module, _, inputs, _ = _planned(lifetime)
    assert _steps(module, inputs, [set_to_none] * 4) == []


def test_accumulation_loop_on_a_fresh_model_agrees_with_step() -> None:
    """zero_grad(set_to_none=True) every 2 micro-steps: the first step of each cycle has no
    gradient (nor has a fresh model's first step), but the loop keeps them: no warning."""
    module, _, inputs, _ = _planned("step")
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for micro in range(6):
            if micro % 2 == 0:
                optimizer.zero_grad(set_to_none=True)
            module(*inputs).backward()
            if micro % 2 == 1:
                optimizer.step()
    assert not [w for w in caught if issubclass(w.category, GradientLifetimeWarning)]


def test_a_change_of_loop_is_said_again() -> None:
    """Step graph: releasing gradients is pessimistic (said); a new check after reset that
    sees them kept agrees (quiet); a backward graph then sees them kept (said)."""
    module, _, inputs, _ = _planned("step")
    assert len(_steps(module, inputs, [True] * 3)) == 1
    module.gradient_lifetime_check.reset()
    assert _steps(module, inputs, [False] * 3) == []
    back, _, inputs, _ = _planned("backward")
    assert len(_steps(back, inputs, [True, True, False, False])) == 1


def test_eval_forward_is_not_a_step() -> None:
    module, _, inputs, _ = _planned("backward")
    _steps(module, inputs, [True])  # a backward has run: the next step start counts
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    module.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            module(*inputs)
    assert not caught
    module.train()


# -- the agent ---------------------------------------------------------------------------------
def test_agent_traces_what_the_loop_keeps(tmp_path: Any) -> None:
    from planner.runtime.agent import plan_for

    model, inputs = tiny_mlp()
    fresh = plan_for(model, inputs, 10**12, cache_dir=tmp_path, method="store-all", log_steps=0)
    report = fresh.agent_report
    assert report.graph.model_state.gradient_lifetime == "backward"
    # Gradients held from backward on: the calibration figure includes the ones it made.
    assert report.measured_activation_peak_bytes == report.measured_peak_bytes
    # A loop that keeps gradients: said on the report and as a warning, once.
    said = _steps(fresh, inputs, [False] * 3)
    assert len(said) == 1 and said[0] in report.messages

    # Parameters that hold gradients at the call: the agent plans for "step".
    assert any(p.grad is not None for p in model.parameters())
    kept = plan_for(model, inputs, 10**12, cache_dir=tmp_path, method="store-all", log_steps=0)
    assert kept.agent_report.graph.model_state.gradient_lifetime == "step"
    assert any("hold gradients already" in m for m in kept.agent_report.messages)
    measured = kept.agent_report
    assert measured.measured_activation_peak_bytes < measured.measured_peak_bytes
    assert _steps(kept, inputs, [False] * 3) == []
    with pytest.raises(InputError, match="--grad-accumulation-steps 2"):
        plan_for(model, inputs, 10**12, cache_dir=tmp_path, method="store-all",
                 gradient_lifetime="backward", grad_accumulation_steps=2)
