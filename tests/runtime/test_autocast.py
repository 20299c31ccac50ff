"""Mixed precision (issue 25, item 3): steps trained under torch.autocast(bfloat16) with fp32
weights are traced with their casts, planned, applied with the eager autocast step's loss and
gradients bit for bit (dropout included), and their memory predicted; the CLI's --autocast and
the one-line refusals. CPU here; the same on CUDA behind the `gpu` marker."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from models import tiny_gpt  # noqa: E402

from planner import zoo  # noqa: E402
from planner.core.errors import InputError  # noqa: E402
from planner.engine.solve import solve  # noqa: E402
from planner.runtime.apply import apply  # noqa: E402
from planner.runtime.measure import measure_step, training_step  # noqa: E402
from planner.tracing.api import trace  # noqa: E402
from planner.tracing.capture import compute_loss  # noqa: E402

BF16 = torch.bfloat16
TOLERANCE = 1.10  # measured activation peak vs prediction, as tests/runtime/test_runtime_memory.py


GPT: dict[str, Any] = {"context": 32, "dim": 64, "layers": 2, "vocab": 128, "dropout": 0.1}


def tiny_resnet() -> Any:
    return zoo.resnet(batch_size=2, image=8, widths=(4, 8), blocks=1)


def tiny_mlp() -> Any:
    return zoo.mlp(batch_size=4, in_features=16, hidden=32, depth=2)  # with dropout


MODELS = {"gpt": lambda: tiny_gpt(**GPT), "resnet": tiny_resnet, "mlp": tiny_mlp}


@dataclass
class Traced:
    model: Any
    inputs: tuple[Any, ...]
    result: Any
    store_all_peak: int
    recompute_all_peak: int

    @property
    def graph(self) -> Any:
        return self.result.graph


_TRACES: dict[tuple[str, str | None], Traced] = {}


def traced(name: str, autocast: str | None) -> Traced:
    """`name` traced once per module, masks as the runtime keeps them."""
    if (name, autocast) not in _TRACES:
        model, inputs = MODELS[name]()
        result = trace(model, inputs, dropout_masks="graph", autocast=autocast)
        hi = solve(result.graph, 10**15, "store-all").predicted
        lo = solve(result.graph, 10**15, "recompute-all").predicted
        assert hi is not None and lo is not None
        _TRACES[name, autocast] = Traced(model, inputs, result, hi.peak_bytes, lo.peak_bytes)
    return _TRACES[name, autocast]


def eager_autocast_step(model: Any, inputs: tuple[Any, ...], seed: int) -> tuple[Any, dict]:
    """The user's loop: forward and loss under autocast, backward outside (torch's advice)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.autocast(_device_type(model), dtype=BF16):
        loss = compute_loss(model(*inputs))
    loss.backward()
    return loss.detach(), _grads(model)


