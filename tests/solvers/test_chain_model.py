"""chain.json, its graph, the CLI on chains and graphs, and block-level plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.block_plan import BlockMode, BlockPlan
from planner.core.errors import InputError
from planner.core.io import write_json
from planner.core.synthetic import training_graph
from planner.engine.inputs import graph_from_dict
from planner.solvers.chain.blocks import (
    block_plan_from_ops,
    block_plan_from_solution,
    one_level_ops,
)
from planner.solvers.chain.layout import chain_of_graph
from planner.solvers.chain.model import chain_document, chain_from_dict, homogeneous_chain
from planner.solvers.chain.sequence import chen_sqrt_ops, ops_from_text, store_all_ops

CHAIN_DOC = {
    "schema_version": "chain-1",
    "name": "tiny",
    "input_bytes": 1000,
    "fixed_bytes": 500,
    "stages": [
        {"name": f"block{i}", "forward_ms": 1.0 + i, "backward_ms": 2.0, "output_bytes": 1000,
         "saved_bytes": 3000, "backward_tmp_bytes": 200}
        for i in range(8)
    ],
}


def test_chain_document_defaults_and_round_trip() -> None:
    chain = chain_from_dict(CHAIN_DOC)
    assert chain.length == 8 and chain.stage(1).grad_input_bytes == 1000  # δ^0 = x_0
    assert chain_from_dict(chain_document(chain)) == chain
    assert chain_from_dict({"chain": CHAIN_DOC}) == chain
    graph = graph_from_dict(CHAIN_DOC)
    assert chain_of_graph(graph) == chain
    assert len(graph.nodes) == 1 + 3 * 8 and graph.fixed_bytes == 500


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": []}, "stages"),
        ({"schema_version": "2"}, "schema_version"),
        ({"stages": [{"forward_ms": 1, "backward_ms": 1, "output_bytes": 10, "saved_bytes": 5}]},
         "saved_bytes 5 < output_bytes 10"),
        ({"stages": [{"forward_ms": -1, "backward_ms": 1, "output_bytes": 10}]}, "forward_ms"),
    ],
)
def test_bad_chain_documents_are_one_line(change: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        graph_from_dict({**CHAIN_DOC, **change}, where="c.json")
    assert "\n" not in str(info.value) and str(info.value).startswith("c.json: ")


@pytest.mark.slow
def test_cli_solves_chain_and_graph(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    chain_path = tmp_path / "chain.json"
    chain_path.write_text(json.dumps(CHAIN_DOC))
    out = tmp_path / "plan.json"
    res = cli("solve", chain_path, "--method", "rotor", "--budget", "0.6", "-o", out, "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["peak_bytes"] <= summary["budget_bytes"]
    plan = json.loads(out.read_text())
    assert plan["details"]["chain"]["source"] == "chain.json"
    assert plan["predicted"]["peak_bytes"] == plan["details"]["chain_predicted"]["peak_bytes"]
    graph_path = tmp_path / "graph.json"
    write_json(graph_path, training_graph(12, seed=4))  # no skips: the chain is exact
    res = cli("solve", graph_path, "--method", "rotor", "--budget", "1.0", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["overhead_percent"] == 0.0
    res = cli("solve", graph_path, "--method", "rotor", "--budget", "0.3")
    assert res.returncode == 3 and "smallest budget" in res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**CHAIN_DOC, "input_bytes": -3}))
    res = cli("solve", bad, "--method", "rotor", "--budget", "0.5")
    assert res.returncode == 2 and "input_bytes" in res.stderr and "Traceback" not in res.stderr


def test_block_plan_forms() -> None:
    length = 24
    ops = store_all_ops(6)  # blocks 0-5 kept ...
    plan = block_plan_from_ops(6, ops)
    assert plan.text() == "blocks 0–5 kept" and plan.kept() == list(range(6))
    mixed = ops_from_text(
        "Fall1 Fall2 Fck3 Fn4 Fn5 Fck6 Fn7 Fn8 Fall9 B9 D8 Fall6 Fall7 Fall8 B8 B7 B6 D5 "
        "Fall3 Fall4 Fall5 B5 B4 B3 B2 B1"
    )
    plan = block_plan_from_ops(9, mixed)
    assert plan.to_json()["modes"] == "KKCRRCRRK"
    assert plan.segments() == [(2, 4), (5, 7)]
    assert plan.text() == "blocks 0–1 kept, 2–7 checkpointed every 3rd, 8 kept"
    assert plan.forward_runs == [1, 1, 2, 2, 2, 2, 2, 2, 1]
    assert BlockPlan.from_json(plan.to_json()) == plan
    chen = block_plan_from_ops(length, chen_sqrt_ops(length))
    assert chen.modes[0] == BlockMode.checkpoint
    assert "checkpointed" in chen.text()
    with pytest.raises(ValueError, match="'R' must follow"):
        BlockPlan(modes="KR", forward_runs=[1, 1])


def test_homogeneous_chain_graph_store_all() -> None:
    from planner.solvers.baselines import store_all_peak_bytes
    from planner.solvers.chain.layout import chain_graph
    from planner.solvers.chain.sequence import run_sequence

    chain = homogeneous_chain(5, output_bytes=7, saved_bytes=20)
    graph, _ = chain_graph(chain)
    assert store_all_peak_bytes(graph) == run_sequence(chain, store_all_ops(5)).peak_bytes


def test_block_plan_one_level_schedule() -> None:
    """Applying a rotor block plan with one level of checkpointing is a valid schedule that
    runs each block's forward at most twice."""
    import random

    from planner.solvers.chain.model import Chain, Stage
    from planner.solvers.chain.rotor import solve_rotor
    from planner.solvers.chain.sequence import run_sequence

    rng = random.Random(9)
    stages = tuple(
        Stage(rng.uniform(1, 3), rng.uniform(2, 6), x, x * 3, 0, 0, x)
        for x in (rng.randint(1, 5) * 100 for _ in range(20))
    )
    chain = Chain(stages, input_bytes=300)
    full = run_sequence(chain, store_all_ops(20)).peak_bytes
    seen = set()
    for fraction in (1.0, 0.7, 0.5, 0.35):
        sol = solve_rotor(chain, int(fraction * full))
        plan = block_plan_from_solution(sol.ops)
        if plan is None:
            continue
        seen.add(plan.to_json()["modes"])
        run = run_sequence(chain, one_level_ops(plan))
        assert run.complete
        assert run.forward_count <= 20 + sum(hi - lo + 1 for lo, hi in plan.segments())
        if set(plan.modes) == {BlockMode.keep}:
            assert run.cost == pytest.approx(sol.cost) and run.peak_bytes == sol.peak_bytes
    assert len(seen) >= 3
    assert block_plan_from_solution(None) is None
