"""The service's database: engine, sessions, schema and its in-place migrations, the database's
clock. `StoreBase` is what the store's parts (`store_graphs`, `store_jobs`, `store_leases`)
build on; `planner.api.store.Store` joins them.

SQLite file by default; any SQLAlchemy URL (PostgreSQL tested). Every state change is one short
transaction: `write_session` also takes this process's write lock on SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import ColumnElement, create_engine, event, func, inspect, literal, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from planner.api.models import Base

log = logging.getLogger("planner.api.store")


def new_id() -> str:
    return uuid.uuid4().hex


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 here (psycopg2 is not installed)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets readers run beside the writer; FULL sync keeps finished plans on a crash.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class StoreBase:
    """The engine and its sessions, the schema, the database's clock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has one writer at a time and, when busy, sleeps in growing steps (and a read
        # that turns into a write can fail outright): this process's writers take turns here.
        self._write_lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if self.engine.dialect.name == "sqlite" else contextlib.nullcontext()
        )

    def create_schema(self) -> None:
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        self._add_missing_indexes()
        self._file_identity = self._sqlite_file_identity()

    # -- a deleted or replaced SQLite file --------------------------------------------------------
    def _sqlite_path(self) -> str | None:
        """The SQLite file this store opened (None: not SQLite, or in memory)."""
        url = self.engine.url
        name = url.database or ""
        if url.get_backend_name() != "sqlite" or name in ("", ":memory:") or \
                name.startswith("file:"):
            return None
        return name

    def _sqlite_file_identity(self) -> tuple[int, int] | None:
        path = self._sqlite_path()
        if path is None:
            return None
        st = os.stat(path)
        return st.st_dev, st.st_ino

    def check_file(self) -> None:
        """A storage fault (503, /readyz not ready) when the SQLite file opened at start-up is
        gone from its path or is another file now: pooled connections would go on writing to
        the deleted inode, and every accepted job would vanish at the next start. Once the
        same file is back at its path, this passes again; a new file needs a restart."""
        known: tuple[int, int] | None = getattr(self, "_file_identity", None)
        path = self._sqlite_path()
        if known is None or path is None:
            return
        try:
            st = os.stat(path)
            now: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            now = None
        if now == known:
            return
        what = "was deleted" if now is None else "was replaced by another file"
        # "unable to open database file": classified as the store being unreachable (errors.py)
        raise OperationalError(
            "SQLite file check", None, sqlite3.OperationalError(
                f"unable to open database file: the database file {what} while the service "
                "ran; put it back or restart the service"))

    def _add_missing_columns(self) -> None:
        """Columns added since a store was made (all nullable) are added in place, so an
        existing database keeps its graphs and plans."""
        inspector = inspect(self.engine)
        with self.engine.begin() as conn:
            for table in Base.metadata.sorted_tables:
                present = {c["name"] for c in inspector.get_columns(table.name)}
                for column in table.columns:
                    if column.name not in present and column.nullable:
                        kind = column.type.compile(dialect=self.engine.dialect)
                        conn.execute(text(
                            f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'
                        ))

    def _add_missing_indexes(self) -> None:
        """Indexes added since a store was made (create_all makes them only with new tables).
        One that cannot be made (an old store holding duplicate active jobs) is logged."""
        inspector = inspect(self.engine)
        for table in Base.metadata.sorted_tables:
            present = {i["name"] for i in inspector.get_indexes(table.name)}
            for index in table.indexes:
                if index.name in present:
                    continue
                try:
                    with self.engine.begin() as conn:
                        index.create(conn)
                except DBAPIError as e:
                    log.warning("index %s not created: %s", index.name, e)

    def db_now(self) -> ColumnElement[Any]:
        """The database's clock in epoch seconds, as an SQL expression: leases are written and
        judged by one clock, whichever machines the instances run on."""
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            return func.extract("epoch", func.clock_timestamp())
        if dialect == "sqlite":  # one machine: the file's writers share its clock
            return (func.julianday("now") - 2440587.5) * 86400.0
        return literal(time.time())

    def drop_schema(self) -> None:
        Base.metadata.drop_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        self.check_file()  # an os.stat: a deleted store never answers for the real one
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        with self._write_lock, self.session() as s:
            yield s

    def ping(self) -> None:
        self.check_file()
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

