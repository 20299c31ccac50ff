"""Importer of Checkmate/Moccasin node-link files (both variants) and the shared graphs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from planner.core.errors import InputError
from planner.core.graph import CostSource, Phase
from planner.core.importers.checkmate import import_checkmate, import_checkmate_file
from planner.core.io import load_graph
from planner.core.plan import ActionOp
from planner.sim.simulator import lower_bound_peak_bytes, simulate
from planner.solvers.baselines import BASELINES, store_all, store_all_peak_bytes


def checkmate_doc() -> dict[str, Any]:
    """Checkmate variant: ids deliberately not 0..n-1 in file order."""
    return {
        "directed": True,
        "multigraph": False,
        "graph": {"name": "tiny_train"},
        "nodes": [
            {"name": "conv", "backward": False, "cost_cpu": 10, "cost_ram": 400, "id": 5},
            {"name": "relu", "backward": False, "cost_cpu": 2, "cost_ram": 400, "id": 7},
            {"name": "Loss", "backward": True, "cost_cpu": 0, "cost_ram": 4, "id": 3},
            {"name": "relu_grad", "backward": True, "cost_cpu": 3, "cost_ram": 400, "id": 9},
            {"name": "conv_grad", "backward": True, "cost_cpu": 20, "cost_ram": 40, "id": 1},
        ],
        "links": [
            {"source": 5, "target": 7},
            {"source": 7, "target": 3},
            {"source": 3, "target": 9},
            {"source": 7, "target": 9},
            {"source": 9, "target": 1},
            {"source": 5, "target": 1},
        ],
    }


def layered_doc(order_as_text: bool = True) -> dict[str, Any]:
    """Moccasin's random_layered variant: `name` is the id, endpoints under "0"/"1"."""
    order = [0, 2, 1, 3]
    return {
        "directed": True,
        "multigraph": False,
        "graph": {
            "name": "random_layered_n4",
            "order": json.dumps(order) if order_as_text else order,
        },
        "nodes": [
            {"out_cost": 30, "param_cost": 5, "duration": 1, "name": 0},
            {"out_cost": 20, "param_cost": 0, "duration": 2, "name": 1},
            {"out_cost": 10, "param_cost": 7, "duration": 3, "name": 2},
            {"out_cost": 40, "param_cost": 0, "duration": 4, "name": 3},
        ],
        "links": [{"0": 0, "1": 1}, {"0": 0, "1": 2}, {"0": 2, "1": 1}, {"0": 1, "1": 3}],
    }


