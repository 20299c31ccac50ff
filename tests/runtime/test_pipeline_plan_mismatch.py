"""A pipeline plan made for another model is refused in one line naming the model it is for,
before any torch.fx tracing (issue 27, item 2)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402

from planner.core.errors import InputError  # noqa: E402
from planner.core.plan import Plan  # noqa: E402
from planner.engine.partition import partition_plan  # noqa: E402
from planner.runtime.pipeline import build_pipeline  # noqa: E402
from planner.tracing.api import trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _gpt(layers: int) -> tuple[Any, tuple[Any, ...]]:
    made: tuple[Any, tuple[Any, ...]] = tiny_gpt(layers=layers, dropout=0.0)
    return made


@pytest.fixture(scope="module")
def two_layer_plan() -> Plan:
    """A 2-rank plan partitioned from a 2-layer GPT's graph (no graph summary: as
    `planner-cli partition` writes it)."""
    model, inputs = _gpt(2)
    graph = trace(model, inputs).graph
    plan: Plan = partition_plan(graph, devices=2, microbatches=2).plan
    return plan.model_copy(update={"graph_summary": None, "trace_options": None})


def _fails_fx_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any torch.fx tracing of the model fails the test: the check must come first."""
    import planner.runtime.pipeline_split as split

    def no_trace(*args: Any) -> Any:
        raise AssertionError("torch.fx tracing ran before the plan was checked")

    monkeypatch.setattr(split, "trace_model", no_trace)


def test_plan_for_fewer_blocks_names_the_blocks(
    two_layer_plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, inputs = _gpt(4)
    _fails_fx_free(monkeypatch)
    with pytest.raises(InputError) as e:
        build_pipeline(model, two_layer_plan, inputs)
    message = str(e.value)
    assert "\n" not in message
    assert "this plan is for another model" in message
    assert "2 of this model's 4 blocks h.*" in message and "h.2 and h.3" in message


def test_plan_with_a_graph_summary_names_the_model(
    two_layer_plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planner.core.plan import graph_reference

    small, small_inputs = _gpt(2)
    plan = two_layer_plan.model_copy(update=graph_reference(trace(small, small_inputs).graph))
    model, inputs = _gpt(4)
    _fails_fx_free(monkeypatch)
    with pytest.raises(InputError) as e:
        build_pipeline(model, plan, inputs)
    message = str(e.value)
    assert message.startswith("plan: this plan is for GPT (") and "batch 2" in message
    assert "not for this model (GPT, " in message


def test_example_says_it_in_one_line_before_fx(
    two_layer_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """examples/pipeline_torchrun.py --plan with a plan for a 2-layer GPT on its 8-layer GPT:
    exit 2 and one line (one gloo process standing in for torchrun)."""
    from planner.runtime.pipeline_launch import free_port

    path = tmp_path / "plan.json"
    path.write_text(two_layer_plan.model_dump_json())
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    _fails_fx_free(monkeypatch)
    import pipeline_torchrun

    code = pipeline_torchrun.main(["--plan", str(path), "--dim", "16", "--context", "8",
                                   "--vocab", "32"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "this plan is for another model" in lines[0], err
    sys.modules.pop("pipeline_torchrun", None)
