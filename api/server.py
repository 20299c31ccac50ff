"""Run the service: bind the port first, then start the application.

uvicorn runs the application's start-up (store schema, the job dispatcher taking over the jobs
of dead instances) before it binds its port; a second server started on a busy port would do
all that and only then fail. Binding here first makes that a one-line error with its own exit
code, before anything touches the database.

The database is tried next (schema, then one write): a read-only file, a missing directory or
an unreachable PostgreSQL is one line on stderr and exit 5, not a traceback from the start-up.
Then authentication is decided (planner.api.auth_state: a database that held keys and holds
none now refuses to start, exit 5). Only then does `on_ready` run (the CLI's banner, saying
whether authentication is on), so a failed start prints no banner.

Exit codes: 0 stopped cleanly, 4 the port is in use (or cannot be bound), 5 the service could
not start (say, the database is unreachable). 2 and 3 keep their CLI meanings (bad input, no
plan fits).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable

from planner.api.settings import Settings

EXIT_PORT_IN_USE = 4
EXIT_START_FAILED = 5
MAX_HEADER_BYTES = 64 * 1024  # a request line and headers, together
MAX_CONNECTIONS = 1000  # open connections and tasks at once; beyond: 503
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this

__all__ = ["EXIT_PORT_IN_USE", "EXIT_START_FAILED", "PortUnavailable", "bind_socket",
           "check_auth", "check_database", "serve"]


class PortUnavailable(OSError):
    """The address cannot be bound; `str()` is the one-line message."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket, as uvicorn would make it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Like uvicorn: a restart may reuse the port of connections still in TIME_WAIT, but a
    # listening server on it still makes bind() fail.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortUnavailable(
                f"{host}:{port} is already in use (another planner service?); stop it, or "
                "serve on another port (--port, PLANNER_PORT)"
            ) from None
        raise PortUnavailable(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def check_database(url: str) -> str | None:
    """None when the store at `url` opens, has its schema and takes a write; else one line
    saying why not (read-only, disk full, cannot be opened or reached)."""
    from planner.api.errors import STORAGE_CAUSES, classify_storage_error
    from planner.api.store import Store, new_id

    store = Store(url)
    probe_id = new_id()
    try:
        store.create_schema()
        # A lease row written and removed: a read-only store fails only on a write.
        store.register_instance(probe_id, 1.0, hostname=socket.gethostname(), pid=os.getpid(),
                                address="start-up check")
        store.deregister_instance(probe_id)
    except Exception as e:
        cause = classify_storage_error(e)
        reason = STORAGE_CAUSES[cause] if cause else f"{type(e).__name__}"
        orig = getattr(e, "orig", None) or e
        detail = " ".join(str(orig).split())[:200]
        return f"{reason} ({detail})"
    finally:
        store.dispose()
    return None


def check_auth(settings: Settings) -> tuple[bool, str | None]:
    """(authentication on, or the line to refuse to start with): planner.api.auth_state,
    with the database's keys counted."""
    from planner.api.auth_state import auth_at_start
    from planner.api.store import Store

    store = Store(settings.database_url)
    try:
        return auth_at_start(settings, store.has_keys())
    finally:
        store.dispose()


def serve(settings: Settings, on_ready: Callable[[bool], None] | None = None) -> int:
    """Serve until stopped; the exit code (see the module docstring). `on_ready(auth_on)` runs
    once the port is bound, the database usable and authentication decided, just before
    serving (the banner: whether authentication is on, as decided here, keys in the database
    counted)."""
    import uvicorn

    from planner.api.app import create_app

    try:
        sock = bind_socket(settings.host, settings.port)
    except PortUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    problem = check_database(settings.database_url)
    if problem is not None:
        sock.close()
        print(f"error: the database cannot be used: {problem}; fix it or serve another one "
              "(--database-url, PLANNER_DATABASE_URL)", file=sys.stderr)
        return EXIT_START_FAILED
    auth_on, refusal = check_auth(settings)
    if refusal is not None:  # fail closed: never an open service the operator did not ask for
        sock.close()
        print(f"error: {refusal}", file=sys.stderr)
        return EXIT_START_FAILED
    if on_ready is not None:
        on_ready(auth_on)
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port,
        log_level=settings.log_level,
        # h11 bounds a request's head (httptools, uvicorn's pick where installed, took a 64 MB
        # header before authentication and stalled the event loop 5 s), with read timeouts for
        # heads and bodies (planner.api.http_timeouts: slowloris, a body that never comes);
        # beyond MAX_CONNECTIONS at once, a 503 rather than an unbounded queue of sockets
        http=timed_protocol(settings), h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except SystemExit as e:  # uvicorn's own start-up failure exits 3: "no plan fits" to us
        if e.code not in (0, None):
            return EXIT_START_FAILED
    finally:
        sock.close()
    return 0 if server.started else EXIT_START_FAILED


def timed_protocol(settings: Settings) -> type:
    """uvicorn's h11 protocol with this server's read timeouts."""
    from planner.api.http_timeouts import TimedH11Protocol

    return type("PlannerH11Protocol", (TimedH11Protocol,), {
        "head_timeout_s": settings.head_timeout_s,
        "body_idle_timeout_s": settings.body_idle_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
    })


def main() -> None:
    """`python -m planner.api.server`: settings from PLANNER_* (as `planner-cli serve` without
    flags)."""
    from planner.api.settings import load_settings

    sys.exit(serve(load_settings()))


if __name__ == "__main__":
    main()
