"""The torch side's speed (issue 49 item 6): how long `planner-cli methods` takes to list, how
long `planner-cli trace` takes on the README's model, and how long `apply` takes to bind a plan
with the plan's recorded capture and without it (capturing again).

Every row is a fresh process (imports included, as a user meets them), run --runs times; the
table gives the median wall time and the median CPU time (user + system of the process and its
threads: on a loaded machine the wall time stretches, the CPU time much less) and the load
average before and after. `--tree DIR` times another checkout's code (its `planner` first on
sys.path), e.g. one made by `git archive <commit> | tar -x -C DIR`, for before/after numbers.

    python benchmarks/torch_side_speed.py                 # 5 runs each
    python benchmarks/torch_side_speed.py --runs 3 --tree /tmp/head
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APPLY_SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
import torch
from planner.runtime import apply
from planner.cli.trace_cmd import resolve_model
model, inputs = resolve_model(sys.argv[1], [])
t0 = time.perf_counter()
planned = apply(model, sys.argv[2], inputs)
t1 = time.perf_counter()
print(json.dumps({"apply_s": t1 - t0, "before_apply_s": t0 - started,
                  "dynamo_imported": "torch._dynamo" in sys.modules}))
"""


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default="planner.zoo:gpt")
    parser.add_argument("--tree", type=Path, default=None,
                        help="time this checkout's code instead of the installed one")
    parser.add_argument("--skip-trace", action="store_true")
    parser.add_argument("--skip-apply", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="torch_side_speed_"))
    env = dict(os.environ, PLANNER_TRACE_CACHE=str(work / "captures"), HF_HUB_OFFLINE="1")
    if args.tree is not None:
        env["PYTHONPATH"] = f"{args.tree.resolve()}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cli = [sys.executable, "-m", "planner.cli.main"]
    graph, plan = work / "graph.json", work / "plan.json"
    rows: list[tuple[str, list[float], list[float], str]] = []

    def timed(name: str, cmd: list[str], run_env: dict[str, str] | None = None,
              key: str | None = None) -> None:
        walls, cpus = [], []
        load_before = load()
        for _ in range(args.runs):
            wall, cpu, out = run(cmd, run_env or env)
            if key is not None:  # the child's own measure of one call
                wall = json.loads(out.strip().splitlines()[-1])[key]
            walls.append(wall)
            cpus.append(cpu)
        rows.append((name, walls, cpus, f"{load_before} -> {load()}"))
        print(f"  {name}: median {statistics.median(walls):.2f} s", file=sys.stderr)

    print(f"timing ({args.runs} runs each) in {work}", file=sys.stderr)
    timed("planner-cli methods", [*cli, "methods"])
    timed("planner-cli methods --json", [*cli, "methods", "--json"])
    if not args.skip_trace or not args.skip_apply:
        timed(f"planner-cli trace {args.model}", [*cli, "trace", args.model, "-o", str(graph)])
    if not args.skip_apply:
        run([*cli, "solve", str(graph), "--budget", "1TiB", "--method", "store-all",
             "-o", str(plan)], env)
        script = work / "apply_once.py"
        script.write_text(APPLY_SCRIPT)
        apply_cmd = [sys.executable, str(script), args.model, str(plan)]
        timed("apply(): the call, recorded capture", apply_cmd, key="apply_s")
        timed("apply(): whole process, recorded capture", apply_cmd)
        off = dict(env, PLANNER_TRACE_CACHE="off")
        timed("apply(): the call, capturing again", apply_cmd, off, key="apply_s")
        timed("apply(): whole process, capturing again", apply_cmd, off)

    print(f"\n{args.runs} runs each; {os.cpu_count()} CPUs; python {sys.version.split()[0]}; "
          f"code: {args.tree or 'installed'}")
    print(f"| {'what':<44} | median wall s | median CPU s | min–max wall s | load 1/5/15 min |")
    print(f"|{'-' * 46}|---------------|--------------|----------------|-----------------|")
    for name, walls, cpus, loads in rows:
        cpu = statistics.median(cpus)
        print(f"| {name:<44} | {statistics.median(walls):13.2f} | {cpu:12.2f} | "
              f"{min(walls):6.2f}–{max(walls):<7.2f} | {loads} |")
    print("\n(apply 'the call' rows: the CPU column is the whole process's)")


if __name__ == "__main__":
    main()
