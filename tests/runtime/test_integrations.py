"""planner.runtime.integrations: the Hugging Face Trainer and Lightning callbacks train tiny
models under a budget that store-all exceeds, with the gradients of eager training, the planner's
figures in the logs, and the plan cached across runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from planner.core.errors import InputError  # noqa: E402
from planner.engine.request import ResolvedRequest  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.integrations.planned_forward import (  # noqa: E402
    PlannedForward,
    checked_budget,
    split_call,
)

KEYS = ("planner/peak_bytes", "planner/predicted_peak_bytes")
PLAN = {"method": "auto", "time_limit_s": 1.0}


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts in-process solves (the agent's ResolvedRequest.solve)."""
    calls: list[int] = []
    original = ResolvedRequest.solve

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.budget_bytes)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ResolvedRequest, "solve", counted)
    return calls


def _assert_same_grads(eager: list[dict[str, Any]], planned: list[dict[str, Any]]) -> None:
    assert len(eager) == len(planned) == 3
    for ref, got in zip(eager, planned, strict=True):
        assert ref.keys() == got.keys()
        for name, grad in ref.items():
            torch.testing.assert_close(got[name], grad)


def _check_plan(report: Any) -> None:
    """The plan fits the budget, which store-all's peak exceeds; the step measured as planned."""
    store_all = solve(report.graph, 10**15, "store-all").predicted.peak_bytes
    assert report.plan.predicted.peak_bytes <= report.requested_budget_bytes < store_all
    assert report.measured_activation_peak_bytes is not None


# -- Hugging Face Trainer ---------------------------------------------------------------------
def _hf_run(tmp_path: Path, name: str, callbacks: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it (the integrations extra)
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Grads(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                                  **kwargs: Any) -> None:
            self.steps.append({n: p.grad.clone() for n, p in model.named_parameters()})

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)  # dropout on: masks replayed by the plan
    ids = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path / name), report_to=[], use_cpu=True, max_steps=3,
        per_device_train_batch_size=2, logging_steps=1, save_strategy="no", disable_tqdm=True,
    )
    grads = Grads()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, grads])
    trainer.train()
    return trainer, grads.steps


@pytest.mark.slow
def test_hf_trainer_plans_under_budget_with_eager_gradients(tmp_path: Path,
                                                            solves: list[int]) -> None:
    from planner.runtime.integrations.hf_trainer import PlannerCallback

    _, eager = _hf_run(tmp_path, "eager", [])
    cache = tmp_path / "plans"
    callback = PlannerCallback(0.8, cache_dir=cache, **PLAN)
    trainer, planned = _hf_run(tmp_path, "planned", [callback])
    _assert_same_grads(eager, planned)
    assert solves, "the first run plans"
    (report,) = callback.reports
    assert report.source == "local"
    _check_plan(report)
    steps = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3]
    for entry in steps:
        assert math.isfinite(entry["loss"])
        assert all(key in entry for key in KEYS), entry
        # what the step allocated, measured, against the prediction (the Trainer's few extra
        # bytes: the loss scaling and the gradient norm)
        assert entry["planner/peak_bytes"] <= 1.05 * entry["planner/predicted_peak_bytes"]
    assert [r.step for r in callback.history] == [1, 2, 3]
    assert "forward" not in trainer.model.__dict__  # the model's own forward is back

    # A second run: the cached plan, no solve.
    solves.clear()
    again = PlannerCallback(0.8, cache_dir=cache, **PLAN)
    _, planned_again = _hf_run(tmp_path, "again", [again])
    assert solves == []
    assert [r.source for r in again.reports] == ["cache"]
    _assert_same_grads(eager, planned_again)

    # Another budget (in bytes) plans again.
    budget_bytes = report.requested_budget_bytes - 2048
    other = PlannerCallback(budget_bytes, cache_dir=cache, **PLAN)
    _hf_run(tmp_path, "other", [other])
    assert solves and solves[0] == budget_bytes
    assert other.reports[0].requested_budget_bytes == budget_bytes


def test_hf_model_without_labels_is_refused() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).train()
    planned = PlannedForward(model, 0.8)
    planned.install()
    with pytest.raises(InputError, match="without labels"):
        model(input_ids=torch.zeros(2, 16, dtype=torch.long))
    assert planned.modules == {}


def test_a_loss_computed_by_the_model_is_the_graphs_loss() -> None:
    """transformers divides the summed loss by the Trainer's num_items_in_batch: the backward
    of that division reads only the incoming gradient, so without a loss node in the graph a
    plan could run it before the loss (the runtime then refuses the plan)."""
    transformers = pytest.importorskip("transformers")
    from planner.runtime.integrations.planned_forward import _CallWith
    from planner.tracing.api import trace

    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.zeros(2, 16, dtype=torch.long)
    layout, tensors = split_call((), {"input_ids": ids, "labels": ids,
                                      "num_items_in_batch": torch.tensor(30.0)})
    graph = trace(_CallWith(model, layout), tensors, dropout_masks="graph").graph
    (loss,) = graph.index.loss_nodes
    order = graph.index.order_predecessors
    backward = [n.id for n in graph.nodes if n.phase.value == "backward"]
    unordered = [v for v in backward if not order[v]]
    assert backward and not unordered, [graph.describe(v) for v in unordered]


