"""A graph records the options it was traced with, a plan solved on it keeps them, and
`runtime.apply(model, "plan.json", inputs)` re-traces once with them (issue 27, item 1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from runtime_helpers import eager_step, planned_step  # noqa: E402

from planner.core.io import load_graph, load_plan  # noqa: E402
from planner.runtime.apply import PlanMismatch, apply  # noqa: E402

FACTORY = """
from planner import zoo


def gpt():
    return zoo.gpt(batch_size=2, context=8, dim=16, layers=1, vocab=32)


def deeper():
    return zoo.gpt(batch_size=2, context=8, dim=16, layers=2, vocab=32)
"""


def _cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """planner-cli in process (its own main), as tests/cli/test_trace_cli.py runs it."""
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code in (0, None)


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's path: trace with --optimizer adam --gradient-lifetime backward (eager-sized
    dropout masks, the CLI's default), then solve; the folder holding gpt.json and plan.json."""
    folder = tmp_path_factory.mktemp("trace_options")
    (folder / "tinyzoo_a27.py").write_text(FACTORY)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        _cli(mp, "trace", "tinyzoo_a27:gpt", "--optimizer", "adam", "--gradient-lifetime",
             "backward", "-o", "gpt.json")
        _cli(mp, "solve", "gpt.json", "--budget", "100%", "--method", "recompute-all",
             "-o", "plan.json")
    return folder


def _model(folder: Path, name: str = "gpt") -> tuple[Any, tuple[Any, ...]]:
    sys.path.insert(0, str(folder))
    try:
        import tinyzoo_a27
    finally:
        sys.path.pop(0)
    made: tuple[Any, tuple[Any, ...]] = getattr(tinyzoo_a27, name)()
    return made


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    import planner.tracing.api as api

    calls: list[dict[str, Any]] = []
    real = api.trace

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "trace", counting)
    return calls


def _assert_matches_eager(module: Any, model: Any, inputs: tuple[Any, ...]) -> None:
    ref_loss, ref_grads = eager_step(model, inputs, seed=11)
    loss, grads = planned_step(module, inputs, seed=11)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")


def test_graph_and_plan_record_the_trace_options(planned: Path) -> None:
    graph = load_graph(planned / "gpt.json")
    options = graph.trace_options
    assert options is not None
    assert options["optimizer"] == "adam" and options["gradient_lifetime"] == "backward"
    assert options["dropout_masks"] == "eager" and options["level"] == "op"
    plan = load_plan(planned / "plan.json")
    assert plan.trace_options == options
    assert plan.graph_summary is not None
    assert plan.graph_summary.nodes == len(graph.nodes) and plan.graph_summary.batch_size == 2


def test_apply_with_only_the_plan_path_traces_once_and_matches_eager(
    planned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, inputs = _model(planned)
    calls = _count_traces(monkeypatch)
    module = apply(model, str(planned / "plan.json"), inputs)
    assert len(calls) == 1, calls
    assert calls[0]["optimizer"] == "adam" and calls[0]["dropout_masks"] == "graph"
    assert module.graph.model_state.optimizer == "adam"
    _assert_matches_eager(module, model, inputs)


def test_apply_with_the_plans_eager_masked_graph(planned: Path) -> None:
    """graph= of an eager-masks trace: checked on the eager-sized view of the same capture (the
    masks the runtime keeps are bool, smaller)."""
    model, inputs = _model(planned)
    graph = load_graph(planned / "gpt.json")
    module = apply(model, str(planned / "plan.json"), inputs, graph=graph)
    assert any(n.random for n in graph.nodes)
    _assert_matches_eager(module, model, inputs)


def test_old_plan_and_graph_without_the_fields_still_apply(
    planned: Path, tmp_path: Path
) -> None:
    document = json.loads((planned / "plan.json").read_text())
    for field in ("trace_options", "graph_summary"):
        document.pop(field)
    old = tmp_path / "old_plan.json"
    old.write_text(json.dumps(document))
    model, inputs = _model(planned)
    module = apply(model, old, inputs)  # the hash tells: optimizer adam, eager masks
    _assert_matches_eager(module, model, inputs)
    graph_doc = json.loads((planned / "gpt.json").read_text())
    graph_doc["metadata"]["extra"].pop("trace_options")
    (tmp_path / "old_graph.json").write_text(json.dumps(graph_doc))
    assert load_graph(tmp_path / "old_graph.json").trace_options is None


def test_another_model_is_refused_naming_what_differs(planned: Path) -> None:
    model, inputs = _model(planned, "deeper")
    with pytest.raises(PlanMismatch) as e:
        apply(model, str(planned / "plan.json"), inputs)
    message = str(e.value)
    assert "\n" not in message
    assert "the plan is for gpt (" in message and "the model structure differs" in message
    assert "parameter tensors: 17 in the plan's graph, 29 now" in message
