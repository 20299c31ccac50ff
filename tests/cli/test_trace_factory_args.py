"""`planner-cli trace` sizes a model: factory keywords (--arg), Hugging Face config fields
(--config, hf:MODEL_TYPE), --batch-size / --seq-len; the zoo takes the same overrides. Nothing
here may touch the network: models are built from configs with random weights."""

from __future__ import annotations

import inspect
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

TINY_GPT = ["--arg", "batch_size=2", "--arg", "context=8", "--arg", "dim=16", "--arg", "vocab=32"]
TINY_GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32}
TINY_LLAMA = {
    "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64,
}
FLOAT32_BYTES = 4
LAYER = re.compile(r"\.(?:h|layers)\.(\d+)\.")  # gpt2's and llama's decoder layers


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *args: str) -> tuple[int, str, str]:
    """planner-cli in process (its own main: exit code, one-line errors), sparing a torch
    import per case: (exit code, stdout, stderr)."""
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 0), out, err


def config_flags(fields: dict[str, Any]) -> list[str]:
    return [flag for key, value in fields.items() for flag in ("--config", f"{key}={value}")]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: building from a config must not reach the Hub."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network used: connect{args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def test_assignments_are_python_literals_else_strings() -> None:
    from planner.cli.options import parse_assignments

    parsed = parse_assignments(
        ["layers=12", "dropout=0.1", "widths=(8, 16)", "bias=False", "act=gelu", "eps=1e-5"],
        "--arg",
    )
    assert parsed == {"layers": 12, "dropout": 0.1, "widths": (8, 16), "bias": False,
                      "act": "gelu", "eps": 1e-5}


