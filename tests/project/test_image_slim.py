"""The image is as small as its contents allow (issue 50 item 12: 702 MB): docker/slim_venv.sh
drops what the service never loads from the environment the Dockerfile copies, and the build
context has no link that would dangle in the image. (tests/project/test_image.py builds the image
where it can.)"""

from __future__ import annotations

import fnmatch
import os
import platform
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/")
               for p in patterns)


def test_no_link_in_the_build_context_dangles() -> None:
    """A link under planner/ whose target .dockerignore leaves out is left out too."""
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for link in (REPO / "planner").iterdir():
        if not link.is_symlink():
            continue
        target = os.path.normpath(os.path.join("planner", os.readlink(link)))
        if _ignored(target, patterns):
            assert _ignored(f"planner/{link.name}", patterns), \
                f"planner/{link.name} -> {target}: the link is copied, its target is not"


@pytest.mark.skipif(sys.platform != "linux", reason="the image's build stage runs on Linux")
def test_slim_venv_drops_what_the_service_never_loads(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    (site / "fakepkg" / "tests").mkdir(parents=True)
    (site / "fakepkg" / "__init__.py").write_text("")
    (site / "fakepkg" / "used.py").write_text("X = 1\n")
    (site / "fakepkg" / "unused.py").write_text("Y = 2\n")
    (site / "fakepkg" / "tests" / "test_x.py").write_text("")
    (site / "fakepkg" / "testing.py").write_text("")  # a runtime module: stays
    cbc = site / "pulp" / "solverdir" / "cbc"
    for where in ("linux/i64", "linux/arm64", "linux/i32", "osx/64", "win/64"):
        (cbc / where).mkdir(parents=True)
        (cbc / where / "cbc").write_text("")
    subprocess.run([python, "-m", "compileall", "-q", str(site / "fakepkg")], check=True)
    imports = tmp_path / "imports.py"
    imports.write_text("import fakepkg.used\n")
    subprocess.run(["sh", str(REPO / "docker" / "slim_venv.sh"), str(env_dir), str(imports)],
                   check=True)

    assert subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0
    assert not (site / "fakepkg" / "tests").exists()
    assert (site / "fakepkg" / "testing.py").exists()
    compiled = sorted(p.name.split(".")[0] for p in (site / "fakepkg").rglob("*.pyc"))
    assert compiled == ["__init__", "used"]  # byte code only for what is imported
    machine = platform.machine()
    if machine in ("x86_64", "aarch64", "arm64"):
        kept = "linux/i64" if machine == "x86_64" else "linux/arm64"
        left = sorted(str(p.relative_to(cbc)) for p in cbc.glob("*/*"))
        assert left == [kept]


def test_the_dockerfile_slims_its_environment() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "docker/slim_venv.sh /opt/venv docker/import_service.py" in text
