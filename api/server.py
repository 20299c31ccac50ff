"""Run the service: bind the port first, then start the application.

uvicorn runs the application's start-up (store schema, the job dispatcher taking over the jobs
of dead instances) before it binds its port; a second server started on a busy port would do
all that and only then fail. Binding here first makes that a one-line error with its own exit
code, before anything touches the database.

Exit codes: 0 stopped cleanly, 4 the port is in use (or cannot be bound), 5 the service could
not start (say, the database is unreachable; the log says why). 2 and 3 keep their CLI meanings
(bad input, no plan fits).
"""

from __future__ import annotations

import errno
import socket
import sys

from planner.service.settings import Settings

EXIT_PORT_IN_USE = 4
EXIT_START_FAILED = 5

__all__ = ["EXIT_PORT_IN_USE", "EXIT_START_FAILED", "PortUnavailable", "bind_socket", "serve"]


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


def serve(settings: Settings) -> int:
    """Serve until stopped; the exit code (see the module docstring)."""
    import uvicorn

    from planner.service.app import create_app

    try:
        sock = bind_socket(settings.host, settings.port)
    except PortUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port,
        log_level=settings.log_level,
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


def main() -> None:
    """`python -m planner.service.server`: settings from PLANNER_* (as `planner-cli serve` without
    flags)."""
    from planner.service.settings import load_settings

    sys.exit(serve(load_settings()))


if __name__ == "__main__":
    main()
