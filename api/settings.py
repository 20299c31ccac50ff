"""Service settings: environment variables `PLANNER_*`, an optional settings file, defaults.

Precedence (highest first): keyword arguments, environment variables, the file named by
`PLANNER_SETTINGS_FILE` (dotenv syntax: `PLANNER_WORKERS=4`), the defaults below.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///planner-service.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PLANNER_",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL; the embedded default is an SQLite file in the working "
        "directory. PostgreSQL: postgresql+psycopg://user:password@host:5432/db",
    )
    workers: int = Field(default=2, ge=1, le=64, description="Solves running at once.")
    # Handler threads: few, so CPU-bound requests cannot starve the event loop of the GIL.
    request_threads: int = Field(default=4, ge=1, le=256)
    solver_threads: int = Field(default=1, ge=1, le=64, description="Threads per solve.")
    solver_nice: int = Field(
        default=10, ge=0, le=19, description="Solver processes' niceness: the API stays first."
    )
    default_time_limit_s: float | None = Field(
        default=None, gt=0, description="A job's time limit when its request gives none; unset: "
        "the default of the method's plan kind (planner.core.limits: 60 s, pipelines 10 s).")
    max_time_limit_s: float = Field(default=600.0, gt=0, description="Cap on a job's time limit.")
    # A job that outlives its time limit by this margin is killed and marked failed.
    kill_grace_s: float = Field(default=15.0, ge=0)
    max_body_bytes: int = Field(default=16 * 2**20, ge=1024)
    # Read timeouts (planner.api.http_timeouts): past one, 408 and the connection is closed.
    head_timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="A request's line and headers complete within this of the connection's "
        "start (or of the previous response, kept alive).")
    body_idle_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="At most this long without a byte of a body.")
    body_timeout_s: float = Field(
        default=120.0, gt=0, le=86400, description="A whole body within this of its head.")
    max_nodes: int = Field(default=20_000, ge=1)
    max_edges: int = Field(default=200_000, ge=0)
    max_plan_bytes: int = Field(
        default=64 * 2**20, ge=1024,
        description="A plan's JSON at most this large, for every method: a larger one fails its "
        "job with the reason (its solver process checks it before sending it).",
    )
    rendered_disk_bytes: int = Field(
        default=2 * 2**30, ge=0,
        description="Disk for rendered finished plans too large for response_cache_bytes: "
        "rendered once, streamed from a file on every read.",
    )
    response_cache_bytes: int = Field(
        default=64 * 2**20, ge=0, description="Memory for rendered finished plans."
    )
    max_sweep_budgets: int = Field(default=32, ge=1)
    # Large bodies are parsed, validated, hashed and resolved in a pool of processes
    # (planner.api.uploads): the API process only moves their bytes.
    upload_pool_min_bytes: int = Field(
        default=256 * 2**10, ge=0,
        description="Bodies of POST /v1/graphs, /v1/plans, /v1/sweeps, /v1/partitions at least "
        "this large are parsed in the upload pool, never on the event loop.",
    )
    upload_workers: int = Field(default=2, ge=1, le=64, description="Upload pool processes.")
    upload_queue: int = Field(
        default=16, ge=0, le=1024,
        description="Large uploads waiting for the pool at once (beyond: 503, Retry-After).",
    )
    upload_queue_per_tenant: int = Field(
        default=8, ge=1, le=1024,
        description="A tenant's large uploads in the pool or waiting (beyond: 429).",
    )
    submissions_per_minute: int = Field(
        default=120, ge=1, description="Per tenant (per client address when auth is off)."
    )
    max_active_jobs_per_tenant: int = Field(
        default=100, ge=1, description="A tenant's queued and running jobs at once."
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Bearer tokens, 'KEY' (the default tenant's) or 'TENANT:KEY'; with none "
        "here and none in the database (planner-cli keys) authentication is off. Env: JSON list.",
    )
    admin_api_key: SecretStr | None = Field(
        default=None, description="A bearer token that sees every tenant's objects."
    )
    auth: Literal["auto", "required", "open"] = Field(
        default="auto",
        description="auto: authentication is on with any key (here or in the database), and a "
        "database that held keys once (remembered outside it: planner.api.auth_state) and "
        "holds none now refuses to start; required: never start without a key; open: serve "
        "without authentication where no key is configured, even then (keys present are "
        "always enforced).",
    )
    state_dir: str | None = Field(
        default=None,
        description="Where the service remembers that a non-SQLite database needs keys "
        "(default $XDG_STATE_HOME/planner or ~/.local/state/planner); an SQLite file's marker "
        "lies beside it.",
    )
    api_key_cache_s: float = Field(
        default=5.0, ge=0, le=300,
        description="How long a key read from the database is trusted: a revoked key stops "
        "working within this.",
    )
    # What to do with the running jobs of an instance that died (its lease expired).
    recover_running: Literal["requeue", "fail"] = "requeue"
    max_attempts: int = Field(default=2, ge=1, description="Runs of a job across restarts.")
    instance_lease_s: float = Field(
        default=15.0, ge=0.5, le=3600,
        description="An instance renews its lease every third of this; once it has not for "
        "this long, any instance sharing the database takes its running jobs over.",
    )
    max_wait_s: float = Field(
        default=60.0, ge=0, le=60,
        description="Cap on POST /v1/plans?wait= (seconds a request may be held).",
    )
    extra_methods: dict[str, str] = Field(
        default_factory=dict,
        description="Operator-registered methods, name -> 'module:function' (never from requests).",
    )
    log_level: str = "info"

    @property
    def auth_enabled(self) -> bool:
        """Keys in the settings (the database may hold more: Authenticator.enabled)."""
        return bool(self.api_keys) or self.admin_api_key is not None


def load_settings(**overrides: object) -> Settings:
    env_file = os.environ.get("PLANNER_SETTINGS_FILE") or None
    if env_file is not None and not os.path.isfile(env_file):
        from planner.core.errors import InputError

        raise InputError(f"PLANNER_SETTINGS_FILE={env_file}: no such file")
    return Settings(_env_file=env_file, **overrides)  # type: ignore[arg-type, call-arg]