def planned_step(module: Any, inputs: tuple[Any, ...], seed: int, block: Any = None
                 ) -> tuple[Any, dict]:
    """A step of the planned module, inside `block` (an autocast context) when given."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if block is None:
        loss = module(*inputs)
    else:
        with block:
            loss = module(*inputs)
    loss.backward()
    return loss.detach(), _grads(module)


def _grads(model: Any) -> dict[str, Any]:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def _device_type(model: Any) -> str:
    return next(model.parameters()).device.type


def assert_same_step(a: tuple[Any, dict], b: tuple[Any, dict]) -> None:
    """Loss and every gradient equal bit for bit (same aten ops in the same order)."""
    assert torch.equal(a[0], b[0]), (a[0], b[0])
    assert a[1].keys() == b[1].keys()
    unequal = [n for n in a[1] if not torch.equal(a[1][n], b[1][n])]
    assert not unequal, f"gradients differ: {unequal}"


def _one_line(e: pytest.ExceptionInfo[Any]) -> str:
    text = str(e.value)
    assert "\n" not in text and text, text
    return text


# -- tracing ----------------------------------------------------------------------------------
def test_trace_records_autocast_and_real_mixed_sizes() -> None:
    fp32, bf16 = traced("gpt", None).graph, traced("gpt", "bf16").graph
    assert bf16.metadata.extra["autocast"] == "bf16" and fp32.metadata.extra["autocast"] is None
    # Weights stay fp32: same dtype, same model state, same fixed bytes.
    assert bf16.metadata.dtype == fp32.metadata.dtype == "float32"
    assert bf16.model_state.precision == fp32.model_state.precision == "fp32"
    assert [(p.name, p.bytes) for p in bf16.model_state.parameters] == [
        (p.name, p.bytes) for p in fp32.model_state.parameters
    ]
    assert bf16.fixed_bytes == fp32.fixed_bytes
    # The casts are explicit nodes, and every matmul output is half its fp32 size.
    assert Counter(n.op for n in bf16.nodes)["aten._to_copy"] > 10
    assert Counter(n.op for n in fp32.nodes)["aten._to_copy"] == 0
    def forward_bytes(graph: Any, op: str) -> list[int]:
        forward = (n for n in graph.nodes if n.phase.value == "forward")
        return sorted(n.output_bytes for n in forward if n.op == op)

    for op in ("aten.addmm", "aten.bmm", "aten.mm"):
        half, full = forward_bytes(bf16, op), forward_bytes(fp32, op)
        assert half and half == [b // 2 for b in full], op
    acts_fp32 = traced("gpt", None).store_all_peak - fp32.fixed_bytes
    acts_bf16 = traced("gpt", "bf16").store_all_peak - bf16.fixed_bytes
    assert acts_bf16 < 0.9 * acts_fp32, (acts_bf16, acts_fp32)


def test_trace_inside_the_users_autocast_block_is_the_same_trace() -> None:
    model, inputs = tiny_gpt(**GPT)
    with torch.autocast("cpu", dtype=BF16):
        inside = trace(model, inputs, dropout_masks="graph")
        explicit_too = trace(model, inputs, dropout_masks="graph", autocast="bf16")
    expected = traced("gpt", "bf16").graph
    assert inside.graph.metadata.extra["autocast"] == "bf16"
    assert inside.graph.content_hash() == expected.content_hash()
    assert explicit_too.graph.content_hash() == expected.content_hash()


def test_trace_refusals_are_one_line() -> None:
    model, inputs = tiny_mlp()
    with pytest.raises(InputError) as e:
        trace(model, inputs, autocast="fp8")
    assert "--autocast fp8" in _one_line(e)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(InputError) as e:
        trace(model, inputs, autocast="bf16")
    assert "torch.autocast(fp16)" in _one_line(e)
    with pytest.raises(InputError) as e:
        trace(model, inputs, autocast="bf16", level="module")
    assert "op level" in _one_line(e)
    with torch.autocast("cpu", dtype=BF16), pytest.raises(InputError) as e:
        trace(model, inputs, level="module")  # the block's autocast, at module level
    assert "op level" in _one_line(e)


# -- applying plans ---------------------------------------------------------------------------
def _plans(t: Traced) -> list[Any]:
    """Store-all, and chen-sqrt's checkpoints at its own peak as the budget: a remat plan
    that recomputes every segment once (a step in about a second on these graphs)."""
    store_all = solve(t.graph, t.store_all_peak, "store-all")
    sqrt = solve(t.graph, t.store_all_peak, "chen-sqrt").predicted
    assert sqrt is not None and t.recompute_all_peak <= sqrt.peak_bytes < t.store_all_peak
    tight = solve(t.graph, sqrt.peak_bytes, "chen-sqrt")
    for plan in (store_all, tight):
        assert plan.status.value in ("optimal", "feasible"), plan.summary()
    return [store_all, tight]


@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_plans_apply_with_the_eager_autocast_gradients(name: str) -> None:
    t = traced(name, "bf16")
    buffers = {k: v.clone() for k, v in t.model.named_buffers()}

    def restore() -> None:  # BatchNorm running statistics: every step starts from the same
        with torch.no_grad():
            for k, v in t.model.named_buffers():
                v.copy_(buffers[k])

    for plan in _plans(t):
        module = apply(t.model, plan, t.inputs, trace=t.result)
        restore()
        reference = eager_autocast_step(t.model, t.inputs, seed=11)
        for block in (None, torch.autocast("cpu", dtype=BF16)):  # outside or inside the block
            restore()
            assert_same_step(planned_step(module, t.inputs, 11, block), reference)
        if plan.method != "store-all":
            assert module.last_computations > len(t.graph.nodes)  # it recomputed


def test_planned_module_refuses_another_precision_in_one_line() -> None:
    t32, t16 = traced("mlp", None), traced("mlp", "bf16")
    fp32_module = apply(t32.model, solve(t32.graph, t32.store_all_peak, "store-all"), t32.inputs,
                        trace=t32.result)
    bf16_module = apply(t16.model, solve(t16.graph, t16.store_all_peak, "store-all"), t16.inputs,
                        trace=t16.result)
    with torch.autocast("cpu", dtype=BF16), pytest.raises(InputError) as e:
        fp32_module(*t32.inputs)
    assert "traced without autocast" in _one_line(e) and "autocast='bf16'" in str(e.value)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(InputError) as e:
        bf16_module(*t16.inputs)
    assert "traced under autocast bf16" in _one_line(e)
    with torch.autocast("cpu", dtype=BF16, enabled=False):  # a disabled block is no block
        assert fp32_module(*t32.inputs).dtype == torch.float32


def test_apply_retraces_with_the_plans_autocast() -> None:
    """Without trace=, apply re-traces as the plan's graph was traced: the graph's recorded
    setting (graph=), the caller's autocast block, or the one whose hash the plan names; the
    CLI's default eager-sized masks included."""
    model, inputs = tiny_mlp()
    eager_sized = trace(model, inputs, autocast="bf16").graph  # the CLI's default masks
    plan = solve(eager_sized, 10**12, "store-all")
    reference = eager_autocast_step(model, inputs, seed=5)
    graph_sized = traced("mlp", "bf16").graph  # graph= is re-traced with graph-sized masks
    graph_plan = solve(graph_sized, 10**12, "store-all")
    modules = [apply(model, plan, inputs), apply(model, graph_plan, inputs, graph=graph_sized)]
    with torch.autocast("cpu", dtype=BF16):
        modules.append(apply(model, plan, inputs))
    for module in modules:
        assert module.graph.metadata.extra["autocast"] == "bf16"
        assert_same_step(planned_step(module, inputs, 5), reference)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(InputError) as e:
        apply(model, graph_plan, inputs, graph=graph_sized)
    assert "torch.autocast(fp16)" in _one_line(e)


