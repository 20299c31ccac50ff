"""Service settings: defaults, a settings file, PLANNER_* variables, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.api.settings import DEFAULT_DATABASE_URL, load_settings
from planner.api.store import normalise_url
from planner.core.errors import InputError


def test_defaults_are_the_embedded_store(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PLANNER_SETTINGS_FILE", "PLANNER_DATABASE_URL", "PLANNER_API_KEYS",
                 "PLANNER_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.database_url == DEFAULT_DATABASE_URL and s.database_url.startswith("sqlite")
    assert not s.auth_enabled and s.workers >= 1


def test_file_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file = tmp_path / "planner.env"
    settings_file.write_text(
        "PLANNER_WORKERS=5\nPLANNER_PORT=9001\nPLANNER_API_KEYS='[\"abc\"]'\n"
        "PLANNER_MAX_NODES=77\n"
    )
    monkeypatch.setenv("PLANNER_SETTINGS_FILE", str(settings_file))
    monkeypatch.setenv("PLANNER_WORKERS", "3")  # the environment wins over the file
    s = load_settings()
    assert (s.workers, s.port, s.max_nodes) == (3, 9001, 77)
    assert s.auth_enabled and s.api_keys[0].get_secret_value() == "abc"
    assert "abc" not in repr(s)  # keys never show in logs
    assert load_settings(workers=9).workers == 9  # explicit arguments (CLI flags) win


def test_missing_settings_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_SETTINGS_FILE", "/nonexistent/planner.env")
    with pytest.raises(InputError, match="no such file"):
        load_settings()


def test_serve_rejects_bad_settings_in_one_line(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_WORKERS", "0")
    r = cli("serve", "--port", "1")
    assert r.returncode == 2
    assert r.stderr.startswith("error: settings: workers") and "Traceback" not in r.stderr


def test_postgres_urls_use_psycopg3() -> None:
    assert normalise_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("sqlite:///x.db") == "sqlite:///x.db"


def test_service_imports_without_torch() -> None:
    code = (
        "import sys, planner.api.app, planner.api.worker, planner.cli.service_cmds\n"
        "import planner.engine.solve\n"
        "from planner.engine.reports import plan_summary\n"
        "assert 'torch' not in sys.modules, 'the service imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_default_time_limit_follows_the_method_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """One default per plan kind (planner.core.limits), as in the CLI: a pipeline method's
    request without a time limit gets 10 s, not the remat default; the setting overrides both
    and the server's cap bounds them."""
    from planner.api.service import default_limit_s
    from planner.core.limits import DEFAULT_PIPELINE_TIME_LIMIT_S, DEFAULT_TIME_LIMIT_S

    monkeypatch.delenv("PLANNER_DEFAULT_TIME_LIMIT_S", raising=False)
    s = load_settings()
    assert default_limit_s(s, "auto") == DEFAULT_TIME_LIMIT_S
    assert default_limit_s(s, "pipeline-dp") == DEFAULT_PIPELINE_TIME_LIMIT_S
    monkeypatch.setenv("PLANNER_DEFAULT_TIME_LIMIT_S", "7")
    monkeypatch.setenv("PLANNER_MAX_TIME_LIMIT_S", "5")
    assert default_limit_s(load_settings(), "auto") == 5.0