@pytest.mark.slow
def test_factory_args_size_the_traced_graph(monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from planner.core.io import load_graph

    summaries = {}
    for layers in (1, 3):
        out = tmp_path / f"gpt{layers}.json"
        code, stdout, err = run_cli(monkeypatch, capsys, "trace", "planner.zoo:gpt", *TINY_GPT,
                                    "--arg", f"layers={layers}", "-o", str(out), "--json")
        assert code == 0, err
        summaries[layers] = json.loads(stdout)
        blocks = {n.module_path.split(".")[1] for n in load_graph(out).nodes
                  if n.module_path.startswith("h.")}
        assert blocks == {str(i) for i in range(layers)}
    one, three = summaries[1], summaries[3]
    assert three["nodes"] > 2 * one["nodes"] - 20  # about one block's nodes per layer
    assert three["store_all_peak_bytes"] > one["store_all_peak_bytes"]
    assert three["fixed_bytes"] > one["fixed_bytes"]  # the blocks' parameters


@pytest.mark.parametrize(
    "args, needles",
    [
        (["planner.zoo:gpt", "--arg", "layerz=3"],
         ["--arg layerz", "its parameters: batch_size, context, dim, layers, vocab, dropout"]),
        (["planner.zoo:gpt", "--arg", "layers=three"], ["--arg layers='three'", "int"]),
        (["planner.zoo:gpt", "--arg", "layers"], ["expected KEY=VALUE"]),
        (["planner.zoo:gpt", "--arg", "layers=2", "--arg", "layers=3"], ["given twice"]),
        (["planner.zoo:gpt", "--config", "n_layer=2"], ["--config", "config_overrides"]),
        (["planner.zoo:mlp", "--seq-len", "8"], ["--seq-len", "seq_len or context"]),
        (["planner.zoo:gpt", "--seq-len", "8", "--arg", "context=8"], ["same parameter"]),
        (["hf:gpt2", "--arg", "n_layer=2"], ["--arg n_layer", "--config"]),
        (["planner.zoo:gpt", "--batch-size", "0"], ["--batch-size", "greater than or equal to 1"]),
    ],
)
def test_bad_factory_arg_is_one_line_exit_2(monkeypatch, capsys, args, needles) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, "trace", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and all(n in lines[0] for n in needles), err


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, fields, embedding",
    [("gpt2", TINY_GPT2, "inner.transformer.wte"),
     ("llama", TINY_LLAMA, "inner.model.embed_tokens")],
)
def test_hf_model_from_config_traces_with_the_overrides(  # type: ignore[no-untyped-def]
    monkeypatch, capsys, tmp_path, no_network, model_type, fields, embedding
) -> None:
    from planner.core.io import load_graph

    out = tmp_path / "graph.json"
    batch, seq = 2, 16
    code, stdout, err = run_cli(
        monkeypatch, capsys, "trace", f"hf:{model_type}", *config_flags(fields),
        "--batch-size", str(batch), "--seq-len", str(seq), "-o", str(out), "--json",
    )
    assert code == 0, err
    graph = load_graph(out)
    hidden = fields.get("n_embd", fields.get("hidden_size"))
    # the token embedding's output is batch x seq x the overridden hidden size (float32)
    (token_embedding,) = [n for n in graph.nodes
                          if n.module_path == embedding and n.op == "aten.embedding"]
    assert token_embedding.output_bytes == batch * seq * hidden * FLOAT32_BYTES
    layers = {m.group(1) for n in graph.nodes if (m := LAYER.search(n.module_path))}
    assert layers == {"0"}  # one layer, as configured (the default config has 12 or 32)
    assert json.loads(stdout)["nodes"] == len(graph.nodes)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["hf:gpt2", "--config", "n_layr=1"], ["--config", "'n_layr'", "did you mean n_layer"]),
        (["hf:llama", "--config", "bogus_field=1"], ["--config", "'bogus_field'", "LlamaConfig"]),
        (["hf:gpt2", "--config", "n_layer=abc"], ["--config", "n_layer"]),
        (["hf:gtp2"], ["not a transformers model type", "gpt2"]),
        (["hf:gpt2", *config_flags(TINY_GPT2), "--seq-len", "64"], ["n_positions=64"]),
    ],
)
def test_bad_hf_config_is_one_line_exit_2(monkeypatch, capsys, no_network, args, needles) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    code, _, err = run_cli(monkeypatch, capsys, "trace", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and all(n in lines[0] for n in needles), err


def test_zoo_takes_config_overrides_and_keeps_its_defaults(no_network) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    from planner import zoo
    from planner.core.errors import InputError
    from planner.zoo import hf

    model, (ids,) = zoo.hf_gpt2(batch_size=2, context=16, layers=1, dim=32,
                                config_overrides={"n_head": 2, "vocab_size": 64})
    config = model.inner.config
    assert (config.n_head, config.vocab_size, config.n_layer, config.n_embd) == (2, 64, 1, 32)
    assert ids.shape == (2, 16) and int(ids.max()) < 64
    default = zoo.hf_gpt2(batch_size=2, context=16, layers=1, dim=32)[0].inner.config
    assert (default.n_head, default.vocab_size) == (4, 1000)

    model, (ids,) = zoo.hf_model("llama", batch_size=2, seq_len=8, config_overrides=TINY_LLAMA)
    assert model.inner.config.num_hidden_layers == 1 and ids.shape == (2, 8)
    assert zoo.llama_like(layers=1, dim=16, config_overrides={"num_key_value_heads": 2}
                          )[0].inner.config.num_key_value_heads == 2
    sizes = inspect.signature(zoo.hf_model).parameters  # the zoo's defaults are hf.py's
    assert (sizes["batch_size"].default, sizes["seq_len"].default) == (
        hf.DEFAULT_BATCH_SIZE, hf.DEFAULT_SEQ_LEN)
    with pytest.raises(InputError) as info:
        zoo.hf_llama(layers=1, dim=32, config_overrides={"num_layers": 2})
    assert info.value.field == "config_overrides" and "'num_layers'" in str(info.value)


def test_trace_help_shows_both_options_with_examples(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run_cli(monkeypatch, capsys, "trace", "--help")
    assert code == 0
    assert "--arg layers=12" in out and "--config n_layer=12" in out and "hf:gpt2" in out
    assert "--batch-size" in out and "--seq-len" in out