# -- memory -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt", "resnet"])
def test_measured_memory_within_the_prediction(name: str) -> None:
    t16, t32 = traced(name, "bf16"), traced(name, None)
    rows = []
    for plan in _plans(t16):
        module = apply(t16.model, plan, t16.inputs, trace=t16.result)
        measured = measure_step(training_step(module, t16.inputs), t16.model)
        predicted = plan.predicted.peak_bytes - t16.graph.fixed_bytes
        rows.append((plan.method, predicted, measured.activation_peak_bytes))
        assert measured.activation_peak_bytes <= predicted * TOLERANCE, rows
        assert measured.activation_peak_bytes >= 0.4 * predicted, rows  # the same tensors
    assert rows[1][2] < rows[0][2], rows  # the tight plan holds less
    # Real bytes: the bf16 step holds less than the fp32 one under the same plan kind.
    store_all_32 = solve(t32.graph, t32.store_all_peak, "store-all")
    module = apply(t32.model, store_all_32, t32.inputs, trace=t32.result)
    fp32_peak = measure_step(training_step(module, t32.inputs), t32.model).activation_peak_bytes
    assert rows[0][2] < 0.9 * fp32_peak, (rows, fp32_peak)


# -- the CLI ----------------------------------------------------------------------------------
def _cli(monkeypatch: Any, capsys: Any, *args: str) -> tuple[int, str, str]:
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", "trace", f"{__name__}:tiny_mlp", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_cli_autocast_option(monkeypatch: Any, capsys: Any, tmp_path: Any) -> None:
    out = tmp_path / "graph.json"
    code, stdout, err = _cli(monkeypatch, capsys, "--autocast", "bf16", "-o", str(out), "--json")
    assert code == 0, err
    assert json.loads(stdout)["autocast"] == "bf16"
    doc = json.loads(out.read_text())
    assert doc["metadata"]["extra"]["autocast"] == "bf16"
    model, inputs = tiny_mlp()
    assert doc["nodes"] == json.loads(trace(model, inputs, autocast="bf16").graph
                                      .model_dump_json())["nodes"]
    for args, needle in ((("--autocast", "bf16", "--level", "module"), "op level"),
                         (("--autocast", "fp8"), "--autocast")):
        code, _, err = _cli(monkeypatch, capsys, *args)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and needle in lines[0], err


# -- CUDA -------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_plans_match_eager_and_hold_the_prediction() -> None:
    """bf16 autocast on CUDA: gradient parity, and the allocator's peak of each step (gradients
    included, counted once: the graph's gradient lifetime 'backward' holds them in the
    prediction) at most the prediction and within 2 % of it."""
    model, inputs = zoo.gpt(batch_size=8, context=256, dim=256, layers=2, vocab=1024,
                            dropout=0.1)
    model = model.cuda()
    inputs = tuple(x.cuda() for x in inputs)
    result = trace(model, inputs, autocast="bf16")
    graph = result.graph
    assert graph.metadata.extra["autocast"] == "bf16"
    assert graph.model_state.gradient_lifetime == "backward"
    hi = solve(graph, 10**15, "store-all").predicted.peak_bytes
    lo = solve(graph, 10**15, "recompute-all").predicted.peak_bytes
    rows = []
    for budget, method in ((hi, "store-all"), ((hi + lo) // 2, "auto")):
        plan = solve(graph, budget, method, time_limit_s=20)
        assert plan.status.value in ("optimal", "feasible"), plan.summary()
        module = apply(model, plan, inputs, trace=result)
        reference = eager_autocast_step(model, inputs, seed=5)
        for block in (None, torch.autocast("cuda", dtype=BF16)):
            loss, grads = planned_step(module, inputs, 5, block)
            torch.testing.assert_close(loss, reference[0])
            for name, grad in reference[1].items():
                torch.testing.assert_close(grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")
        training_step(module, inputs)()  # warm-up: cuBLAS workspaces, allocator pools
        measured = measure_step(training_step(module, inputs), model, "cuda")
        predicted = plan.predicted.peak_bytes - graph.fixed_bytes
        rows.append((method, budget, predicted, measured.peak_bytes))
        assert measured.peak_bytes <= predicted, rows
        assert measured.peak_bytes >= 0.98 * predicted, rows
    assert rows[1][3] < rows[0][3], rows
