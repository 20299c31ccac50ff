"""Failing closed: whether this service must authenticate, remembered outside its database.

Keys may live only in the database (`planner-cli keys add`), so a database that is lost or
replaced by an empty one would otherwise bring the service back open to anyone. Whenever
authentication is on (keys in the settings or the database, at start-up, when a key is added,
or when the running service first sees one), a marker file says so: beside an SQLite file
(`<file>.auth-required`, which survives the file's deletion), else in the state directory
(`PLANNER_STATE_DIR`, default $XDG_STATE_HOME/planner), one per database URL. At start-up a
store with no key whose marker exists refuses to start (exit 5, one line) unless the operator
says `PLANNER_AUTH=open`; `PLANNER_AUTH=required` refuses to start without a key at all. The
banner says what was decided.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from planner.api.settings import Settings

log = logging.getLogger("planner.api")
MARKER_SUFFIX = ".auth-required"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "planner"


def marker_path(database_url: str, state_dir: str | None = None) -> Path:
    """Where the marker of `database_url` lies (see the module docstring)."""
    from planner.api.store_db import normalise_url

    url = make_url(normalise_url(database_url))
    name = url.database or ""
    if url.get_backend_name() == "sqlite" and name not in ("", ":memory:") and \
            not name.startswith("file:"):
        return Path(os.path.abspath(name + MARKER_SUFFIX))
    where = url.render_as_string(hide_password=True)  # one marker per database, no secret
    digest = hashlib.sha256(where.encode()).hexdigest()[:16]
    return (Path(state_dir) if state_dir else default_state_dir()) / f"auth-required-{digest}"


def remember_auth(database_url: str, state_dir: str | None = None) -> None:
    """Write the marker (idempotent); a marker that cannot be written is a warning: the
    service still authenticates, it just cannot promise to after losing its database."""
    path = marker_path(database_url, state_dir)
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"API keys were configured for this database ({time.ctime()}): a "
                        "service on it without keys refuses to start unless PLANNER_AUTH=open\n")
    except OSError as e:
        log.warning("cannot remember that authentication is on (%s: %s): a lost database "
                    "would not be noticed at the next start", path, e.strerror or e)


def auth_at_start(settings: Settings, database_has_keys: bool) -> tuple[bool, str | None]:
    """(authentication on, the line to refuse to start with, or None)."""
    if settings.auth_enabled or database_has_keys:
        remember_auth(settings.database_url, settings.state_dir)
        return True, None
    if settings.auth == "required":
        return False, ("PLANNER_AUTH=required, but no API key is configured: add one "
                       "(planner-cli keys add --tenant NAME) or set PLANNER_API_KEYS")
    marker = marker_path(settings.database_url, settings.state_dir)
    if marker.exists() and settings.auth != "open":
        return False, (f"this database held API keys (remembered in {marker}) but holds none "
                       "now: it was lost or replaced; restore it, add a key (planner-cli keys "
                       "add), or set PLANNER_AUTH=open to serve it without authentication")
    return False, None
