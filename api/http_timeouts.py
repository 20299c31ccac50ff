"""Read timeouts for request heads and bodies (issue 50 item 6): uvicorn's h11 protocol with a
clock (`planner.api.server` serves with it).

uvicorn bounds only the idle time between kept-alive requests (`timeout_keep_alive`): a client
that opens a connection and sends nothing, sends its headers a byte at a time (slowloris), or
declares `Content-Length: 1000` and sends 2 bytes held its connection (and its slot of
`limit_concurrency`) for as long as it liked. Here each connection is looked at every second
while it is reading a request:

- the request line and headers must be complete within HEAD_TIMEOUT_S of the connection's
  start (or of the previous response's end, on a kept-alive connection);
- a body must make progress: at most BODY_IDLE_TIMEOUT_S without a byte, and all of it within
  BODY_TIMEOUT_S of its head (16 MiB, the largest body, at 140 KB/s). Time the server itself
  does not read (the application has not asked for more yet: flow control) is not counted.

Past either, the client gets `408 Request Timeout` (when no response has begun) and the
connection is closed; the application, if it was reading the body, sees the client leave.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
BODY_IDLE_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 120.0
TICK_S = 1.0
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _timeout_body(message: str) -> bytes:
    import json

    return json.dumps({"error": {"code": "request_timeout", "message": message,
                                 "details": None}}).encode()


class TimedH11Protocol(H11Protocol):
    """H11Protocol that closes connections whose request head or body is read too slowly."""

    head_timeout_s = HEAD_TIMEOUT_S
    body_idle_timeout_s = BODY_IDLE_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tick: asyncio.TimerHandle | None = None
        self._phase: tuple[int, Any] | None = None
        self._phase_since = 0.0
        self._last_data = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._last_data = self._phase_since = self.loop.time()
        self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_data = self.loop.time()
        super().data_received(data)

    def _schedule(self) -> None:
        self._tick = self.loop.call_later(TICK_S, self._check)

    def _check(self) -> None:
        self._tick = None
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        state = self.conn.their_state
        phase = (id(self.cycle), state)
        if phase != self._phase:  # a new request, or its head is in: its clock starts now
            self._phase, self._phase_since = phase, now
            self._last_data = max(self._last_data, now - TICK_S)
        if self.flow is not None and self.flow.read_paused:
            self._last_data = now  # the server is not reading: not the client's time
        expired = None
        if state is h11.IDLE and self.timeout_keep_alive_task is None \
                and now - self._phase_since > self.head_timeout_s:
            expired = f"the request's head was not complete within {self.head_timeout_s:g} s"
        elif state is h11.SEND_BODY:
            if now - self._last_data > self.body_idle_timeout_s:
                expired = f"no byte of the request's body for {self.body_idle_timeout_s:g} s"
            elif now - self._phase_since > self.body_timeout_s:
                expired = f"the request's body was not complete within {self.body_timeout_s:g} s"
        if expired is None:
            self._schedule()
            return
        self._expire(expired)

    def _expire(self, reason: str) -> None:
        started = self.cycle is not None and self.cycle.response_started
        if not started and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = _timeout_body(f"request timeout: {reason}; the connection is closed")
            self.transport.write(TIMEOUT_RESPONSE % (len(body), body))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()
