"""Reading and writing graph.json and plan.json with one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import InputError, describe_validation_error
from planner.core.graph import Graph, graph_from_document
from planner.core.json_files import read_json
from planner.core.out_files import write_text
from planner.core.plan import Plan


def graph_from_dict(data: Any, where: str = "graph") -> Graph:
    """A graph.json document or a Checkmate/Moccasin node-link file (imported on the fly).

    graph.json is read strictly (`planner.core.graph.graph_from_document`): each node states id,
    phase, compute_ms and output_bytes, with JSON types, so nothing is silently misread.

    chain.json documents are the chain solver's: `planner.engine.inputs` reads all three."""
    if isinstance(data, dict) and "links" in data and "schema_version" not in data:
        from planner.core.importers.checkmate import import_checkmate

        try:
            return import_checkmate(data, source=where)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
    if is_chain_document(data):
        raise InputError(
            f"{where}: a chain.json, not a graph.json: load it with planner.engine.inputs "
            "(or `planner-cli`, which accepts both)"
        )
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object with 'nodes' and 'edges'")
    try:
        return graph_from_document(data)
    except ValidationError as e:
        raise InputError(f"{where}: {describe_validation_error(e, data)}") from None
    except ValueError as e:  # a node without a required field
        raise InputError(f"{where}: {e}") from None


def is_chain_document(data: Any) -> bool:
    """A chain.json (planner.solvers.chain.model) rather than a graph.json."""
    return isinstance(data, dict) and ("stages" in data or "chain" in data) and "nodes" not in data


def load_graph(path: str | Path) -> Graph:
    return graph_from_dict(read_json(path), where=str(path))


def plan_from_dict(data: Any, where: str = "plan") -> Plan:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object (plan.json)")
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise InputError(f"{where}: {describe_validation_error(e, data)}") from None


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_json(path), where=str(path))


def write_json(path: str | Path, document: Graph | Plan | dict[str, Any]) -> None:
    """Write atomically, so an interrupted write never leaves a half file behind
    (`planner.core.out_files.write_text`)."""
    path = Path(path)
    if isinstance(document, Graph | Plan):
        text = document.model_dump_json(indent=1, exclude_none=False)
    else:
        text = json.dumps(document, indent=1)
    write_text(path, text + "\n")
