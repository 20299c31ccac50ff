"""Module-level tracing (Rotor quantities, chain.json), memory measurement, device profiles."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner.core.errors import InputError  # noqa: E402
from planner.core.graph import Phase  # noqa: E402
from planner.tracing import trace  # noqa: E402
from planner.tracing.memory import measure_step_memory  # noqa: E402
from planner.tracing.profiles import load_profile  # noqa: E402
from planner.zoo import TINY  # noqa: E402
from planner.zoo import tiny as make  # noqa: E402

BLOCKS = {
    "gpt": "h.*", "vit": "blocks.*", "resnet": "layers.*", "mlp": None, "unet": None,
    "mixer": "blocks.*", "densenet": None, "llama_like": "inner.model.layers.*",
    "resnet50_like": "blocks.*",
}


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.slow
def test_zoo_model_traces_at_module_level(name: str) -> None:
    model, inputs = make(name)
    result = trace(model, inputs, level="module", block_pattern=BLOCKS[name])
    g = result.graph
    n = len(g.nodes) // 2
    assert [x.phase for x in g.nodes] == [Phase.forward] * n + [Phase.backward] * n
    stages = result.details["chain"]["stages"]
    assert len(stages) == n
    for s in stages:
        assert s["saved_bytes"] >= s["output_bytes"] > 0
        assert s["forward_ms"] > 0 and s["backward_ms"] >= 0
    if BLOCKS[name]:
        assert sum(s["name"].startswith(BLOCKS[name][:-2]) for s in stages) >= 2
    if name == "unet":
        assert not result.details["is_chain"]  # the skip connections are found


def test_block_output_bytes_are_real_and_chain_json_loads() -> None:
    model, inputs = make("gpt")
    result = trace(model, inputs, level="module", block_pattern="h.*", costs="measure", repeats=2)
    stages = {s["name"]: s for s in result.details["chain"]["stages"]}
    batch, context, dim = inputs[0].shape[0], inputs[0].shape[1], 32
    assert stages["h.0"]["output_bytes"] == batch * context * dim * 4
    assert stages["h.0"]["saved_bytes"] > 4 * stages["h.0"]["output_bytes"]
    assert result.graph.nodes[0].cost_source.value == "measured"
    chain_model = pytest.importorskip("planner.solvers.chain.model")
    doc = chain_model.ChainDocument.model_validate(json.loads(json.dumps(result.details["chain"])))
    assert doc.to_chain().length == len(stages)


def test_hf_gpt2_traces_at_module_level_with_a_block_pattern() -> None:
    pytest.importorskip("transformers")
    import planner.zoo as zoo

    model, inputs = zoo.hf_gpt2(batch_size=2, context=16, layers=2, dim=32)
    result = trace(model, inputs, level="module", block_pattern="inner.transformer.h.*")
    names = [s["name"] for s in result.details["chain"]["stages"]]
    assert "inner.transformer.h.0" in names and "inner.transformer.h.1" in names


def test_unknown_block_pattern_is_a_clear_error() -> None:
    model, inputs = make("mlp")
    with pytest.raises(InputError, match="matches no module"):
        trace(model, inputs, level="module", block_pattern="nothing.*")


def test_measure_step_memory_is_exact_on_known_allocations() -> None:
    def step() -> None:
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(2000)  # 8000 bytes, both live: 12000
        del a
        c = torch.empty(500)  # 2000 bytes: live 10000
        v = b.view(40, 50)  # a view: no new bytes
        v.add_(1)  # in place: no new bytes
        del b, c, v

    mem = measure_step_memory(step)
    assert mem.peak_bytes == 12000
    assert mem.end_bytes == 0
    assert [t[1] for t in mem.timeline][:3] == [4000, 12000, 10000]


def test_device_profiles_load_by_name_and_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    h100, h200 = load_profile("h100"), load_profile("h200")
    assert h200.memory_bandwidth_bytes_per_s > h100.memory_bandwidth_bytes_per_s
    assert load_profile("a100").peak_flops["bfloat16"] > 1e14
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "peak_flops": {"float32": 1e12},
                                "memory_bandwidth_bytes_per_s": 1e11}))
    assert load_profile(str(path)).roofline_ms(1e9, 0) == pytest.approx(1e3 * 1e9 / 0.7e12)
    with pytest.raises(InputError, match="unknown profile"):
        load_profile("tpu9")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="not a device profile"):
        load_profile(str(bad))
