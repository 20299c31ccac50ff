"""schemathesis against the running service (`planner-cli serve` on loopback): every check it
has, the rate limit lifted, bounded in time. No request may get a 5xx, no response may break the
OpenAPI document (status codes, content types, schemas, headers, Allow), and a request the schema
allows is refused (ST202, 422) only on a meaning no JSON Schema can state: a graph's references to
its own nodes (edges, alias_of, order, outputs, gradient nodes), unique ids and names, acyclicity,
its byte total, a pipeline's fit to the graph. Each such refusal is read from the run's cassette
and must be one of those: a schema gap (a field, type, bound or enum the schema leaves out)
fails the test with the request."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from api_server import running_server
from pydantic import ValidationError

MAX_TIME_S = 45  # schemathesis' own budget; the test takes this plus the server's start
SEED = 20261123
# Failures schemathesis may report that are not defects: ST202 (schema-valid request rejected),
# as long as every refusal of a generated schema-valid request says one of MEANINGS.
ACCEPTED = {
    "ST202": "schema-valid request rejected on meaning (see MEANINGS)",
    # Not ST301 (use after free): DELETE /v1/plans/{id} removes the job from reads (404).
}
MEANINGS = re.compile("|".join([
    r"refers to missing node",  # edges, alias_of, outputs, gradient_node name other nodes
    r"duplicate node id", r"duplicate edge", r"self-loop", r"has a cycle",
    r"alias_of \d+ must also be an edge", r"order: ", r"duplicate parameter name",
    r"byte counts add up to",  # the total over 2**63 - 1
    r"compute_ms add up to",  # the total over a float's range
    r"names no modules", r"the model has \d+ layers",  # a pipeline against this graph
    r"below the model state of layer", r"use a multiple of",  # micro-batches per device
    r"nothing can be offloaded",  # an offload method on a graph of views only
    # JSON Schema counts 531.0 as an integer; the budget grammar reads a number as written
    # (1 is one byte, 1.0 all of the store-all peak, 531.0 refused with "write 531").
    r"a number with a point or an exponent is a fraction",
    # Partitions' `options` are the pipeline method's (keys, values and the rule that an
    # option given by its own field too is given twice are checked by the one resolution): a
    # schema stating them (properties, a names pattern, `not` clauses) made the generator too
    # slow to reach the server 500 times in the run's time.
    r"no schedule '", r"has no option '", r"given twice",
]))
SERVER_ERRORS = {"ST101", "ST102"}


def _st() -> str:
    local = Path(sys.executable).with_name("st")
    found = str(local) if local.exists() else shutil.which("st")
    if not found:
        pytest.skip("schemathesis' `st` command is not installed (test extras)")
    return found


@pytest.mark.slow
def test_schemathesis_all_checks_no_server_errors(tmp_path: Path) -> None:
    junit, cassette = tmp_path / "junit.xml", tmp_path / "cassette.yaml"
    with running_server(tmp_path, f"sqlite:///{tmp_path / 's.db'}", workers=2,
                        submissions_per_minute=1_000_000, max_time_limit_s=2,
                        default_time_limit_s=1, kill_grace_s=1, max_wait_s=0.5) as srv:
        started = time.monotonic()
        run = subprocess.run(
            [_st(), "run", srv.url + "/openapi.json", "--checks", "all",
             "--max-time", str(MAX_TIME_S), "--workers", "1", "--seed", str(SEED),
             "--request-timeout", "20", "--generation-database", "none", "--no-color",
             "--report", "junit,vcr", "--report-junit-path", str(junit),
             "--report-vcr-path", str(cassette)],
            capture_output=True, text=True,
            timeout=MAX_TIME_S + 600,  # a hang guard: requests run slow beside a busy suite
        )
        elapsed = time.monotonic() - started
        log = srv.log_path.read_text(errors="replace")
    out = run.stdout + run.stderr
    codes = Counter(
        f.get("message", "?") for f in ET.parse(junit).getroot().iter("failure")
    ) if junit.exists() else Counter()
    generated = re.search(r"(\d+) generated", out)
    responses = Counter(m[0] + "xx" for m in re.findall(r'HTTP/1\.1" (\d)\d\d', log))
    print(f"schemathesis: {generated.group(1) if generated else '?'} test cases in "
          f"{elapsed:.0f} s (seed {SEED}); server responses {sorted(responses.items())}; "
          f"failures by code {sorted(codes.items())}")
    assert junit.exists(), out[-4000:]
    assert sum(responses.values()) >= 500, out[-4000:]  # the run reached the server
    assert responses["5xx"] == 0, "server errors:\n" + "\n".join(
        line for line in log.splitlines() if re.search(r'HTTP/1\.1" 5\d\d', line))[:4000]
    assert not SERVER_ERRORS & set(codes), out[-8000:]
    unexpected = {code: n for code, n in codes.items() if code not in ACCEPTED}
    assert not unexpected, f"{unexpected}\n{out[-8000:]}"
    refused = schema_valid_refusals(cassette)
    reasons = Counter(MEANINGS.search(message).group(0) if MEANINGS.search(message) else "?"
                      for _, message, _ in refused)
    print(f"schema-valid requests refused: {len(refused)}, by meaning {sorted(reasons.items())}")
    gaps = [(op, message, body[:600]) for op, message, body in refused
            if not MEANINGS.search(message)]
    assert not gaps, "schema-valid requests refused on what the schema could say:\n" + \
        "\n".join(f"{op}: {message}\n    {body}" for op, message, body in gaps[:8])


def schema_valid_refusals(cassette: Path) -> list[tuple[str, str, str]]:
    """(operation, error message, request body) of each request schemathesis generated as
    schema-valid (positive mode) that the server refused with a 400 or 422."""
    import json

    import yaml

    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with cassette.open() as f:
        interactions = yaml.load(f, Loader=loader)["http_interactions"]
    refused = []
    for it in interactions:
        response = it.get("response") or {}
        status = (response.get("status") or {}).get("code")
        if (it.get("generation") or {}).get("mode") != "positive" or status not in ("400", "422"):
            continue
        text = (response.get("body") or {}).get("string", "")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:300]
        request = it["request"]
        operation = f"{request['method']} {request['uri'].split('?')[0].split('/', 3)[-1]}"
        refused.append((operation, message, (request.get("body") or {}).get("string", "")))
    return refused


def test_the_document_states_this_servers_caps_and_exact_bounds(tmp_path: Path) -> None:
    """The OpenAPI document a server serves says its own caps (settings), and 2**60 as
    1152921504606846976, not FastAPI's float 1.152921504606847e+18 (24 bytes more)."""
    import json

    from planner.api.app import create_app
    from planner.api.request_documents import install_server_schema
    from planner.api.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", max_time_limit_s=2,
                        max_sweep_budgets=5, max_nodes=7, max_edges=9)
    app = create_app(settings)
    install_server_schema(app, settings)  # a no-op once create_app installs it
    document = app.openapi()
    schemas = document["components"]["schemas"]
    assert schemas["PlanRequest"]["properties"]["time_limit"]["maximum"] == 2
    assert schemas["SweepRequest"]["properties"]["budgets"]["maxItems"] == 5
    upload = document["paths"]["/v1/graphs"]["post"]["requestBody"]["content"]
    graph = upload["application/json"]["schema"]["properties"]
    assert graph["nodes"]["maxItems"] == 7 and graph["edges"]["maxItems"] == 9
    assert "cpsat-intervals" in schemas["PlanRequest"]["properties"]["method"]["enum"]
    text = json.dumps(document)
    assert '"maximum": 1152921504606846976' in text and "1.152921504606847e+18" not in text


