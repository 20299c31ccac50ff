"""graph.json: validation with one-line messages, networkx round trip, content hash, index."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import networkx as nx
import pytest
from conftest import make_graph
from pydantic import ValidationError

from planner.core.errors import InputError
from planner.core.graph import Graph, GraphMetadata, Phase
from planner.core.io import graph_from_dict, load_graph, write_json
from planner.core.synthetic import random_dag, training_graph


def base_doc() -> dict[str, Any]:
    return {
        "nodes": [
            {"id": 0, "name": "conv", "phase": "forward", "output_bytes": 8, "compute_ms": 1.5},
            {"id": 1, "name": "relu", "phase": "forward", "output_bytes": 8, "compute_ms": 0},
            {"id": 2, "name": "loss", "phase": "loss", "output_bytes": 4, "compute_ms": 0},
        ],
        "edges": [{"source": 0, "target": 1}, {"source": 1, "target": 2}],
    }


def mutate(fn: Any) -> dict[str, Any]:
    doc = base_doc()
    fn(doc)
    return doc


def test_valid_document_loads() -> None:
    g = graph_from_dict(base_doc())
    assert [n.id for n in g.nodes] == [0, 1, 2]
    assert g.node(2).phase is Phase.loss
    assert g.index.topological_order == [0, 1, 2]
    assert g.index.outputs == [2]
    assert g.total_compute_ms == 1.5


# (mutation, fragments the one-line message must contain)
BAD_GRAPHS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "cycle": (
        lambda d: d["edges"].append({"source": 2, "target": 0}),
        ("cycle", "node 0 (conv)", "0 -> 1 -> 2 -> 0"),
    ),
    "dangling edge": (
        lambda d: d["edges"].append({"source": 2, "target": 7}),
        ("edges[2]", "missing node 7"),
    ),
    "duplicate id": (
        lambda d: d["nodes"].append(dict(d["nodes"][1], name="again")),
        ("nodes[3]", "duplicate node id 1"),
    ),
    "negative cost": (
        lambda d: d["nodes"][0].update(compute_ms=-1),
        ("nodes[0] (id 0, conv).compute_ms", "greater than or equal to 0"),
    ),
    "NaN cost": (
        lambda d: d["nodes"][1].update(compute_ms=math.nan),
        ("nodes[1] (id 1, relu).compute_ms", "finite"),
    ),
    "infinite cost": (
        lambda d: d["nodes"][1].update(compute_ms=math.inf),
        ("nodes[1] (id 1, relu).compute_ms", "finite"),
    ),
    "negative bytes": (
        lambda d: d["nodes"][0].update(output_bytes=-8),
        ("nodes[0] (id 0, conv).output_bytes",),
    ),
    "negative workspace": (
        lambda d: d["nodes"][0].update(workspace_bytes=-1),
        ("nodes[0] (id 0, conv).workspace_bytes",),
    ),
    "missing node id": (lambda d: d["nodes"][1].pop("id"), ("nodes[1]:", "missing id")),
    "missing nodes": (lambda d: d.pop("nodes"), ("nodes", "Field required")),
    "missing edge end": (
        lambda d: d["edges"][0].pop("target"),
        ("edges[0].target", "Field required"),
    ),
    "no nodes": (lambda d: d.update(nodes=[], edges=[]), ("at least one node",)),
    "unknown field": (lambda d: d["nodes"][0].update(bogus=1), ("nodes[0] (id 0, conv).bogus",)),
    "bad phase": (lambda d: d["nodes"][0].update(phase="sideways"), ("phase",)),
    "order against an edge": (
        lambda d: d.update(order=[1, 0, 2]),
        ("order", "node 1 (relu) comes before its input node 0 (conv)"),
    ),
    "order missing a node": (lambda d: d.update(order=[0, 1]), ("order", "missing [2]")),
    "order with unknown node": (lambda d: d.update(order=[0, 1, 2, 5]), ("order", "unknown [5]")),
    "order repeating a node": (lambda d: d.update(order=[0, 1, 1]), ("order", "exactly once")),
    "self loop": (lambda d: d["edges"].append({"source": 1, "target": 1}), ("self-loop",)),
    "duplicate edge": (
        lambda d: d["edges"].append({"source": 0, "target": 1}),
        ("duplicate edge 0 -> 1",),
    ),
    "view without edge": (
        lambda d: d["nodes"][2].update(alias_of=0),
        ("node 2 (loss)", "alias_of 0"),
    ),
    "view of missing node": (
        lambda d: d["nodes"][2].update(alias_of=9),
        ("node 2 (loss)", "missing node 9"),
    ),
    "unknown output": (lambda d: d.update(outputs=[9]), ("outputs", "missing node 9")),
    "negative fixed": (
        lambda d: d.update(fixed={"parameters_bytes": -1}),
        ("fixed.parameters_bytes",),
    ),
    "wrong version": (lambda d: d.update(schema_version="9"), ("schema_version",)),
    "not an object": (lambda d: None, ()),  # replaced below
}


@pytest.mark.parametrize("case", [k for k in BAD_GRAPHS if k != "not an object"])
def test_bad_graphs_give_one_line_naming_the_problem(case: str) -> None:
    fn, fragments = BAD_GRAPHS[case]
    with pytest.raises(InputError) as info:
        graph_from_dict(mutate(fn), where="g.json")
    msg = str(info.value)
    assert msg.startswith("g.json: ")
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, (case, msg)


def test_not_an_object_is_bad_input() -> None:
    with pytest.raises(InputError, match="g.json: expected a JSON object"):
        graph_from_dict([1, 2], where="g.json")


def test_cycle_names_a_node_on_the_cycle_only() -> None:
    # 0 -> 1 -> 2 -> 3 -> 1: the cycle is 1, 2, 3; node 0 is not on it.
    doc = {
        "nodes": [{"id": i, "name": f"x{i}"} for i in range(4)],
        "edges": [{"source": u, "target": v} for u, v in [(0, 1), (1, 2), (2, 3), (3, 1)]],
    }
    with pytest.raises(ValidationError) as info:
        Graph.model_validate(doc)
    msg = str(info.value)
    assert "cycle" in msg
    on_cycle = [f"node {i} (x{i})" for i in (1, 2, 3)]
    assert any(label in msg for label in on_cycle)
    assert "node 0 (x0)" not in msg


def test_graph_is_immutable() -> None:
    g = graph_from_dict(base_doc())
    with pytest.raises(ValidationError):
        g.nodes[0].output_bytes = 1


# -- networkx -----------------------------------------------------------------------------------


def test_networkx_round_trip_keeps_everything() -> None:
    g = make_graph(
        {0: 100, 1: 100, 2: 10, 3: 4},
        [(0, 1), (1, 2), (2, 3), (0, 3)],
        costs={0: 1.5, 1: 0.0, 2: 2.25, 3: 1.0},
        fixed_bytes=77,
        alias_of={1: 0},
        workspace_bytes={2: 9},
        recomputable={3: False},
        random={2: True},
        phase={3: Phase.backward},
    )
    g = g.model_copy(update={"order": [0, 1, 2, 3], "outputs": [3]})
    g = Graph.model_validate(g.model_dump())
    dg = g.to_networkx()
    assert isinstance(dg, nx.DiGraph)
    assert set(dg.edges()) == {(0, 1), (1, 2), (2, 3), (0, 3)}
    assert dg.nodes[1]["alias_of"] == 0
    assert dg.nodes[2]["workspace_bytes"] == 9
    back = Graph.from_networkx(dg)
    assert back == g
    assert back.content_hash() == g.content_hash()


def test_from_networkx_rejects_a_cyclic_digraph() -> None:
    dg = nx.DiGraph([(0, 1), (1, 0)])
    with pytest.raises(ValidationError, match="cycle"):
        Graph.from_networkx(dg)


def test_synthetic_graph_round_trips_through_json(tmp_path: Any) -> None:
    g = training_graph(6, skip=2, seed=3)
    path = tmp_path / "g.json"
    write_json(path, g)
    again = load_graph(path)
    assert again == g
    assert again.content_hash() == g.content_hash()


# -- content hash -------------------------------------------------------------------------------


def test_content_hash_is_stable_and_ignores_metadata() -> None:
    g = graph_from_dict(base_doc())
    h = g.content_hash()
    assert h.startswith("sha256:") and len(h) == len("sha256:") + 64
    assert graph_from_dict(base_doc()).content_hash() == h
    # Key order in the file does not matter.
    shuffled = json.loads(json.dumps(base_doc(), sort_keys=True))
    shuffled["nodes"] = [dict(reversed(list(n.items()))) for n in shuffled["nodes"]]
    assert graph_from_dict(shuffled).content_hash() == h
    # Defaults written out explicitly do not change it.
    explicit = graph_from_dict(json.loads(g.model_dump_json()))
    assert explicit.content_hash() == h
    renamed = g.model_copy(update={"metadata": GraphMetadata(model_name="other")})
    assert renamed.content_hash() == h


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["nodes"][0].update(output_bytes=9),
        lambda d: d["nodes"][0].update(compute_ms=1.25),
        lambda d: d["nodes"][1].update(workspace_bytes=1),
        lambda d: d["nodes"][1].update(recomputable=False),
        lambda d: d["edges"].append({"source": 0, "target": 2}),
        lambda d: d.update(fixed={"parameters_bytes": 1}),
        lambda d: d.update(order=[0, 1, 2]),
    ],
)
def test_content_hash_changes_with_the_content(change: Any) -> None:
    before = graph_from_dict(base_doc()).content_hash()
    doc = copy.deepcopy(base_doc())
    change(doc)
    assert graph_from_dict(doc).content_hash() != before


# -- index --------------------------------------------------------------------------------------


def test_index_adjacency_and_storage() -> None:
    g = make_graph({0: 100, 1: 100, 2: 10}, [(0, 1), (1, 2), (0, 2)], alias_of={1: 0})
    idx = g.index
    assert sorted(idx.predecessors[2]) == [0, 1]
    assert sorted(idx.successors[0]) == [1, 2]
    assert idx.storage_root(1) == 0 and idx.storage_root(2) == 2
    assert idx.storage_bytes == {0: 100, 1: 0, 2: 10}
    assert g.describe(1) == "node 1 (n1)" and g.describe(42) == "node 42"


def test_topological_order_prefers_the_given_order() -> None:
    doc = base_doc()
    doc["nodes"].append({"id": 3, "name": "side", "phase": "forward", "output_bytes": 0,
                         "compute_ms": 0})
    doc["edges"].append({"source": 0, "target": 3})
    doc["order"] = [0, 3, 1, 2]
    g = graph_from_dict(doc)
    assert g.index.topological_order == [0, 3, 1, 2]
    assert g.index.outputs == [2, 3]


def test_index_follows_copies() -> None:
    g = random_dag(6, seed=1)
    _ = g.index.topological_order
    bigger = g.model_copy(update={"fixed": g.fixed.model_copy(update={"other_bytes": 5})})
    assert bigger.index.graph is bigger
    assert bigger.fixed_bytes == 5
