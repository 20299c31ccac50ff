"""Another tenant's reads while one tenant uploads large graphs (issue 50 item 4).

Starts `planner-cli serve` on a free loopback port (SQLite in a temporary folder, two tenants'
keys), then tenant B posts `--uploads` graphs of about 20,000 nodes (about 11 MB each as
sent, pretty-printed; inside the caps) at once to POST /v1/plans (`--route plans`, a relative
budget: the store-all peak is computed at submission) or POST /v1/graphs, while tenant A
reads `GET /v1/plans` and `GET /healthz` in a loop. Prints A's latencies (median, p99, max)
during the uploads, the uploads' own times and the API process's largest RSS.

    python benchmarks/service_upload_load.py                 # the upload pool (default settings)
    python benchmarks/service_upload_load.py --no-pool       # every body parsed in the API process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
KEYS = {"a": "bench-key-tenant-a", "b": "bench-key-tenant-b"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_bodies(count: int, nodes: int, route: str) -> list[bytes]:
    """`count` distinct graphs (seeds differ) of about `nodes` nodes, pretty-printed (about
    11 MB at 20,000 nodes)."""
    from planner.core.synthetic import training_graph

    bodies = []
    for seed in range(count):
        doc = training_graph(max(1, (nodes - 1) // 2), skip=4, seed=seed).model_dump(mode="json")
        body = doc if route == "graphs" else {"graph": doc, "budget": 0.7,
                                              "method": "chen-greedy", "time_limit": 5}
        bodies.append(json.dumps(body, indent=2).encode())
    return bodies


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=6)
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--route", choices=("plans", "graphs"), default="plans")
    ap.add_argument("--no-pool", action="store_true",
                    help="parse every body in the API process (the behaviour before the pool)")
    ap.add_argument("--reader-interval-s", type=float, default=0.02)
    args = ap.parse_args()

    bodies = make_bodies(args.uploads, args.nodes, args.route)
    print(f"{args.uploads} bodies of {statistics.mean(len(b) for b in bodies) / 1e6:.1f} MB "
          f"({args.nodes} nodes) to POST /v1/{args.route}; pool: "
          f"{'off' if args.no_pool else 'on'}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="upload-bench-"))
    port = free_port()
    env = dict(os.environ)
    env.update(
        PLANNER_DATABASE_URL=f"sqlite:///{work / 'bench.db'}",
        PLANNER_API_KEYS=json.dumps([f"{t}:{k}" for t, k in KEYS.items()]),
        PLANNER_STATE_DIR=str(work / "state"),
        PLANNER_SUBMISSIONS_PER_MINUTE="1000",
        PLANNER_LOG_LEVEL="warning",
        MPLBACKEND="Agg",
    )
    if args.no_pool:
        env["PLANNER_UPLOAD_POOL_MIN_BYTES"] = str(2**40)
    log = open(work / "server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", "serve", "--host", "127.0.0.1",
         "--port", str(port)], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print((work / "server.log").read_text()[-3000:])
                return 1
            time.sleep(0.1)
        return run(args, url, server.pid, bodies)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def run(args: argparse.Namespace, url: str, pid: int, bodies: list[bytes]) -> int:
    a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['a']}"}, timeout=120)
    b_headers = {"Authorization": f"Bearer {KEYS['b']}", "content-type": "application/json"}
    for _ in range(5):  # warm: connections, the key cache
        a.get("/v1/plans?limit=50")
        a.get("/healthz")
    rss_idle = rss_bytes(pid)
    done = threading.Event()
    gets: list[float] = []
    health: list[float] = []
    rss_max = [rss_idle]
    uploads: list[tuple[int, float]] = []

    def read_loop() -> None:
        while not done.is_set():
            t = time.perf_counter()
            a.get("/v1/plans?limit=50").raise_for_status()
            gets.append(time.perf_counter() - t)
            t = time.perf_counter()
            a.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - t)
            time.sleep(args.reader_interval_s)

    def rss_loop() -> None:
        while not done.is_set():
            rss_max[0] = max(rss_max[0], rss_bytes(pid))
            time.sleep(0.05)

    def upload(body: bytes) -> None:
        t = time.perf_counter()
        with httpx.Client(base_url=url, headers=b_headers, timeout=300) as b:
            status = b.post(f"/v1/{args.route}", content=body).status_code
        uploads.append((status, time.perf_counter() - t))

    readers = [threading.Thread(target=read_loop), threading.Thread(target=rss_loop)]
    for t in readers:
        t.start()
    time.sleep(0.5)
    gets.clear()
    health.clear()
    started = time.perf_counter()
    threads = [threading.Thread(target=upload, args=(body,)) for body in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    done.set()
    for t in readers:
        t.join()

    def row(name: str, values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return (f"| {name} | {len(ms)} | {statistics.median(ms):.1f} | {percentile(ms, 0.99):.1f} "
                f"| {max(ms):.1f} |")

    print("| during the uploads | n | median ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(row("tenant A: GET /v1/plans?limit=50", gets))
    print(row("tenant A: GET /healthz", health))
    print(row(f"tenant B: POST /v1/{args.route}", [s for _, s in uploads]))
    statuses = sorted({status for status, _ in uploads})
    print(f"uploads: {len(uploads)} in {elapsed:.1f} s, statuses {statuses}; API process RSS "
          f"{rss_idle / 2**20:.0f} MiB idle, {rss_max[0] / 2**20:.0f} MiB at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
