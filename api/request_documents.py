"""What the OpenAPI document says of request bodies beyond their models' Python types, and
what the server reads accordingly: the graph and resources documents stated as their own schemas
(graph.json, resources.json), read as JSON Schema reads them (4.0 is the integer 4); the budget
grammar's forms; this server's caps (its settings) in its document, with bounds stated exactly.

So a request the schema allows is one the server accepts, as far as a schema can say: what it
cannot (a graph's edges naming its nodes, acyclicity, a budget's size against the graph) is a
422 on meaning, naming the field.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    GetJsonSchemaHandler,
    StrictStr,
    ValidationError,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from planner.api.caps import (
    MAX_DATA_PARALLEL,
    MAX_SWEEP_BUDGETS,
    RESOURCE_CAPS,
    option_cap,
)
from planner.core.budget import MAX_BUDGET_BYTES, MIN_FRACTION
from planner.core.errors import describe_validation_error
from planner.core.graph import MAX_NODE_ID, Graph
from planner.core.resources import Resources, preset_names

if TYPE_CHECKING:
    from fastapi import FastAPI

    from planner.api.settings import Settings
    from planner.engine.options import OptionSpec


class _DocumentJsonSchema:
    """Marks a request's document (a graph, a machine): validated as any JSON object here (its
    own parser refuses the rest with a 422 naming the field), stated in the schema as
    `model`'s own schema (required fields, types, bounds), with `patch` applied to it."""

    def __init__(self, model: type[BaseModel], patch: Callable[[dict[str, Any]], None]) -> None:
        self.model, self.patch = model, patch

    def __get_pydantic_json_schema__(
        self, _: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        reference = handler(self.model.__pydantic_core_schema__)
        self.patch(handler.resolve_ref_schema(reference))
        return reference


def _graph_patch(graph: dict[str, Any]) -> None:
    """What Graph's validators check that a schema can state too."""
    graph["properties"]["nodes"]["minItems"] = 1  # at least one node
    frozen = {"required": ["trainable"], "properties": {"trainable": {"const": False}}}
    graph["allOf"] = [{  # with model_state: model-state bytes follow from it, not from fixed
        "if": {"required": ["model_state"], "properties": {"model_state": {"type": "object"}}},
        "then": {"properties": {
            "fixed": {"properties": {f"{kind}_bytes": {"maximum": 0}
                                     for kind in ("parameters", "gradients", "optimizer")}},
            # a frozen parameter has no gradient node; the data-parallel degree has its cap
            "model_state": {"properties": {
                "parameters": {"items": {
                    "if": frozen, "then": {"properties": {"gradient_node": {"type": "null"}}}}},
                "data_parallel_degree": {"maximum": MAX_DATA_PARALLEL}}},
        }},
    }]


def _resources_patch(resources: dict[str, Any]) -> None:
    """The caps (planner.api.caps) and the preset names."""
    fields = resources["properties"]
    for name, cap in RESOURCE_CAPS.items():
        for branch in fields[name].get("anyOf", [fields[name]]):
            if branch.get("type") == "integer":
                branch["maximum"] = cap
    fields["preset"]["enum"] = preset_names()
    # A host tier needs links both ways: given (one mirrors the other) or a preset's.
    resources["if"] = {"required": ["host_memory_bytes"],
                       "properties": {"host_memory_bytes": {"type": "integer", "minimum": 1}}}
    resources["then"] = {
        "properties": {link: {"not": {"type": "null"}} for link in ("h2d", "d2h")},
        "anyOf": [{"required": [key]} for key in ("preset", "h2d", "d2h")],
    }


def _resolved(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else schema


def _branches(schema: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    schema = _resolved(schema, defs)
    return [_resolved(b, defs) for b in schema.get("anyOf", [schema])]


def _as_json_schema_reads(value: Any, schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """`value` with every integral float where `schema` says integer made an int, in place."""
    branches = _branches(schema, defs)
    if isinstance(value, float):
        integer = value.is_integer() and any(b.get("type") == "integer" for b in branches)
        return int(value) if integer else value
    for branch in branches:
        if isinstance(value, dict) and "properties" in branch:
            for key, field in branch["properties"].items():
                if key in value:
                    value[key] = _as_json_schema_reads(value[key], field, defs)
            return value
        if isinstance(value, list) and "items" in branch:
            _items_as_json_schema_reads(value, branch["items"], defs)
            return value
    return value


def _items_as_json_schema_reads(items: list[Any], schema: dict[str, Any],
                                defs: dict[str, Any]) -> None:
    """Each of `items` as `schema` reads it; for objects (nodes, edges: 20,000 of them) the
    integer and nested fields are looked up once, not per item."""
    fields = next((b["properties"] for b in _branches(schema, defs) if "properties" in b), None)
    if fields is None:
        for i, item in enumerate(items):
            items[i] = _as_json_schema_reads(item, schema, defs)
        return
    integers, nested = [], []
    for key, field in fields.items():
        kinds = {b.get("type") for b in _branches(field, defs)}
        if "integer" in kinds:
            integers.append(key)
        elif kinds & {"object", "array"}:
            nested.append((key, field))
    for item in items:
        if not isinstance(item, dict):
            continue
        for key in integers:
            value = item.get(key)
            if type(value) is float and value.is_integer():
                item[key] = int(value)
        for key, field in nested:
            if key in item:
                item[key] = _as_json_schema_reads(item[key], field, defs)


@functools.cache
def _graph_schema() -> dict[str, Any]:
    return Graph.model_json_schema()


def graph_as_json_schema_reads(document: Any) -> Any:
    """A graph document as its schema reads it: JSON Schema's "integer" admits 4.0, so an
    integral float where graph.json says integer (an id, a byte count) is that integer. The
    graph's strict parser refuses the rest as before (4.5, "4", true)."""
    if isinstance(document, dict):
        schema = _graph_schema()
        _as_json_schema_reads(document, schema, schema.get("$defs", {}))
    return document


@functools.cache
def _resources_schema() -> dict[str, Any]:
    return Resources.model_json_schema()


def resources_as_json_schema_reads(document: Any) -> Any:
    """A resources document as its schema reads it (for a field validator, mode "before"): as
    a graph, 4.0 is 4 where it says integer; then JSON's types strictly (false is not 0, "4"
    not 4), which the document's own parser would let through; ValueError naming the field."""
    if isinstance(document, dict):
        schema = _resources_schema()
        _as_json_schema_reads(document, schema, schema.get("$defs", {}))
        try:
            Resources.model_validate_json(json.dumps(document), strict=True)
        except ValidationError as e:
            raise ValueError(describe_validation_error(e, document)) from None
    return document


def finite_compute_total(document: dict[str, Any]) -> dict[str, Any]:
    """ValueError when the nodes' compute_ms add up to more than a float holds (each is a
    finite number, as the schema says; their sum, which every simulation takes, is not)."""
    nodes = document.get("nodes")
    costs = [n.get("compute_ms") for n in nodes if isinstance(n, dict)] \
        if isinstance(nodes, list) else []
    try:
        math.fsum(c for c in costs if isinstance(c, int | float) and not isinstance(c, bool))
    except OverflowError:
        raise ValueError("nodes' compute_ms add up to more than a float holds (about 1.8e308); "
                         "give costs in a smaller unit") from None
    return document


# A resources.json document: Resources' schema, with the caps (planner.api.caps).
ResourcesDocument = Annotated[dict[str, Any], _DocumentJsonSchema(Resources, _resources_patch)]
GraphBody = Annotated[
    dict[str, Any],
    BeforeValidator(graph_as_json_schema_reads),
    AfterValidator(finite_compute_total),
    _DocumentJsonSchema(Graph, _graph_patch),
]


def integral(value: object) -> object:
    """4.0 as 4: a JSON Schema "integer" admits both (for a field validator, mode "before");
    4.5, "4" and true stay as they are, for the field's strict check to refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# A resources preset by name: the schema lists the canonical names (the server also reads
# them in any case, and refuses an unknown one with the list).
PresetName = Annotated[StrictStr, WithJsonSchema({"type": "string", "enum": preset_names()})]
# The budget grammar's forms (planner.core.budget), as far as a schema can say them: a JSON
# integer is bytes (from 1 up: 1 is one byte), a number with a point a fraction in (0, 1], a
# string a percentage, bytes with a unit, an integer (bytes) or a fraction (sizes bounded so
# that none passes 1 EiB). JSON Schema counts 1.0 as an integer too: the descriptions say that
# the grammar reads the number as written (1 is one byte, 1.0 all of the store-all peak).
BYTES_PATTERN = (
    r"[1-9][0-9]{0,5}(\.[0-9]{1,3})?[KMGT]i?B|[1-9][0-9]{0,17}B|[1-9][0-9]{0,17}"
)
BYTES_TEXT_PATTERN = f"^({BYTES_PATTERN})$"  # bytes only: device memory
BUDGET_PATTERN = (
    rf"^([1-9][0-9]{{0,5}}(\.[0-9]{{1,3}})?%|{BYTES_PATTERN}|0?\.[0-9]{{0,5}}[1-9]|1\.0{{0,3}})$"
)
BUDGET_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_BUDGET_BYTES},
        {"type": "number", "minimum": MIN_FRACTION, "maximum": 1},
        {"type": "string", "pattern": BUDGET_PATTERN},
    ]
}
DEVICE_MEMORY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_BUDGET_BYTES},
        {"type": "string", "pattern": BYTES_TEXT_PATTERN},
    ]
}


def install_server_schema(app: FastAPI, settings: Settings) -> None:
    """Make `app`'s OpenAPI document state this server's own caps (its settings), so that what
    the schema allows is what this server accepts: the time limit (max_time_limit_s), sweep
    length (max_sweep_budgets), graph size (max_nodes, max_edges) and the methods registered
    here (the built-ins and the operator's extra_methods)."""
    if getattr(app.state, "server_schema", False):
        return  # installed once: the caps are added once
    app.state.server_schema = True
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = build()
        if fresh:
            with_server_caps(document, settings)
            _exact_bounds(document)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def with_server_caps(document: dict[str, Any], settings: Settings) -> None:
    """`document` (an OpenAPI document of this API) with `settings`' caps, in place."""
    from planner.engine.registry import method_names

    schemas = document.get("components", {}).get("schemas", {})
    cap_s = settings.max_time_limit_s
    for name in ("PlanRequest", "SweepRequest", "PartitionRequest"):
        fields = schemas.get(name, {}).get("properties", {})
        if "time_limit" in fields:
            fields["time_limit"]["maximum"] = min(fields["time_limit"].get("maximum", cap_s), cap_s)
        if name != "PartitionRequest" and "method" in fields:
            fields["method"]["enum"] = method_names()
            schemas[name].setdefault("allOf", []).extend(options_rules(method_names()))
    budgets = schemas.get("SweepRequest", {}).get("properties", {}).get("budgets")
    if budgets is not None:
        budgets["maxItems"] = min(budgets.get("maxItems", MAX_SWEEP_BUDGETS),
                                  settings.max_sweep_budgets)
    for graph in _graph_schemas(document):
        graph["properties"]["nodes"]["maxItems"] = settings.max_nodes
        graph["properties"]["edges"]["maxItems"] = settings.max_edges


def options_rules(methods: list[str]) -> list[dict[str, Any]]:
    """Schema rules: with built-in method m (auto when none is named), options are m's own
    (planner.engine.options), nothing else; a plugin method takes what it takes."""
    from planner.engine.registry import method_spec

    rules = []
    for name in methods:
        spec = method_spec(name)
        if spec is None:
            continue
        named: dict[str, Any] = {"required": ["method"],
                                 "properties": {"method": {"const": name}}}
        condition = {"anyOf": [named, {"not": {"required": ["method"]}}]} if name == "auto" \
            else named
        own = {o.name: _option_schema(o) for o in spec.option_specs()}
        rules.append({"if": condition, "then": {"properties": {"options": {
            "type": "object", "properties": own, "additionalProperties": False}}}})
        if spec.pipeline:  # a pipeline method: resources that say the micro-batches
            rules.append({"if": named, "then": {"required": ["resources"], "properties": {
                "resources": {"type": "object", "required": ["microbatches"], "properties": {
                    "microbatches": {"type": "integer", "minimum": 2}}}}}})
        if spec.needs_host_tier:  # an offload method: resources with a host tier
            rules.append({"if": named, "then": {"required": ["resources"], "properties": {
                "resources": {"type": "object", "required": ["host_memory_bytes"], "properties": {
                    "host_memory_bytes": {"type": "integer", "minimum": 1}}}}}})
    return rules


def _option_schema(option: OptionSpec) -> dict[str, Any]:
    schema: dict[str, Any] = {"bool": {"type": "boolean"}, "int": {"type": "integer"},
                              "str": {"type": "string"}}.get(option.kind, {})
    if option.kind == "choice":
        schema = {"type": "string", "enum": list(option.choices)}
    if option.kind == "int":  # the maximum: the option's own or this server's cap
        maximum = option_cap(option.name, option.kind, option.maximum)
        schema.update({k: v for k, v in (("minimum", option.minimum),
                                         ("maximum", maximum)) if v is not None})
    return {"anyOf": [schema, {"type": "null"}]} if option.nullable else schema


def int_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with 4.0 as 4 where built-in `method` takes an integer (the schema's reading),
    in place; a plugin's options stay as given."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    for option in spec.option_specs() if spec is not None else ():
        value = options.get(option.name)
        if option.kind == "int" and type(value) is float and value.is_integer():
            options[option.name] = int(value)
    return options


def _graph_schemas(node: Any) -> list[dict[str, Any]]:
    """Every graph.json schema in `node` (inlined where a body uses it, or a component)."""
    found = []
    if isinstance(node, dict):
        properties = node.get("properties")
        if node.get("title") == "Graph" and isinstance(properties, dict) and "nodes" in properties:
            found.append(node)
        for value in node.values():
            found += _graph_schemas(value)
    elif isinstance(node, list):
        for value in node:
            found += _graph_schemas(value)
    return found


# FastAPI's OpenAPI model holds bounds as floats: 2**60 came out as 1.152921504606847e+18,
# which a client reads as 1152921504606847000 (24 over). The bounds this API states, exactly.
_EXACT_BOUNDS = {float(v): v for v in (MAX_BUDGET_BYTES, MAX_NODE_ID)}
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _exact_bounds(node: Any) -> None:
    """Integral float bounds in `node` (an OpenAPI document) as exact integers, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _BOUND_KEYS and isinstance(value, float) and value.is_integer():
                node[key] = _EXACT_BOUNDS.get(value, int(value))
            else:
                _exact_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _exact_bounds(value)
