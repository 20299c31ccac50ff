"""Read timeouts (issue 50 item 6): a body that stops coming (`Content-Length: 1000`, 2 bytes
sent), a head sent a byte at a time (slowloris) and a connection that sends nothing are each
answered 408 and closed within a bounded time (the server's head_timeout_s,
body_idle_timeout_s, body_timeout_s; 10 s, 10 s and 120 s by default), while the service
answers others; a slow client that keeps sending within the limits is served."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServerProcess, database_url, running_server

LIMIT_S = 2.0  # each timeout of the test server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("http-timeouts")
    with database_url("sqlite", workdir) as url, running_server(
            workdir, url, workers=1, head_timeout_s=LIMIT_S, body_idle_timeout_s=LIMIT_S,
            body_timeout_s=3 * LIMIT_S) as srv:
        yield srv


def _answer(conn: socket.socket, within_s: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed (seconds)."""
    start = time.monotonic()
    conn.settimeout(within_s)
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        raise AssertionError(f"the connection was still open after {within_s} s") from None
    except ConnectionResetError:
        pass
    return b"".join(chunks), time.monotonic() - start


def _healthz(server: ServerProcess) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _answer(conn, 10)[0]


def test_a_body_that_stops_coming_is_closed(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/graphs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 1000\r\n\r\n{\"")
        assert _healthz(server).startswith(b"HTTP/1.1 200")  # others are served meanwhile
        answer, _ = _answer(conn, 10 * LIMIT_S)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer


def test_a_head_sent_a_byte_at_a_time_is_closed(server: ServerProcess) -> None:
    """Slowloris: every byte within the idle time, the head never complete."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        start = time.monotonic()
        closed = False
        for byte in head:
            try:
                conn.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.25)
            if time.monotonic() - start > 10 * LIMIT_S:
                break
        answer = b"" if closed else _answer(conn, 10 * LIMIT_S)[0]
    assert time.monotonic() - start < 10 * LIMIT_S
    assert closed or answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_a_silent_connection_is_closed(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        answer, _ = _answer(conn, 10 * LIMIT_S)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_a_slow_body_that_keeps_coming_is_served(server: ServerProcess) -> None:
    """A byte every half of the idle limit, the whole body within the body limit: served."""
    body = b"{}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/graphs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nConnection: close\r\nContent-Length: 2\r\n\r\n")
        for byte in body:
            time.sleep(LIMIT_S / 2)
            conn.sendall(bytes([byte]))
        answer, _ = _answer(conn, 10 * LIMIT_S)
    assert answer.startswith(b"HTTP/1.1 422"), answer[:200]  # served: {} is no graph
