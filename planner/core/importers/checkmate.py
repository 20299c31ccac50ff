"""Import the Checkmate/Moccasin networkx node-link JSON files onto graph.json.

Two variants exist (see shared/graphs/README.md):
- Checkmate: nodes carry `id`, `name`, `backward`, `cost_cpu` (compute), `cost_ram` (output
  bytes); edges are `links` with `source`/`target`.
- Moccasin's random_layered: nodes carry `name` (the id), `out_cost`, `duration`, `param_cost`;
  edges have their endpoints under the keys "0" and "1"; `graph.order` (a list or its JSON text)
  is the topological order that published results used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import InputError, describe_validation_error
from planner.core.graph import CostSource, Edge, FixedMemory, Graph, GraphMetadata, Node, Phase


def import_checkmate_file(path: str | Path) -> Graph:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    try:
        return import_checkmate(data, source=path.name)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None


def import_checkmate(data: Any, source: str = "") -> Graph:
    if not isinstance(data, dict) or "nodes" not in data:
        raise InputError("not a node-link graph: expected an object with 'nodes' and 'links'")
    raw_nodes = data["nodes"]
    raw_links = data.get("links", data.get("edges", []))
    if not isinstance(raw_nodes, list) or not isinstance(raw_links, list):
        raise InputError("'nodes' and 'links' must be lists")
    meta = data.get("graph") or {}
    nodes = [_node(i, raw) for i, raw in enumerate(raw_nodes)]
    edges = [_edge(i, raw) for i, raw in enumerate(raw_links)]
    order = _order(meta.get("order"))
    param_bytes = sum(int(raw.get("param_cost") or 0) for raw in raw_nodes if isinstance(raw, dict))
    try:
        return Graph(
            nodes=nodes,
            edges=edges,
            order=order,
            fixed=FixedMemory(parameters_bytes=0),
            metadata=GraphMetadata(
                model_name=str(meta.get("name", "")),
                source=f"checkmate:{source}" if source else "checkmate",
                extra={"param_cost_total": param_bytes} if param_bytes else {},
            ),
        )
    except ValidationError as e:
        raise InputError(describe_validation_error(e)) from None


def _node(i: int, raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise InputError(f"nodes[{i}]: expected an object, got {type(raw).__name__}")
    if "id" in raw:
        node_id = raw["id"]
    elif "name" in raw:
        node_id = raw["name"]
    else:
        raise InputError(f"nodes[{i}]: missing field 'id' (or an integer 'name')")
    if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id < 0:
        raise InputError(f"nodes[{i}]: id {node_id!r} must be a non-negative integer")
    if "cost_ram" in raw or "cost_cpu" in raw:
        out_bytes = _number(raw, "cost_ram", i, node_id)
        cost = _number(raw, "cost_cpu", i, node_id)
        name = str(raw.get("name", node_id))
        backward = bool(raw.get("backward", False))
        phase = Phase.backward if backward else Phase.forward
        if name.lower() == "loss":
            phase = Phase.loss
    elif "out_cost" in raw or "duration" in raw:
        out_bytes = _number(raw, "out_cost", i, node_id)
        cost = _number(raw, "duration", i, node_id)
        name = str(raw.get("label", raw.get("name", node_id)))
        phase = Phase.forward
    else:
        raise InputError(
            f"nodes[{i}] (id {node_id}): missing cost fields: expected cost_cpu/cost_ram "
            "(Checkmate) or duration/out_cost (random_layered)"
        )
    if out_bytes != int(out_bytes):
        raise InputError(f"nodes[{i}] (id {node_id}): output size {out_bytes} is not whole bytes")
    return Node(
        id=node_id,
        name=name,
        op=str(raw.get("op", "")),
        phase=phase,
        compute_ms=cost,
        cost_source=CostSource.imported,
        output_bytes=int(out_bytes),
    )


def _number(raw: dict[str, Any], key: str, i: int, node_id: int) -> float:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"nodes[{i}] (id {node_id}).{key}: {value!r} is not a number")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise InputError(f"nodes[{i}] (id {node_id}).{key}: {value!r} must be a finite number ≥ 0")
    return float(value)


def _edge(i: int, raw: Any) -> Edge:
    if not isinstance(raw, dict):
        raise InputError(f"links[{i}]: expected an object")
    if "source" in raw and "target" in raw:
        u, v = raw["source"], raw["target"]
    elif "0" in raw and "1" in raw:
        u, v = raw["0"], raw["1"]
    else:
        raise InputError(f"links[{i}]: expected 'source' and 'target' (or '0' and '1') endpoints")
    for end in (u, v):
        if not isinstance(end, int) or isinstance(end, bool):
            raise InputError(f"links[{i}]: endpoint {end!r} is not an integer node id")
    return Edge(source=u, target=v)


def _order(raw: Any) -> list[int] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise InputError("graph.order: not a JSON list of node ids") from None
    if not isinstance(raw, list) or not all(isinstance(v, int) for v in raw):
        raise InputError("graph.order: expected a list of integer node ids")
    return list(raw)