def test_every_budget_string_the_schema_allows_parses() -> None:
    """BUDGET_PATTERN (the schema's budget strings) only lets through budgets the grammar
    reads, each at most 1 EiB (or 2**20 x the store-all peak)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from planner.api.request_documents import BUDGET_PATTERN
    from planner.core.budget import parse_budget_spec

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(BUDGET_PATTERN, fullmatch=True))
    def parses(text: str) -> None:
        parse_budget_spec(text).resolve(10**6)

    parses()
    for text in ("999999.999TiB", "999999999999999999B", ".000001", "1.000", "999999.999%"):
        assert re.fullmatch(BUDGET_PATTERN, text), text
        parse_budget_spec(text).resolve(10**6)
    for text in ("0", "0%", "1.5", "1e9", "12GiB "):  # refused by the grammar: not in the schema
        assert not re.fullmatch(BUDGET_PATTERN, text), text


def test_integers_written_with_a_zero_fraction_are_integers() -> None:
    """JSON Schema's "integer" admits 4.0: a graph, resources document, method options and
    partition fields read it as 4; 4.5 still reaches the strict parsers (a 422 there)."""
    from planner.api.routers.partitions import PartitionRequest
    from planner.api.schemas import PlanRequest

    node = {"id": 3.0, "phase": "loss", "compute_ms": 1.0, "output_bytes": 8.0}
    body = PlanRequest(graph={"nodes": [node, {**node, "id": 4.5}],
                              "edges": [{"source": 3.0, "target": 4.5}]},
                       budget=0.5, method="rotor", options={"slots": 4.0},
                       resources={"device_count": 2.0, "device_memory_bytes": 8e9})
    assert body.graph is not None and body.resources is not None
    nodes, edge = body.graph["nodes"], body.graph["edges"][0]
    assert [type(nodes[0][k]) for k in ("id", "compute_ms", "output_bytes")] == [int, float, int]
    assert nodes[1]["id"] == 4.5 and type(edge["source"]) is int and edge["target"] == 4.5
    assert body.options == {"slots": 4} and type(body.options["slots"]) is int
    assert body.resources == {"device_count": 2, "device_memory_bytes": 8_000_000_000}
    partition = PartitionRequest(graph={"nodes": [node]}, devices=4.0, microbatches=8.0)
    assert (type(partition.devices), type(partition.microbatches)) == (int, int)
    for lax in ({"device_count": "4"}, {"device_link": {"bandwidth_bytes_per_s": 1,
                                                        "latency_s": False}}):
        with pytest.raises(ValidationError, match="should be a valid"):  # as its schema says
            PlanRequest(graph_id="g", budget=0.5, resources=lax)
