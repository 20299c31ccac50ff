"""Load on the planning service over loopback: N client processes, mixed cache hits and new
solves. Prints throughput and p50/p99 latencies of cached plan retrieval (GET of a finished
plan, and a POST answered from the store) and of submission acknowledgement (POST -> 202).

    .venv/bin/python benchmarks/service_load.py --clients 8 --requests 60
    .venv/bin/python benchmarks/service_load.py --server http://127.0.0.1:8000   # a running one

Without --server it starts `planner-cli serve` on a free loopback port with a fresh SQLite file
(or --database-url). Every finished plan is replayed by the simulator before numbers are shown.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from planner.core.graph import Graph
from planner.core.plan import Plan
from planner.core.synthetic import training_graph
from planner.engine.inputs import load_graph
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all_peak_bytes

FINISHED = ("done", "infeasible", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(database_url: str, workers: int, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PLANNER_DATABASE_URL=database_url, PLANNER_WORKERS=str(workers),
               PLANNER_SUBMISSIONS_PER_MINUTE="1000000", PLANNER_LOG_LEVEL="warning")
    log = open(workdir / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", "serve", "--host", "127.0.0.1", "--port",
         str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start; see {workdir / 'server.log'}")


def wait_all(client: httpx.Client, ids: list[str], timeout_s: float = 600) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    answers: dict[str, dict[str, Any]] = {}
    while len(answers) < len(ids):
        for plan_id in ids:
            if plan_id not in answers:
                body = client.get(f"/v1/plans/{plan_id}").json()
                if body["status"] in FINISHED:
                    answers[plan_id] = body
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(ids) - len(answers)} plans unfinished after {timeout_s} s")
        time.sleep(0.1)
    return [answers[i] for i in ids]


def client_loop(args: tuple[str, int, int, float, str, str, list[dict[str, Any]], int]
                ) -> dict[str, Any]:
    url, client_no, requests, cache_ratio, graph_id, method, warm, base_budget = args
    rng = random.Random(client_no)
    samples: dict[str, list[float]] = {"get_done": [], "post_cached": [], "post_new": []}
    new_ids: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(requests):
            if rng.random() < cache_ratio:
                job = rng.choice(warm)
                if i % 2:
                    t = time.perf_counter()
                    r = c.get(job["url"])
                    samples["get_done"].append(time.perf_counter() - t)
                    assert r.status_code == 200 and r.json()["status"] == "done", r.text
                else:
                    body = {"graph_id": graph_id, "budget": job["budget_bytes"], "method": method}
                    t = time.perf_counter()
                    r = c.post("/v1/plans", json=body)
                    samples["post_cached"].append(time.perf_counter() - t)
                    assert r.status_code == 200, r.text
            else:
                # A budget nobody asked for yet: a new job.
                budget = base_budget + client_no * 1_000_003 + i * 997
                body = {"graph_id": graph_id, "budget": budget, "method": method}
                t = time.perf_counter()
                r = c.post("/v1/plans", json=body)
                samples["post_new"].append(time.perf_counter() - t)
                assert r.status_code == 202, r.text
                new_ids.append(r.json()["id"])
    return {"samples": samples, "new_ids": new_ids}


def cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU of one process (all its threads; not its children): load-independent."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="URL of a running service (default: start one)")
    parser.add_argument("--database-url", help="for the started server (default: SQLite file)")
    parser.add_argument("--graph", type=Path, help="graph.json (default: synthetic, 24 layers)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=60, help="per client")
    parser.add_argument("--cache-ratio", type=float, default=0.8)
    parser.add_argument("--warm-plans", type=int, default=8)
    parser.add_argument("--method", default="best-baseline")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    graph: Graph = load_graph(args.graph) if args.graph else training_graph(24, skip=4, seed=7)
    store_all = store_all_peak_bytes(graph)
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        url = args.server
        if url is None:
            db = args.database_url or f"sqlite:///{Path(tmp) / 'load.db'}"
            proc, url = start_server(db, args.workers, Path(tmp))
        try:
            run(args, url, graph, store_all, proc.pid if proc is not None else None)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def run(args: argparse.Namespace, url: str, graph: Graph, store_all: int,
        server_pid: int | None) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        graph_id = c.post("/v1/graphs", json=graph.model_dump(mode="json")).json()["id"]
        budgets = [int(store_all * (0.75 + 0.25 * k / max(1, args.warm_plans - 1)))
                   for k in range(args.warm_plans)]
        warm_ids = [
            c.post("/v1/plans", json={"graph_id": graph_id, "budget": b, "method": args.method})
            .json()["id"]
            for b in budgets
        ]
        warm = [a for a in wait_all(c, warm_ids) if a["status"] == "done"]
        if not warm:
            raise SystemExit("no warm plan finished as done; try other budgets")

    work = [(url, n, args.requests, args.cache_ratio, graph_id, args.method,
             [{"url": w["url"], "budget_bytes": w["budget_bytes"]} for w in warm],
             int(store_all * 0.9)) for n in range(args.clients)]
    pool = multiprocessing.get_context("spawn").Pool(args.clients)
    pool.map(time.sleep, [0.0] * args.clients)  # clients started before the clock starts
    cpu_before = cpu_seconds(server_pid)
    started = time.perf_counter()
    with pool:
        results = pool.map(client_loop, work)
    phase_s = time.perf_counter() - started
    cpu_after = cpu_seconds(server_pid)
    new_ids = [i for r in results for i in r["new_ids"]]
    with httpx.Client(base_url=url, timeout=60) as c:
        answers = wait_all(c, new_ids)
    solved_s = time.perf_counter() - started
    valid = 0
    for answer in answers:
        if answer["status"] == "done":
            plan = Plan.model_validate(answer["plan"])
            assert simulate(graph, plan.actions).peak_bytes <= answer["budget_bytes"]
            valid += 1

    merged: dict[str, list[float]] = {}
    for r in results:
        for key, values in r["samples"].items():
            merged.setdefault(key, []).extend(values)
    total = sum(len(v) for v in merged.values())
    labels = {
        "get_done": "cached retrieval: GET finished plan",
        "post_cached": "cached retrieval: POST answered 200",
        "post_new": "submission acknowledgement (202)",
    }
    print(f"service load: {args.clients} clients x {args.requests} requests, cache ratio "
          f"{args.cache_ratio}, graph {len(graph.nodes)} nodes, method {args.method}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'operation':40} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for key, label in labels.items():
        values = merged.get(key, [])
        if values:
            print(f"{label:40} {len(values):6d} {1000 * statistics.median(values):8.2f} "
                  f"{1000 * percentile(values, 0.99):8.2f} {1000 * max(values):8.2f}")
    print(f"throughput: {total / phase_s:.1f} requests/s over {phase_s:.2f} s; "
          f"{len(new_ids)} new solves finished in {solved_s:.2f} s "
          f"({valid} done and valid per the simulator, "
          f"{len(answers) - valid} infeasible/failed)")
    if cpu_before is not None and cpu_after is not None:
        print(f"server process CPU: {1000 * (cpu_after - cpu_before) / total:.2f} ms per request "
              "(solver processes not included)")
    with httpx.Client(base_url=url, timeout=60) as c:
        sequential = []
        for _ in range(200):
            t = time.perf_counter()
            c.get(warm[0]["url"])
            sequential.append(time.perf_counter() - t)
    print(f"one client, no solves running: GET finished plan p50 "
          f"{1000 * statistics.median(sequential):.2f} ms, p99 "
          f"{1000 * percentile(sequential, 0.99):.2f} ms")
    cached = merged.get("get_done", []) + merged.get("post_cached", [])
    if cached:
        p99 = 1000 * percentile(cached, 0.99)
        print(f"cached retrieval p99 {p99:.2f} ms (target < 20 ms): "
              f"{'met' if p99 < 20 else 'NOT met'}")
    print(json.dumps({k: len(v) for k, v in merged.items()}))


if __name__ == "__main__":
    main()
