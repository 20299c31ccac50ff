"""scripts/setup says what it does and takes a local torch wheel without trying the network;
scripts/test always shows pytest's summary line (issue 13, item 13)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pip._vendor.packaging.tags import sys_tags

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from local_wheel import find_local_wheel, pip_sources  # noqa: E402

TAG = next(iter(sys_tags()))  # a tag this interpreter installs
GOOD = f"torch-2.13.0+cpu-{TAG.interpreter}-{TAG.abi}-{TAG.platform}.whl"
FOREIGN = "torch-2.13.0-cp27-cp27m-win32.whl"


def test_pip_sources_read_pip_config_list() -> None:
    text = (
        "global.cert='/etc/ssl/certs/ca.crt'\n"
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
        "global.find-links='/opt/wheels'\n"
        ":env:.find-links='/srv/w'\n"
    )
    assert pip_sources(text) == [
        ("extra-index-url", "file:///opt/a/simple"),
        ("extra-index-url", "file:///opt/b/simple"),
        ("find-links", "/opt/wheels"),
        ("find-links", "/srv/w"),
    ]


def test_a_local_wheel_is_found_in_find_links_and_file_indexes(tmp_path: Path) -> None:
    links = tmp_path / "wheels"
    links.mkdir()
    (links / FOREIGN).write_bytes(b"")
    (links / "torch-2.12.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    config = f"global.find-links='{links}'\n"
    assert find_local_wheel("torch", "2.13.0", config) is None  # wrong platform, wrong version
    (links / GOOD).write_bytes(b"")
    assert find_local_wheel("torch", "2.13.0", config) == links / GOOD

    index = tmp_path / "simple"
    (index / "torch").mkdir(parents=True)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / GOOD).write_bytes(b"")
    (index / "torch" / "index.html").write_text(f'<a href="../../files/{GOOD}#sha256=0">x</a>')
    config = f"global.extra-index-url='https://pypi.org/simple file://{index}'\n"
    assert find_local_wheel("torch", "2.13.0", config) == (tmp_path / "files" / GOOD).resolve()
    assert find_local_wheel("torch", "2.13.0", "global.index-url='https://x/simple'\n") is None


def _fake_checkout(tmp_path: Path, config_text: str) -> tuple[Path, Path]:
    """A copy of the set-up files whose .venv/bin/python records pip calls instead of running
    them (torch absent), and whose pip config is `config_text`."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("scripts/setup", "scripts/local_wheel.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    (tmp_path / "pip-config.txt").write_text(config_text)
    log = tmp_path / "calls.log"
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "python $*" >> "{log}"\n'
        'case "$1" in\n'
        "  -c) exit 1 ;;\n"  # `import torch` fails: torch is not installed
        f'  scripts/local_wheel.py) exec "{sys.executable}" "$@" --config - '
        f'< "{tmp_path / "pip-config.txt"}" ;;\n'
        "  *) exit 0 ;;\n"  # pip: recorded, not run
        "esac\n"
    )
    python.chmod(0o755)
    return root, log


