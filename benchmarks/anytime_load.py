"""The same request on a quiet and on a loaded machine, from the CLI and from the service
(issue 48): what a user gets when CPU hogs take the cores auto was planning to use.

    .venv/bin/python benchmarks/anytime_load.py --runs 2 --hogs 3 --write docs/anytime_load.md

The graph is the README's (`planner-cli trace planner.zoo:gpt`, traced once into a temporary
folder unless --graph is given); the request is the README's submit line (--budget 80%,
--time-limit 10). The CLI rows run `planner-cli solve --json` in a subprocess; the service rows
submit to `planner-cli serve` on loopback (fresh SQLite) and read the job's report. Load: N
`yes > /dev/null` processes beside the run. Every plan is replayed by the simulator.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from results import write_doc
from service_load import start_server, wait_all

from planner.core.plan import Plan
from planner.engine.inputs import load_graph
from planner.sim.simulator import simulate


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` busy processes beside the run (the issue's `yes > /dev/null`)."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]
    try:
        time.sleep(0.5 if hogs else 0.0)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def cli_run(graph_path: Path, budget: str, limit_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "solve", str(graph_path), "--budget", budget,
         "--time-limit", str(limit_s), "--json", "-o", str(graph_path.with_suffix(".plan.json"))],
        capture_output=True, text=True, check=False)
    report = json.loads(out.stdout)
    plan = Plan.model_validate_json(graph_path.with_suffix(".plan.json").read_text())
    return {**report, "answer_s": time.perf_counter() - started, "plan": plan}


def service_run(client: httpx.Client, graph_id: str, budget: str,
                limit_s: float) -> dict[str, Any]:
    # forced: otherwise the store answers the repeat from its cache
    body = {"graph_id": graph_id, "budget": budget, "time_limit": limit_s, "force": True}
    started = time.perf_counter()
    posted = client.post("/v1/plans", json=body)
    assert posted.status_code == 202, posted.text
    answer = wait_all(client, [posted.json()["id"]])[0]
    report = dict(answer["report"] or {})
    plan = Plan.model_validate(answer["plan"]) if answer.get("plan") else None
    return {**report, "answer_s": time.perf_counter() - started, "plan": plan}


def row(entry: str, hogs: int, run: int, r: dict[str, Any], graph: Any) -> tuple[str, float]:
    plan = r.pop("plan")
    checked = "-"
    overran = "yes" if plan is not None and plan.details.get("method_overran") else "no"
    if plan is not None and plan.actions:
        sim = simulate(graph, plan.actions)
        checked = "yes" if sim.peak_bytes <= plan.budget_bytes else "OVER"
    overhead = r.get("overhead_percent")
    startup = r.get("startup_seconds") or {}
    extra = (f"{startup.get('process_start', 0):.2f} + {startup.get('graph_load', 0):.2f}"
             if startup else "-")
    gap = r.get("gap_percent")
    text = (f"| {entry} | {hogs} | {run} | {r.get('status')} | {r.get('backend')} | "
            f"{'-' if overhead is None else f'+{overhead:.3f} %'} | "
            f"{'-' if gap is None else f'{gap:.3f} %'} | "
            f"{r.get('wall_seconds', 0):.2f} | {extra} | {r['answer_s']:.2f} | {overran} | "
            f"{checked} |")
    return text, (overhead if overhead is not None else float("nan"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", type=Path, default=None)
    p.add_argument("--budget", default="80%")
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--hogs", type=int, default=3)
    p.add_argument("--entries", default="cli,service")
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="anytime-"))
    graph_path = args.graph or work / "graph.json"
    if args.graph is None:
        subprocess.run([sys.executable, "-m", "planner.cli.main", "trace", "planner.zoo:gpt",
                        "-o", str(graph_path)], check=True, capture_output=True)
    graph = load_graph(graph_path)
    entries = args.entries.split(",")
    server, url = start_server(f"sqlite:///{work / 'store.db'}", 1, work) if (
        "service" in entries) else (None, "")
    rows: list[str] = []
    overheads: dict[tuple[str, int], list[float]] = {}
    try:
        client = httpx.Client(base_url=url, timeout=60) if server else None
        graph_id = ""
        if client is not None:
            graph_id = client.post("/v1/graphs", json=json.loads(graph_path.read_text())
                                   ).json()["id"]
        for hogs in (0, args.hogs):
            with cpu_hogs(hogs):
                for entry in entries:
                    for run in range(args.runs):
                        r = (cli_run(graph_path, args.budget, args.time_limit)
                             if entry == "cli" else
                             service_run(client, graph_id, args.budget,  # type: ignore[arg-type]
                                         args.time_limit))
                        text, overhead = row(entry, hogs, run + 1, r, graph)
                        rows.append(text)
                        overheads.setdefault((entry, hogs), []).append(overhead)
                        print(text, flush=True)
    finally:
        if server is not None:
            server.kill()
    summary = ["| entry | CPU hogs | median overhead | worst |", "|---|---|---|---|",
               *(f"| {entry} | {hogs} | +{statistics.median(values):.3f} % | "
                 f"+{max(values):.3f} % |" for (entry, hogs), values in overheads.items())]
    print("\n".join(summary))
    table = [*summary, "",  # the summary first, every run below it
             "| entry | CPU hogs | run | status | backend | overhead | gap | solver s | "
             "start + load s | answer s | overran (anytime answer) | fits (simulator) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]
    if args.write:
        write_doc(args.write, "Anytime answers under load",
                  [f"Command: `.venv/bin/python benchmarks/anytime_load.py --runs {args.runs} "
                   f"--hogs {args.hogs}`; graph `planner-cli trace planner.zoo:gpt` "
                   f"({len(graph.nodes)} nodes), budget {args.budget}, time limit "
                   f"{args.time_limit:g} s. `solver s` is the plan's wall time; the service's "
                   "process start and graph load are beside it."],
                  table, [])


if __name__ == "__main__":
    main()
