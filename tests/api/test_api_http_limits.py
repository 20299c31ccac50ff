"""HTTP limits (issue 50, item 6): a request whose head is larger than MAX_HEADER_BYTES is
refused before any handler (a 64 MB header was read in full before authentication and stalled
the event loop 5 s), and the service answers others meanwhile."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServerProcess, database_url, running_server

from planner.api.server import MAX_HEADER_BYTES


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("http-limits")
    with database_url("sqlite", workdir) as url, running_server(workdir, url, workers=1) as srv:
        yield srv


def _raw(server: ServerProcess, head: bytes, timeout_s: float = 30.0) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as conn:
        try:
            conn.sendall(head)
        except (BrokenPipeError, ConnectionResetError):  # refused while we were sending
            pass
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


def test_an_oversized_header_is_refused_before_any_handler(server: ServerProcess) -> None:
    big = b"x" * (4 * MAX_HEADER_BYTES)
    answer = _raw(server, b"GET /v1/plans HTTP/1.1\r\nHost: x\r\nX-Big: " + big + b"\r\n\r\n")
    assert not answer.startswith(b"HTTP/1.1 200") and not answer.startswith(b"HTTP/1.1 401"), \
        answer[:200]
    ok = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200"), ok[:200]


def test_a_header_within_the_limit_is_served(server: ServerProcess) -> None:
    fine = b"y" * (MAX_HEADER_BYTES // 4)
    answer = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Fine: " + fine
                  + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