def test_setup_prints_its_steps_and_installs_the_local_wheel(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / GOOD).write_bytes(b"")
    root, log = _fake_checkout(tmp_path, f"global.find-links='{wheels}'\n")
    run = subprocess.run([str(root / "scripts" / "setup")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "setup: upgrading pip, setuptools and wheel"
    assert f"setup: installing torch 2.13.0 from the local wheel {wheels / GOOD}" in lines
    assert any(line.startswith("setup: installing the project") for line in lines)
    assert lines[-1].startswith("setup: done in ")
    calls = log.read_text()
    assert f"install {wheels / GOOD}" in calls
    assert "download.pytorch.org" not in calls and "torch==" not in calls
    assert all(" -q " in c for c in calls.splitlines() if " pip " in c)  # pip stays quiet
    again = subprocess.run([str(root / "scripts" / "setup")], capture_output=True, text=True,
                           timeout=60)
    assert again.stdout.strip() == (
        "setup: .venv is up to date (pyproject.toml unchanged); nothing to install"
    )


def test_setup_without_a_local_wheel_says_where_torch_comes_from(tmp_path: Path) -> None:
    root, log = _fake_checkout(tmp_path, "global.index-url='https://pypi.org/simple'\n")
    run = subprocess.run([str(root / "scripts" / "setup")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    torch_line = next(line for line in run.stdout.splitlines() if "installing torch" in line)
    assert "local wheel" not in torch_line and ("PyPI" in torch_line
                                                or "download.pytorch.org" in torch_line)
    assert "torch==2.13.0" in log.read_text()


@pytest.mark.parametrize("extra", [[], ["-q"], ["-qq"], ["--quiet"], ["-qx"]])
@pytest.mark.slow
def test_the_test_command_always_prints_the_summary_line(tmp_path: Path, extra: list[str]
                                                         ) -> None:
    tiny = tmp_path / "test_tiny.py"
    tiny.write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    env = {**os.environ, "PLANNER_SKIP_SETUP": "1"}
    run = subprocess.run([str(ROOT / "scripts" / "test"), str(tiny), *extra],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout, run.stdout


FAKE_POSTGRES = """#!/usr/bin/env bash
# Records its calls; --status answers as RUNNING_BEFORE says.
echo "${1:-start}" >> "$CALLS"
case "${1:-}" in
  --status) [ "$RUNNING_BEFORE" = 1 ] ;;
  --stop) ;;
  *) echo "postgresql+psycopg://planner@127.0.0.1:1/planner" ;;
esac
"""


@pytest.mark.parametrize(("running_before", "passing", "stopped"), [
    ("0", False, True), ("1", True, False)])
def test_the_test_command_stops_only_the_postgres_it_started(
    tmp_path: Path, running_before: str, passing: bool, stopped: bool
) -> None:
    """scripts/test with set-up, in a copy whose set-up and PostgreSQL script are stand-ins."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / "scripts" / "setup").write_text("#!/usr/bin/env bash\n")
    (tmp_path / "scripts" / "ensure_postgres.sh").write_text(FAKE_POSTGRES)
    for script in ("test", "setup", "ensure_postgres.sh"):
        (tmp_path / "scripts" / script).chmod(0o755)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    tiny = tmp_path / "test_tiny.py"
    tiny.write_text(f"def test_one():\n    assert {passing}\n")
    calls = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PLANNER_SKIP_SETUP", "PLANNER_TEST_POSTGRES_URL", "PLANNER_CHROMIUM")}
    env.update(CALLS=str(calls), RUNNING_BEFORE=running_before, PLANNER_CHROMIUM="none")
    run = subprocess.run([str(tmp_path / "scripts" / "test"), str(tiny)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == (0 if passing else 1), run.stdout + run.stderr
    expected = ["--status", "start"] + (["--stop"] if stopped else [])
    assert calls.read_text().split() == expected


@pytest.mark.slow
def test_the_whole_suite_runs_on_two_workers_and_a_named_file_in_one(tmp_path: Path) -> None:
    """scripts/test adds `-n 2` (pytest-xdist) on a 2-core machine unless the run names test
    files, gives its own -n, or PLANNER_TEST_WORKERS=1."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test", tmp_path / "scripts" / "test")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tiny.py").write_text(
        "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    env = {**os.environ, "PLANNER_SKIP_SETUP": "1"}
    env.pop("PLANNER_TEST_WORKERS", None)

    def run(*args: str, **more: str) -> str:
        done = subprocess.run([str(tmp_path / "scripts" / "test"), *args], capture_output=True,
                              text=True, env={**env, **more}, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 passed" in done.stdout, done.stdout
        return done.stdout

    two = len(os.sched_getaffinity(0)) >= 2  # what nproc counts
    assert ("2 workers" in run("-k", "one or two")) == two
    assert "workers" not in run("tests/test_tiny.py")
    assert "workers" not in run("-k", "one or two", PLANNER_TEST_WORKERS="1")
    assert "workers" not in run("-n", "0")
