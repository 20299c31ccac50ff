"""README.md's command block runs as written, in order, in a clean directory shaped like a
clone's root: every command exits 0 and writes what the next reads. The service line gets a
free port (the block's own 8000 may be taken) and `submit` finds it through PLANNER_SERVER."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def command_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Command line"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README.md: no bash block under '## Command line'"
    return [line for line in block.group(1).splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_block_names_what_it_runs() -> None:
    lines = command_block()
    assert lines[0] == "source .venv/bin/activate"
    assert all(line.startswith("planner-cli ") for line in lines[1:]), lines
    # nothing refers to a file the block does not make or the clone does not hold
    made = {"graph.json", "plan.json", "gpt_adam.json", "gpt8.json", "gpt2.json", "resnet24.json",
            "gpt_b4.json"}
    for line in lines[1:]:
        for name in re.findall(r"[\w./-]+\.json", line.split("#")[0]):
            assert name in made or (ROOT / name).is_file(), f"{line!r}: {name} does not exist"


@pytest.mark.slow
def test_every_command_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "planner" / "examples", tmp_path / "planner" / "examples")
    port = free_port()
    lines = [line.replace("--port 8000", f"--port {port}") for line in command_block()[1:]]
    script = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(
        f"echo '>>> {line.split('#')[0].strip()}'\n{line}" for line in lines)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PLANNER_SERVER": f"http://127.0.0.1:{port}", "MPLBACKEND": "Agg",
           "PLANNER_DATABASE_URL": f"sqlite:///{tmp_path / 'service.db'}"}
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    ran = [ln[4:] for ln in run.stdout.splitlines() if ln.startswith(">>> ")]
    assert run.returncode == 0, f"stopped at {ran[-1] if ran else '?'}:\n{run.stderr[-2000:]}"
    assert len(ran) == len(lines)
    for made in ("graph.json", "plan.json", "timeline.png", "pareto.png", "grid.png",
                 "gpt_adam.json", "gpt8.json", "gpt2.json", "resnet24.json", "gpt_b4.json"):
        assert (tmp_path / made).is_file(), made
