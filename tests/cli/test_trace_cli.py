"""planner-cli trace: graph.json out, summary, one-line errors."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("torch")


def test_trace_zoo_model_writes_graph_json(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "graph.json"
    r = cli("trace", "planner.zoo:mlp", "--input", "float32[8,256]", "--input", "int64[8]:10",
            "-o", out, "--json", timeout=240)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["nodes"] > 10 and summary["backward_ms"] > 0
    assert len(summary["largest_activations"]) == 10
    from planner.core.io import load_graph

    graph = load_graph(out)
    assert graph.metadata.batch_size == 8 and len(graph.nodes) == summary["nodes"]


def test_trace_module_level_writes_chain_json(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    chain = tmp_path / "chain.json"
    r = cli("trace", "planner.zoo:gpt", "--level", "module", "--block-pattern", "h.*",
            "--chain-out", chain, "--device-profile", "h100", timeout=240)
    assert r.returncode == 0, r.stderr
    assert "largest activations" in r.stdout
    doc = json.loads(chain.read_text())
    assert doc["schema_version"] == "chain-1" and len(doc["stages"]) >= 4


@pytest.mark.parametrize(
    "args, needle",
    [
        (["planner.zoo:mlp", "--input", "float32(8,3)"], "expected DTYPE"),
        (["no_such_module:f"], "cannot import"),
        (["planner.zoo:mlp", "--device-profile", "tpu9"], "unknown profile"),
        (["planner.zoo:mlp", "--level", "layer"], "--level"),
    ],
)
def test_bad_trace_input_is_one_line_exit_2(monkeypatch, capsys, args, needle) -> None:  # type: ignore[no-untyped-def]
    # in process (planner-cli's own main) to spare a torch import per case
    from planner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["planner-cli", "trace", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err