def test_hf_logging_steps_are_measured() -> None:
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from planner.runtime.integrations.hf_trainer import _will_log

    args = SimpleNamespace(logging_first_step=False, logging_strategy="steps")
    state = SimpleNamespace(global_step=0, logging_steps=5)
    assert [_will_log(args, SimpleNamespace(global_step=g, logging_steps=5))
            for g in range(6)] == [False, False, False, False, True, False]
    args.logging_first_step = True
    assert _will_log(args, state)
    args.logging_strategy = "epoch"
    assert not _will_log(args, SimpleNamespace(global_step=4, logging_steps=5))


# -- Lightning --------------------------------------------------------------------------------
def _lightning_run(callbacks: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    pl = pytest.importorskip("lightning.pytorch")
    from planner import zoo

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, _ = zoo.gpt(batch_size=2, context=8, dim=16, layers=1, vocab=32)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.model(*batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Grads(pl.Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            self.steps.append({n: p.grad.clone() for n, p in pl_module.named_parameters()})

    idx = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(idx, idx.roll(-1, 1)), batch_size=2)
    module, grads = Module(), Grads()
    torch.manual_seed(1)
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
        callbacks=[*callbacks, grads],
    )
    trainer.fit(module, data)
    return trainer, grads.steps


@pytest.mark.slow
def test_lightning_plans_under_budget_with_eager_gradients(tmp_path: Path,
                                                           solves: list[int]) -> None:
    pytest.importorskip("lightning")
    from planner.runtime.integrations.lightning import PlannerCallback

    _, eager = _lightning_run([])
    callback = PlannerCallback(0.8, cache_dir=tmp_path, **PLAN)
    trainer, planned = _lightning_run([callback])
    _assert_same_grads(eager, planned)
    assert solves
    (report,) = callback.reports
    assert report.source == "local"
    assert report.graph.model_state.gradient_lifetime == "step"  # Lightning's zero_grad timing
    _check_plan(report)
    assert all(key in trainer.callback_metrics for key in KEYS)
    assert [r.step for r in callback.history] == [1, 2, 3]
    for record in callback.history:
        assert record.peak_bytes <= 1.05 * record.predicted_peak_bytes
    assert math.isfinite(float(trainer.callback_metrics["planner/peak_bytes"]))

    solves.clear()
    again = PlannerCallback(0.8, cache_dir=tmp_path, **PLAN)
    _, planned_again = _lightning_run([again])
    assert solves == []
    assert [r.source for r in again.reports] == ["cache"]
    _assert_same_grads(eager, planned_again)


def test_lightning_names_the_module_to_plan() -> None:
    pytest.importorskip("lightning")
    from planner.runtime.integrations.lightning import planned_module_of

    two = nn.Module()
    two.a, two.b = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(InputError, match="name the module to plan"):
        planned_module_of(two, None)
    with pytest.raises(InputError, match="no such submodule; its children: a, b"):
        planned_module_of(two, "c")
    assert planned_module_of(two, "b") is two.b
    assert planned_module_of(two, "") is two


# -- the shared parts -------------------------------------------------------------------------
def test_budgets_in_bytes_or_fractions() -> None:
    assert checked_budget(4096, "X") == 4096  # an int is bytes, as everywhere
    assert checked_budget(1, "X") == 1  # one byte (no plan fits: said at the first step)
    assert checked_budget(1.0, "X") == 1.0  # all of the store-all peak
    assert checked_budget(0.5, "X") == 0.5
    assert checked_budget("80%", "X") == "80%"
    for bad in (1.5, True, 0, "2 apples"):
        with pytest.raises(InputError, match=r"^X\(budget=\.\.\.\): "):
            checked_budget(bad, "X")


def test_call_signature_decides_the_plan() -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    layout, tensors = split_call((ids,), {"labels": ids, "use_cache": False})
    assert len(tensors) == 1  # one tensor passed twice is one input
    assert layout.rebuild(tensors) == ([ids], {"labels": ids, "use_cache": False})
    other, _ = split_call((ids,), {"labels": ids.clone(), "use_cache": False})
    longer, _ = split_call((torch.zeros(2, 5, dtype=torch.long),), {"labels": ids})
    assert len({layout.key, other.key, longer.key}) == 3
    with pytest.raises(InputError, match="argument cache is a dict"):
        split_call((ids,), {"cache": {"k": ids}})


def test_evaluation_runs_the_model_itself_and_uninstall_restores_it() -> None:
    model = nn.Linear(3, 1)
    planned = PlannedForward(model, 0.8)
    planned.install()
    x = torch.ones(2, 3)
    model.eval()
    assert model(x).shape == (2, 1)
    model.train()
    with torch.no_grad():
        assert model(x).shape == (2, 1)
    assert planned.modules == {}  # nothing planned
    planned.uninstall()
    assert "forward" not in model.__dict__
