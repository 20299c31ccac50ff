"""The torch side's speed (issue 49 item 6): how long `planner-cli methods` takes to list, how
long `planner-cli trace` takes on the README's model, and how long `apply` takes to bind a plan
with the plan's recorded capture and without it (capturing again).

Every row is a fresh process (imports included, as a user meets them), run --runs times; the
table gives the median wall time and the median CPU time (user + system of the process and its
threads: on a loaded machine the wall time stretches, the CPU time much less) and the load
average before and after. `--compare DIR` also times another checkout's code (its `planner`
first on sys.path), e.g. one made by `git archive <commit> | tar -x -C DIR`, each of its runs
right after the same run of the installed code, for before/after rows under the same load.

    python benchmarks/torch_side_speed.py                 # 5 runs each
    git archive 7f2d406 | tar -x -C /tmp/before && \
        python benchmarks/torch_side_speed.py --runs 5 --compare /tmp/before
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
    """(wall s, CPU s of the child, its stdout); run in the scratch folder, so that `python -m`
    finds `planner` where PYTHONPATH (--tree) or the installation says, not in the cwd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=env.get("PLANNER_BENCH_DIR"))
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
    parser.add_argument("--compare", type=Path, default=None,
                        help="also time this checkout's code (its planner first on sys.path), "
                        "each run right after the installed code's, for before/after rows")
    parser.add_argument("--skip-apply", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="torch_side_speed_"))
    env = dict(os.environ, PLANNER_TRACE_CACHE=str(work / "captures"), HF_HUB_OFFLINE="1",
               PLANNER_BENCH_DIR=str(work))
    variants = [("now", env)]
    if args.compare is not None:
        before = dict(env, PYTHONPATH=f"{args.compare.resolve()}{os.pathsep}"
                      f"{env.get('PYTHONPATH', '')}")
        variants.append((f"before ({args.compare})", before))
    where = [sys.executable, "-c", "import planner; print(planner.__file__)"]
    for label, variant_env in variants:
        print(f"  {label}: {run(where, variant_env)[2].strip()}", file=sys.stderr)
    cli = [sys.executable, "-m", "planner.cli.main"]
    graph, plan = work / "graph.json", work / "plan.json"
    rows: list[tuple[str, str, list[float], list[float], str]] = []

    def timed(name: str, cmd: list[str], extra: dict[str, str] | None = None,
              key: str | None = None) -> None:
        """`cmd` --runs times in each variant, the variants one after the other in each round
        (so that they meet the same load)."""
        samples: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v, _ in variants}
        load_before = load()
        for _ in range(args.runs):
            for label, variant_env in variants:
                wall, cpu, out = run(cmd, dict(variant_env, **(extra or {})))
                if key is not None:  # the child's own measure of one call
                    wall = json.loads(out.strip().splitlines()[-1])[key]
                samples[label][0].append(wall)
                samples[label][1].append(cpu)
        for label, (walls, cpus) in samples.items():
            rows.append((name, label, walls, cpus, f"{load_before} -> {load()}"))
            print(f"  {name} [{label}]: median {statistics.median(walls):.2f} s",
                  file=sys.stderr)

    print(f"timing ({args.runs} runs each) in {work}", file=sys.stderr)
    timed("planner-cli methods", [*cli, "methods"])
    timed("planner-cli methods --json", [*cli, "methods", "--json"])
    timed(f"planner-cli trace {args.model}", [*cli, "trace", args.model, "-o", str(graph)])
    if not args.skip_apply:
        run([*cli, "trace", args.model, "-o", str(graph)], env)  # the plan's own capture
        run([*cli, "solve", str(graph), "--budget", "1TiB", "--method", "store-all",
             "-o", str(plan)], env)
        script = work / "apply_once.py"
        script.write_text(APPLY_SCRIPT)
        apply_cmd = [sys.executable, str(script), args.model, str(plan)]
        timed("apply(): the call, recorded capture", apply_cmd, key="apply_s")
        timed("apply(): whole process, recorded capture", apply_cmd)
        off = {"PLANNER_TRACE_CACHE": "off"}
        timed("apply(): the call, capturing again", apply_cmd, off, key="apply_s")
        timed("apply(): whole process, capturing again", apply_cmd, off)

    print(f"\n{args.runs} runs each; {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    print(f"| {'what':<42} | {'code':<6} | median wall s | median CPU s | min–max wall s | "
          "load 1/5/15 min, before -> after |")
    print(f"|{'-' * 44}|--------|---------------|--------------|----------------|"
          "----------------------------------|")
    for name, label, walls, cpus, loads in rows:
        cpu = statistics.median(cpus)
        print(f"| {name:<42} | {label.split()[0]:<6} | {statistics.median(walls):13.2f} | "
              f"{cpu:12.2f} | {min(walls):6.2f}–{max(walls):<7.2f} | {loads} |")
    print("\n('the call' rows: wall is apply() itself, measured inside the process; CPU is the "
          "whole process's. 'before' code has no recorded captures: it captures in every row.)")


if __name__ == "__main__":
    main()
