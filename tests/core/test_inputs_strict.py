"""Inputs are never silently misread (issue 13, items 8, 9 and 11): graph.json nodes state the
fields that decide memory, order and cost, with their JSON types; budgets have one unambiguous
grammar; the no-plan message agrees with the JSON it comes with."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from planner.core.budget import MAX_BUDGET_BYTES, BudgetSpec, parse_budget, parse_budget_spec
from planner.core.errors import InputError, describe_json_decode_error, json_error_position
from planner.core.graph import NODE_REQUIRED_FIELDS, Graph, Node, Phase
from planner.core.io import graph_from_dict, load_graph, read_json, write_json
from planner.core.synthetic import training_graph
from planner.solvers.baselines import BASELINES, store_all_peak_bytes

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = [ROOT / "planner" / "examples" / "resnet24.json",
            ROOT / "tests" / "data" / "graph_v1_synthetic9.json"]


def doc() -> dict[str, Any]:
    return {
        "nodes": [
            {"id": 0, "name": "conv", "phase": "forward", "compute_ms": 1.5, "output_bytes": 8},
            {"id": 1, "name": "loss", "phase": "loss", "compute_ms": 0.5, "output_bytes": 4},
            {"id": 2, "name": "conv_grad", "phase": "backward", "compute_ms": 3,
             "output_bytes": 8},
        ],
        "edges": [{"source": 0, "target": 1}, {"source": 1, "target": 2},
                  {"source": 0, "target": 2}],
    }


def bad(document: dict[str, Any]) -> str:
    with pytest.raises(InputError) as info:
        graph_from_dict(document, where="g.json")
    message = str(info.value)
    assert message.startswith("g.json: ") and "\n" not in message
    return message


# -- item 8: graph.json nodes --------------------------------------------------------------------


@pytest.mark.parametrize("field", ["output_bytes", "phase", "compute_ms", "id"])
def test_a_node_without_a_field_that_decides_memory_order_or_cost_is_refused(field: str) -> None:
    d = doc()
    del d["nodes"][2][field]
    message = bad(d)
    assert "nodes[2]" in message and f"missing {field}" in message, message
    if field != "id":
        assert "(id 2, conv_grad)" in message


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("output_bytes", "12", '(got "12")'),
    ("output_bytes", 12.0, "(got 12.0)"),
    ("output_bytes", True, "(got true)"),
    ("workspace_bytes", "0", '(got "0")'),
    ("compute_ms", "1.5", '(got "1.5")'),
    ("id", "2", '(got "2")'),
    ("recomputable", "false", '(got "false")'),
    ("alias_of", "0", '(got "0")'),
])
def test_fields_have_their_json_types(field: str, value: Any, shown: str) -> None:
    d = doc()
    d["nodes"][2][field] = value
    message = bad(d)
    assert f"nodes[2] (id 2, conv_grad).{field}" in message or f"nodes[2].{field}" in message
    assert shown in message, message


def test_edges_and_fixed_memory_are_strict_too() -> None:
    d = doc()
    d["edges"][0]["source"] = "0"
    assert "edges[0].source" in bad(d)
    d = doc()
    d["fixed"] = {"inputs_bytes": "64"}
    assert "fixed.inputs_bytes" in bad(d)


def test_absurd_byte_counts_are_refused() -> None:
    d = doc()
    d["nodes"][0]["output_bytes"] = 10**30
    assert "nodes[0] (id 0, conv).output_bytes" in bad(d)


def test_safe_defaults_stay_optional() -> None:
    g = graph_from_dict(doc())  # no workspace, op, module_path, cost_source, recomputable ...
    node = g.node(2)
    assert node.workspace_bytes == 0 and node.name == "conv_grad" and node.op == ""
    assert node.recomputable is True and node.random is False and node.alias_of is None
    assert node.phase is Phase.backward and node.compute_ms == 3.0  # an int is a number


def test_the_schema_says_which_node_fields_are_required() -> None:
    node_schema = Graph.model_json_schema()["$defs"]["Node"]
    assert node_schema["required"] == list(NODE_REQUIRED_FIELDS)
    assert set(NODE_REQUIRED_FIELDS) == {"id", "phase", "compute_ms", "output_bytes"}


def test_python_constructors_keep_their_defaults() -> None:
    # Importers, the chain layout and synthetic graphs build nodes in code: unchanged.
    assert Node(id=3).output_bytes == 0 and Node(id=3).phase is Phase.forward


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_committed_graphs_load_with_the_same_hash(path: Path) -> None:
    data = read_json(path)
    strict = load_graph(path)
    assert strict == Graph.model_validate(data)
    assert strict.content_hash() == Graph.model_validate(data).content_hash()


def test_graphs_written_by_our_tools_load(tmp_path: Path) -> None:
    g = training_graph(5, skip=2, seed=2)
    write_json(tmp_path / "g.json", g)
    assert load_graph(tmp_path / "g.json") == g


def test_the_cli_names_node_and_field(tmp_path: Path) -> None:
    d = doc()
    d["nodes"][1]["output_bytes"] = "12"
    path = tmp_path / "g.json"
    path.write_text(json.dumps(d))
    r = run_cli("info", path)
    assert r.returncode == 2, r.stdout
    assert r.stderr.strip() == (
        f"error: {path}: nodes[1] (id 1, loss).output_bytes: Input should be a valid integer "
        '(got "12")'
    )


# -- item 9: the budget grammar ------------------------------------------------------------------

PEAK = 10_000


@pytest.mark.parametrize(("value", "expected"), [
    ("80%", 8000), ("0.8", 8000), (".25", 2500), ("1", 1), ("1.0", PEAK), (1, 1),
    (1.0, PEAK), (0.5, 5000), ("150%", 15000), ("1000", 1000), (2000, 2000), ("500", 500),
    (12, 12), ("2B", 2), ("64 B", 64), ("1.5KiB", 1536), ("1.1KB", 1100),
    ("12GiB", 12 * 2**30), ("8e-1", 8000),
])
def test_each_form_means_one_thing(value: str | int | float, expected: int) -> None:
    assert parse_budget(value, PEAK) == expected


@pytest.mark.parametrize(("value", "fixes"), [
    ("1.5", ("150%", "1.5GB")),
    ("2.0", ("200%", "2 (an integer: bytes)")),
    (2.0, ("200%", "2 (an integer: bytes)")),
    (1.5, ("150%",)),
    ("12.5", ("1250%", "12.5GiB")),
    ("1e9", ("1000000000 (an integer: bytes)", "1GB")),
    (float(10**10), ("10000000000 (an integer: bytes)", "10GB")),
])
def test_a_number_with_a_point_above_1_is_refused_with_the_fix(
    value: str | float, fixes: tuple[str, ...]
) -> None:
    with pytest.raises(InputError) as info:
        parse_budget(value, PEAK, "--budget")
    message = str(info.value)
    assert message.startswith(f"--budget: {value!r}: a number with a point"), message
    for fix in fixes:
        assert fix in message, message


@pytest.mark.parametrize(("value", "fragment"), [
    ("1e400", "too large"), (1e300, "too large"), (10**30, "too large"),
    (2**63, "too large"), (f"{2**70}B", "too large"), ("1e30%", "too large"),
    ("0", "more than 0"), ("0%", "more than 0"), ("1.5B", "whole number"),
    ("nan", "cannot parse"), ("-1GiB", "more than 0"), (True, "expected an integer"),
    (float("inf"), "finite"),
])
def test_out_of_range_budgets_say_so(value: object, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_budget(value, PEAK)  # type: ignore[arg-type]
    assert fragment in str(info.value), str(info.value)


def test_the_spec_says_whether_it_needs_the_graph() -> None:
    assert parse_budget_spec("80%") == BudgetSpec("80%", fraction=0.8)
    assert parse_budget_spec(2000).needs_reference is False
    assert parse_budget_spec("0.8").needs_reference is True
    assert parse_budget_spec(f"{MAX_BUDGET_BYTES}B").resolve(None) == MAX_BUDGET_BYTES


def test_published_fractions_keep_their_exact_bytes() -> None:
    fcn8 = 13_484_795_520
    assert parse_budget("0.9", fcn8) == 12_136_315_968
    assert parse_budget("0.8", fcn8) == parse_budget("80%", fcn8) == 10_787_836_416


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("strict") / "graph.json"
    write_json(path, training_graph(8, skip=2, seed=7, fixed_bytes=4096))
    return path


def test_cli_budget_1_5_is_refused_not_read_as_2_bytes(graph_path: Path) -> None:
    r = run_cli("solve", graph_path, "--budget", "1.5", "-m", "store-all")
    assert r.returncode == 2, r.stderr  # before: exit 3 "no plan within 2 bytes"
    assert r.stderr.startswith("error: --budget: '1.5': a number with a point")
    assert "150%" in r.stderr
    help_text = " ".join(run_cli("solve", "--help").stdout.split())
    assert "80%" in help_text and "1 is one byte" in help_text


# -- item 11: messages that agree with the facts -------------------------------------------------


def test_no_plan_message_agrees_with_its_json(graph_path: Path) -> None:
    graph = load_graph(graph_path)
    least = min(BASELINES, key=lambda n: _peak(graph, n))
    r = run_cli("solve", graph_path, "--budget", "0.8", "-m", "store-all", "--json")
    assert r.returncode == 3
    summary = json.loads(r.stdout)
    assert summary["peak_bytes"] == store_all_peak_bytes(graph)  # store-all's own plan
    assert summary["smallest_known_budget_bytes"] == _peak(graph, least) < summary["peak_bytes"]
    assert summary["smallest_known_budget_by"] == f"baseline {least}"
    message = r.stderr.strip()
    assert len(message.splitlines()) == 1
    assert f"its best plan peaks at {summary['peak_bytes']} bytes" in message
    assert (f"the smallest budget known to work is {summary['smallest_known_budget_bytes']} "
            f"bytes") in message
    assert f"found by baseline {least}" in message
    # Every byte count in the message is one the JSON states.
    numbers = {int(n) for n in re.findall(r"\b(\d+) bytes", message)}
    assert numbers <= {summary["budget_bytes"], summary["peak_bytes"],
                       summary["smallest_known_budget_bytes"]}


def _peak(graph: Graph, name: str) -> int:
    from planner.sim.simulator import simulate

    return simulate(graph, BASELINES[name](graph, None)).peak_bytes


def test_json_errors_say_line_and_column() -> None:
    text = '{\n  "graph": {\n    "nodes": [,]\n  }\n}'
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        offset, reason = e.pos, e.msg
    assert json_error_position(text, offset) == (3, 15)
    assert json_error_position(text.encode(), offset) == (3, 15)
    assert describe_json_decode_error(text, offset, reason) == (
        "body: not valid JSON (line 3, column 15: Expecting value)"
    )


def test_budget_1e400_says_too_large_not_positive() -> None:
    with pytest.raises(InputError, match=r"budget: '1e400': too large; the largest budget is"):
        parse_budget("1e400", PEAK)


def test_documents_are_not_modified() -> None:
    d = doc()
    before = copy.deepcopy(d)
    graph_from_dict(d)
    assert d == before