def write(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_checkmate_variant_keeps_ids_and_fields(tmp_path: Path) -> None:
    g = import_checkmate_file(write(tmp_path, "tiny.json", checkmate_doc()))
    assert [n.id for n in g.nodes] == [5, 7, 3, 9, 1]
    by_id = {n.id: n for n in g.nodes}
    assert by_id[5].name == "conv" and by_id[5].output_bytes == 400 and by_id[5].compute_ms == 10
    assert by_id[5].phase is Phase.forward
    assert by_id[3].phase is Phase.loss
    assert by_id[9].phase is Phase.backward and by_id[1].phase is Phase.backward
    assert all(n.cost_source is CostSource.imported for n in g.nodes)
    assert {(e.source, e.target) for e in g.edges} == {
        (5, 7), (7, 3), (3, 9), (7, 9), (9, 1), (5, 1)
    }
    assert g.metadata.model_name == "tiny_train"
    assert g.order is None
    assert g.fixed_bytes == 0
    # Store-all by hand, order 5 7 3 9 1: C5 400; C7 800; C3 804; C9 (5, 7, 3 still needed)
    # 400 + 400 + 4 + 400 = 1204; C1 (5, 9, 1) 840.
    assert store_all_peak_bytes(g) == 1204


def test_random_layered_variant_keeps_ids_and_order(tmp_path: Path) -> None:
    for as_text in (True, False):
        g = import_checkmate_file(write(tmp_path, "layered.json", layered_doc(as_text)))
        assert [n.id for n in g.nodes] == [0, 1, 2, 3]
        assert g.order == [0, 2, 1, 3]
        assert g.index.topological_order == [0, 2, 1, 3]
        assert {n.id: n.output_bytes for n in g.nodes} == {0: 30, 1: 20, 2: 10, 3: 40}
        assert {n.id: n.compute_ms for n in g.nodes} == {0: 1, 1: 2, 2: 3, 3: 4}
        assert {(e.source, e.target) for e in g.edges} == {(0, 1), (0, 2), (2, 1), (1, 3)}
        assert g.metadata.extra["param_cost_total"] == 12
        actions = store_all(g)
        assert [a.node for a in actions if a.op is ActionOp.compute] == [0, 2, 1, 3]
        # C0 30; C2 40; C1 30+10+20=60 (0 and 2 freed after); C3 20+40=60
        assert simulate(g, actions).peak_bytes == 60


def test_load_graph_imports_node_link_files_on_the_fly(tmp_path: Path) -> None:
    path = write(tmp_path, "tiny.json", checkmate_doc())
    loaded, imported = load_graph(path), import_checkmate_file(path)
    assert loaded.content_hash() == imported.content_hash()
    assert loaded.nodes == imported.nodes and loaded.metadata.source.startswith("checkmate:")


def test_imported_graph_round_trips_as_graph_json(tmp_path: Path) -> None:
    g = import_checkmate(layered_doc())
    out = tmp_path / "graph.json"
    out.write_text(g.model_dump_json())
    again = load_graph(out)
    assert again == g and again.content_hash() == g.content_hash()


BAD_FILES: dict[str, tuple[Any, str]] = {
    "missing cost fields": (
        lambda d: [d["nodes"][1].pop(k) for k in ("cost_cpu", "cost_ram")],
        "nodes[1] (id 7): missing cost fields",
    ),
    "missing id": (lambda d: [d["nodes"][0].pop(k) for k in ("id", "name")], "missing field 'id'"),
    "string id": (lambda d: d["nodes"][0].update(id="a"), "must be a non-negative integer"),
    "NaN cost": (lambda d: d["nodes"][0].update(cost_cpu=math.nan), "cost_cpu"),
    "negative bytes": (lambda d: d["nodes"][0].update(cost_ram=-1), "cost_ram"),
    "cost not a number": (lambda d: d["nodes"][0].update(cost_cpu="fast"), "is not a number"),
    "fractional bytes": (lambda d: d["nodes"][0].update(cost_ram=1.5), "not whole bytes"),
    "dangling link": (lambda d: d["links"].append({"source": 1, "target": 99}), "missing node 99"),
    "link without ends": (lambda d: d["links"].append({"from": 1}), "links[6]"),
    "cycle": (lambda d: d["links"].append({"source": 1, "target": 5}), "cycle"),
    "duplicate id": (lambda d: d["nodes"][1].update(id=5), "duplicate node id 5"),
    "no nodes key": (lambda d: d.pop("nodes"), "node-link"),
    "bad order": (lambda d: d["graph"].update(order="[1, 2"), "graph.order"),
    "order not a permutation": (lambda d: d["graph"].update(order=[5, 7]), "order"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_node_link_files_are_one_line_input_errors(tmp_path: Path, case: str) -> None:
    fn, fragment = BAD_FILES[case]
    doc = checkmate_doc()
    fn(doc)
    path = write(tmp_path, "bad.json", doc)
    with pytest.raises(InputError) as info:
        import_checkmate_file(path)
    msg = str(info.value)
    assert msg.startswith(str(path)), msg
    assert fragment in msg, msg
    assert "\n" not in msg


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        import_checkmate_file(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        import_checkmate_file(tmp_path / "bad.json")


# -- the shared benchmark graphs (skipped where ../shared is absent) -----------------------------

FCN8_STORE_ALL_PEAK = 13_484_795_520  # published (see shared/graphs/README.md)


def test_fcn8_store_all_peak_matches_the_published_figure(shared_checkmate_dir: Path) -> None:
    g = import_checkmate_file(shared_checkmate_dir / "fcn8_vgg_b32_train.json")
    assert len(g.nodes) == 73 and len(g.edges) == 149
    assert store_all_peak_bytes(g) == FCN8_STORE_ALL_PEAK
    assert math.ceil(0.9 * FCN8_STORE_ALL_PEAK) == 12_136_315_968  # ~11.3 GiB


def test_every_shared_graph_imports_and_every_baseline_is_valid(
    shared_checkmate_dir: Path,
) -> None:
    files = sorted(shared_checkmate_dir.glob("*.json"))
    assert len(files) >= 8
    for path in files:
        g = import_checkmate_file(path)
        raw = json.loads(path.read_text())
        assert [n.id for n in g.nodes] == [n.get("id", n.get("name")) for n in raw["nodes"]]
        assert len(g.edges) == len(raw["links"])
        order = raw["graph"].get("order")
        if order is not None:
            expected = json.loads(order) if isinstance(order, str) else order
            assert g.index.topological_order == expected
        lower = lower_bound_peak_bytes(g)
        store_all_peak = store_all_peak_bytes(g)
        assert lower <= store_all_peak
        for name, baseline in BASELINES.items():
            for budget in (None, math.ceil(0.8 * store_all_peak)):
                sim = simulate(g, baseline(g, budget))  # raises on an invalid plan
                assert sim.peak_bytes >= lower, (path.name, name)
                assert sim.compute_cost >= g.total_compute_ms * (1 - 1e-12), (path.name, name)
