"""The store's tenants: API keys (stored as sha256 digests) and which tenants hold which graph.

A key is 32 random bytes (`secrets.token_urlsafe`): with that much entropy a plain sha256 is as
safe as a slow or keyed hash (nobody can guess or brute-force a preimage), and it lets a request
find its key with one indexed lookup. Graphs are stored once by content hash, so their owners are
a table of their own: a tenant sees a graph only after uploading (or submitting) it itself.
Rows from before tenants (NULL tenant) are adopted by the default tenant at start-up.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Boolean, Float, String, exists, insert, literal, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from planner.api.models import DEFAULT_TENANT, Base, GraphRow, JobRow, SweepRow
from planner.api.store_db import StoreBase
from planner.core.errors import InputError

TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
KEY_PREFIX = "plk_"
SHOWN_PREFIX_CHARS = 10  # of a key, kept for `keys list` (the random part starts at char 4)


class ApiKeyRow(Base):
    __tablename__ = "planner_api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class GraphOwnerRow(Base):
    __tablename__ = "planner_graph_owners"

    graph_hash: Mapped[str] = mapped_column(String(80), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True)
class ApiKey:
    """A stored key, without its secret."""

    id: str
    tenant: str
    prefix: str
    admin: bool
    created_at: float
    revoked_at: float | None

    @classmethod
    def from_row(cls, row: ApiKeyRow) -> ApiKey:
        return cls(row.id, row.tenant, row.prefix, bool(row.admin), row.created_at,
                   row.revoked_at)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_tenant_name(name: str, where: str = "tenant") -> str:
    if not TENANT_NAME.match(name):
        raise InputError(
            f"{name!r}: a tenant name is 1-64 letters, digits, '_', '.' or '-' (not first)",
            field=where,
        )
    return name


class TenantStore(StoreBase):
    """API keys by digest, graph owners, and the adoption of rows from before tenants."""

    def adopt_untenanted_rows(self) -> None:
        """Jobs and sweeps without a tenant, and graphs nobody holds, become the default
        tenant's (idempotent: a store from before tenants, opened by this version)."""
        with self.write_session() as s:
            for table in (JobRow, SweepRow):
                s.execute(update(table).where(table.tenant.is_(None))
                          .values(tenant=DEFAULT_TENANT))
            held = exists().where(GraphOwnerRow.graph_hash == GraphRow.hash)
            s.execute(insert(GraphOwnerRow).from_select(
                ["graph_hash", "tenant", "created_at"],
                select(GraphRow.hash, literal(DEFAULT_TENANT), GraphRow.created_at).where(~held),
            ))

    # -- keys ---------------------------------------------------------------------------------
    def add_key(self, tenant: str, *, admin: bool = False) -> tuple[ApiKey, str]:
        """(the stored key, its secret): the secret is shown once and never stored."""
        check_tenant_name(tenant)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        row = ApiKeyRow(id=secrets.token_hex(6), key_sha256=key_digest(secret),
                        prefix=secret[:SHOWN_PREFIX_CHARS], tenant=tenant, admin=admin,
                        created_at=time.time(), revoked_at=None)
        with self.write_session() as s:
            s.add(row)
        return ApiKey.from_row(row), secret

    def list_keys(self) -> list[ApiKey]:
        with self.session() as s:
            rows = s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at)).all()
            return [ApiKey.from_row(r) for r in rows]

    def revoke_key(self, key_id: str) -> ApiKey | None:
        """Revoke a key by its id; None for an unknown id (revoking twice keeps the first time)."""
        with self.write_session() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = time.time()
            return ApiKey.from_row(row)

    def find_key_by_digest(self, digest: str) -> ApiKey | None:
        """The key whose sha256 is `digest` (see key_digest), revoked or not."""
        with self.session() as s:
            row = s.scalars(select(ApiKeyRow).where(ApiKeyRow.key_sha256 == digest)).first()
            return None if row is None else ApiKey.from_row(row)

    def has_keys(self) -> bool:
        """Whether this database has ever held a key (revoked ones too: revoking every key must
        not open the service to anyone)."""
        with self.session() as s:
            return s.scalar(select(ApiKeyRow.id).limit(1)) is not None

    # -- graph owners -------------------------------------------------------------------------
    def hold_graph(self, graph_hash: str, tenant: str) -> bool:
        """The tenant holds the graph from now on; False when it did already."""
        try:
            with self.write_session() as s:
                if s.get(GraphOwnerRow, (graph_hash, tenant)) is not None:
                    return False
                s.add(GraphOwnerRow(graph_hash=graph_hash, tenant=tenant,
                                    created_at=time.time()))
            return True
        except IntegrityError:  # a concurrent upload by the same tenant won
            return False
