"""The service with host copies: a plan job's report carries the transfer figures the CLI shows
(bytes each way, hidden vs exposed copy time, host peak, makespan), and bad offload requests
are HTTP 422 with the CLI's one line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_server import ServerProcess, running_server, wait_finished

from planner.core.synthetic import training_graph

GRAPH = training_graph(12, skip=2, seed=7, fixed_bytes=4096)
DOC = GRAPH.model_dump(mode="json")
MACHINE = {"preset": "h100-pcie-gen5", "host_memory_bytes": 2**34}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("offload-api")
    with running_server(workdir, f"sqlite:///{workdir / 's.db'}", workers=1,
                        submissions_per_minute=100_000, max_time_limit_s=30) as srv:
        yield srv


def test_plan_report_carries_the_transfer_figures(server: ServerProcess) -> None:
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": DOC, "budget": 0.8, "resources": MACHINE,
                                      "method": "offload-greedy", "time_limit": 10})
        assert r.status_code in (200, 202), r.text
        job = wait_finished(c, r.json()["id"])
    assert job["status"] == "done", job
    report = job["report"]
    for key in ("d2h_bytes", "h2d_bytes", "transfer_hidden_ms", "transfer_exposed_ms",
                "host_peak_bytes", "makespan_ms"):
        assert key in report, report
    assert report["d2h_bytes"] > 0 and report["host_memory_bytes"] == 2**34
    assert report["transfer_hidden_ms"] + report["transfer_exposed_ms"] == pytest.approx(
        report["transfer_ms"])


@pytest.mark.parametrize(
    ("resources", "pinned", "needle"),
    [
        ({**MACHINE, "host_memory_bytes": 0}, False, "host_memory_bytes is 0"),
        ("h100-pcie-gen5", False, "host_memory_bytes is unset"),
        ({**MACHINE, "h2d": {"bandwidth_bytes_per_s": 0}}, False, "h2d.bandwidth_bytes_per_s"),
        (MACHINE, True, "nothing can be offloaded"),
    ],
    ids=["host-zero", "no-host", "zero-bandwidth", "nothing-offloadable"],
)
def test_bad_offload_requests_are_422(server: ServerProcess, resources: object, pinned: bool,
                                      needle: str) -> None:
    doc = {**DOC, "nodes": [{**n, "offloadable": False} for n in DOC["nodes"]]} if pinned else DOC
    with server.client() as c:
        r = c.post("/v1/plans", json={"graph": doc, "budget": 0.8, "resources": resources,
                                      "method": "offload-greedy"})
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert needle in message and "\n" not in message, message
