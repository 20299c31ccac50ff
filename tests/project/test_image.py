"""The service image: Dockerfile and docker/compose.yml agree, and the image builds (buildah on a
debootstrap base, scripts/build_image.sh) and serves a plan from inside. The build skips with the
script's reason where it cannot run here (not root, no apt-get, no Debian mirror, no buildah)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from planner.api.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
COMPOSE = REPO_ROOT / "docker" / "compose.yml"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_image.sh"
# The script's exit code for "cannot build on this machine" (as opposed to a failed build).
CANNOT_BUILD_HERE = 2
BUILD_TIMEOUT_S = 1200.0


def dockerfile_args() -> dict[str, str]:
    """ARG name -> default ('' when none)."""
    found = re.findall(r"^ARG\s+(\w+)(?:=(\S*))?", DOCKERFILE.read_text(), flags=re.MULTILINE)
    return {name: default for name, default in found}


def test_dockerfile_base_is_an_arg_for_both_stages() -> None:
    text = DOCKERFILE.read_text()
    assert dockerfile_args().get("BASE") == "python:3.12-slim"
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert froms == ["${BASE}", "${BASE}"], froms
    # The debootstrap base has python3 but no `python` until the venv's is on PATH.
    assert not re.search(r"RUN python -m", text)


def test_compose_matches_the_dockerfile() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load(COMPOSE.read_text())
    service = compose["services"]["planner"]
    build = service["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert set(build.get("args", {})) <= set(dockerfile_args()), build.get("args")
    assert build["args"]["BASE"].endswith(":-python:3.12-slim}")
    # Every variable it sets is a setting the service reads (PLANNER_ + a Settings field).
    fields = {f"PLANNER_{name.upper()}" for name in Settings.model_fields}
    assert set(service["environment"]) <= fields, set(service["environment"]) - fields
    exposed = re.findall(r"^EXPOSE\s+(\d+)", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert [port.rsplit(":", 1)[1] for port in service["ports"]] == exposed
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])
    assert service["depends_on"]["db"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) == {"pgdata"}


def run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def image_id() -> str:
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("the image build needs root (debootstrap, buildah's chroot isolation)")
    started = time.monotonic()
    done = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        cwd=REPO_ROOT, check=False,
    )
    lines = done.stderr.strip().splitlines() or ["no output"]
    if done.returncode == CANNOT_BUILD_HERE:
        pytest.skip(lines[-1])
    assert done.returncode == 0, f"scripts/build_image.sh exit {done.returncode}: {lines[-1]}"
    print(f"image built in {time.monotonic() - started:.0f} s")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def container(image_id: str) -> Iterator[str]:
    name = f"planner-image-test-{uuid.uuid4().hex[:8]}"
    made = run("buildah", "from", "--quiet", "--pull=never", "--name", name, image_id)
    assert made.returncode == 0, made.stderr
    try:
        yield name
    finally:
        run("buildah", "rm", name)


def wait_ready(base_url: str, server: subprocess.Popen[str], timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert server.poll() is None, f"the service exited {server.returncode}"
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{base_url}/readyz not ready within {timeout_s} s")


@pytest.mark.slow
def test_image_runs_as_non_root_without_torch(container: str) -> None:
    in_image = ("buildah", "run", "--isolation", "chroot", container, "--")
    assert run(*in_image, "id", "-u").stdout.strip() == "10001"
    no_torch = run(*in_image, "python", "-c", "import importlib.util as u; "
                   "print(u.find_spec('torch') is None)")
    assert no_torch.stdout.strip() == "True", no_torch.stderr


@pytest.mark.slow
def test_image_serves_a_plan(container: str) -> None:
    port = free_port()
    # Chroot isolation shares the host's network: the service listens on the host's loopback.
    server = subprocess.Popen(
        ["buildah", "run", "--isolation", "chroot", "-e", f"PLANNER_PORT={port}",
         "-e", "PLANNER_HOST=127.0.0.1", container, "--", "planner-cli", "serve"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base_url, server)
        graph = json.loads((REPO_ROOT / "planner" / "examples" / "resnet24.json").read_text())
        answer = httpx.post(
            f"{base_url}/v1/plans", params={"wait": 60}, timeout=90,
            json={"graph": graph, "budget": 0.7, "method": "auto", "time_limit": 5},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "done", body
        assert body["report"]["peak_bytes"] <= body["report"]["budget_bytes"], body["report"]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            out, _ = server.communicate()
    assert "planner service on" in out, out[-2000:]
