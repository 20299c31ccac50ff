"""Issue 50, item 2: failing closed when the store goes away.

(a) The SQLite file deleted while the service runs was not noticed (202s and a ready /readyz
for 42 s: pooled connections wrote to the unlinked inode, and every accepted job was gone at
the next start). Now every session checks the file is still the one opened: 503 and not ready
until it is back.
(b) Authentication was on only while the database held a key, so a lost database brought the
service back open, and the banner said `auth off` whenever keys lived only in the database.
Now a marker remembers that keys were configured: a keyless store that had keys refuses to
start (exit 5, one line) unless PLANNER_AUTH=open, and the banner says what was decided."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from api_server import ServerProcess, free_port
from test_api_tenants import PLAN, add_key, bearer, make_client

from planner.api.auth_state import marker_path

START_GUARD_S = 90  # a hang guard, not a timing


def test_a_deleted_sqlite_file_is_noticed_at_once(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with make_client(f"sqlite:///{db}") as client:
        assert client.get("/readyz").status_code == 200
        moved = tmp_path / "away.db"
        os.rename(db, moved)  # gone from its path
        ready = client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json()["error"]["code"] == "storage_unreachable"
        assert "deleted" in ready.json()["error"]["message"]
        refused = client.post("/v1/plans", json=PLAN)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        os.rename(moved, db)  # the same file back: ready again, the job taken
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/plans", json=PLAN).status_code in (200, 202)
        db.unlink()
        db.write_bytes(b"")  # another file at the path: not the database the jobs are in
        replaced = client.post("/v1/plans", json=PLAN)
        assert replaced.status_code == 503 and "replaced" in replaced.text
        assert client.get("/readyz").status_code == 503


def start_and_wait_exit(server: ServerProcess) -> int:
    """The exit code of a start that should refuse; a server that serves instead is stopped
    (and the test fails)."""
    proc = server.spawn(free_port())
    try:
        return proc.wait(timeout=START_GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"the server started:\n{server.log()}") from None


def test_a_lost_database_never_brings_the_service_back_open(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    key = add_key(url, "team-a")["key"]  # the key lives only in the database
    assert marker_path(url).exists()
    server = ServerProcess(tmp_path, url).start(START_GUARD_S)
    try:
        assert "auth on" in server.log(), server.log()  # the banner, keys in the database count
        import httpx

        assert httpx.post(server.url + "/v1/plans", json=PLAN).status_code == 401
        assert httpx.get(server.url + "/v1/methods", headers=bearer(key)).status_code == 200
    finally:
        server.stop()
    for name in ("s.db", "s.db-wal", "s.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    server.log_path.write_text("")
    assert start_and_wait_exit(server) == 5
    log = server.log()
    assert "held API keys" in log and "PLANNER_AUTH=open" in log, log
    assert "planner service on" not in log and "Traceback" not in log
    # Open only when the operator says so in so many words; the banner says it.
    server.log_path.write_text("")
    opened = ServerProcess(tmp_path, url, auth="open").start(START_GUARD_S)
    try:
        assert "auth off" in opened.log()
    finally:
        opened.stop()


def test_auth_required_never_starts_without_a_key(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, f"sqlite:///{tmp_path / 'new.db'}", auth="required")
    assert start_and_wait_exit(server) == 5
    assert "PLANNER_AUTH=required" in server.log()


def test_a_key_added_while_running_is_remembered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with make_client(url) as client:
        assert client.get("/v1/methods").status_code == 200  # open: no key yet
        from planner.api.store import Store

        store = Store(url)
        try:
            store.add_key("team-a")  # as another machine's CLI would, without a marker
        finally:
            store.dispose()
        assert client.get("/v1/methods").status_code == 401
    assert marker_path(url).exists()
