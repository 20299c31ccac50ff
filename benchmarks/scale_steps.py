"""Scaling of every step with the graph (issue 14, items 2 and 4).

Graphs: `planner.core.synthetic.training_graph(L, skip=3)` (a layer chain with a skip connection
every
third layer, forward + loss + backward: 2L + 1 nodes) at about 1k, 5k, 20k and 100k nodes.

1. Steps, in this process, seconds (median of --repeats runs below 20k nodes, one run above):
   load (graph.json text → Graph, validation included), validate (the structural check alone),
   index (adjacency, topological order, sizes), hash, each baseline, simulate (store-all plan),
   `info` (the CLI's graph_info: load, store-all peak, lower bound).
2. solve with a 10 s limit, each method in its own process (an overrunning method is abandoned
   in a thread, which must not slow the next row; 4 GiB address-space cap): wall time of
   `planner.engine.solve` and of the whole process (imports and load included), beside the
   limit; status and backend of the answer.
3. The service (`planner-cli serve`, SQLite, 1 worker): POST /v1/plans with the graph inline,
   budget 0.9, method auto, time_limit 10: time to the acknowledgement, and to the finished job.

    .venv/bin/python benchmarks/scale_steps.py --write docs/scale_steps.md

Options: --sizes 1k,5k (subset), --no-solve, --no-service, --methods a,b.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from results import machine, write_page

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> layers (2L + 1 nodes); 19,999 nodes: the service's max_nodes is 20,000
SIZES = {"1k": 500, "5k": 2500, "20k": 9999, "100k": 50000}
LIMIT_S = 10.0
BUDGET_FRACTION = 0.9
MEMORY_CAP_BYTES = 4 * 2**30


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), value


def _validate(graph: Any) -> None:
    from planner.core.graph import check_structure, paused_gc

    with paused_gc():  # as Graph's validator runs it
        check_structure(graph)


def step_rows(path: Path, repeats: int) -> dict[str, str]:
    from planner.cli.graph_cmds import graph_info
    from planner.core.graph import GraphIndex
    from planner.core.io import load_graph
    from planner.sim.simulator import simulate
    from planner.solvers import baselines

    out: dict[str, str] = {}
    t, graph = timed(lambda: load_graph(path), repeats)
    out["load"] = f"{t:.3f}"
    out["validate"] = f"{timed(lambda: _validate(graph), repeats)[0]:.3f}"

    def index() -> None:
        ix = GraphIndex(graph)
        ix.topological_order, ix.order_predecessors, ix.storage_bytes  # noqa: B018

    out["index"] = f"{timed(index, repeats)[0]:.3f}"
    out["hash"] = f"{timed(lambda: graph.model_copy().content_hash(), repeats)[0]:.3f}"
    t, plan = timed(lambda: baselines.store_all(graph), repeats)
    out["store-all"] = f"{t:.3f}"
    out["simulate"] = f"{timed(lambda: simulate(graph, plan), repeats)[0]:.3f}"
    out["chen-sqrt"] = f"{timed(lambda: baselines.chen_sqrt(graph), repeats)[0]:.3f}"
    out["chen-greedy"] = f"{timed(lambda: baselines.chen_greedy(graph), 1)[0]:.3f}"
    started = time.perf_counter()
    try:
        actions = baselines.recompute_all(graph, max_actions=baselines.QUADRATIC_MAX_ACTIONS)
        out["recompute-all"] = f"{time.perf_counter() - started:.3f} ({len(actions):,} actions)"
    except baselines.ScheduleAbandoned:
        out["recompute-all"] = (f"> {baselines.QUADRATIC_MAX_ACTIONS:,} actions "
                                f"(stopped at {time.perf_counter() - started:.2f})")
    out["info"] = f"{timed(lambda: graph_info(path), 1)[0]:.3f}"
    return out


SOLVE_CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
began = time.perf_counter()
from planner.core.io import load_graph
from planner.engine.solve import solve
from planner.solvers.baselines import store_all_peak_bytes
graph = load_graph({path!r})
budget = int({fraction} * store_all_peak_bytes(graph))
resources = None
if {method!r}.startswith(("offload", "pofo")):  # these move memory to the host
    from planner.core.resources import resources_from_dict
    resources = resources_from_dict({{"preset": "h100-pcie-gen5", "host_memory_bytes": 2**38}})
try:
    started = time.perf_counter()
    plan = solve(graph, budget, {method!r}, time_limit_s={limit}, resources=resources)
    solve_s = time.perf_counter() - started
    out = dict(solve_s=solve_s, status=plan.status.value, backend=plan.backend)
except MemoryError:
    out = dict(error="out of memory (4 GiB cap)")
except Exception as e:
    out = dict(error=f"{{type(e).__name__}}: {{str(e)[:80]}}")
out["process_s"] = time.perf_counter() - began
print("RESULT " + json.dumps(out), flush=True)
"""


def solve_row(path: Path, method: str) -> str:
    code = SOLVE_CHILD.format(cap=MEMORY_CAP_BYTES, path=str(path), fraction=BUDGET_FRACTION,
                              method=method, limit=LIMIT_S)
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=LIMIT_S + 600)
    except subprocess.TimeoutExpired:
        return f"no answer in {LIMIT_S + 600:g} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:80]
        return f"crashed after {time.perf_counter() - started:.1f} s: {tail}"
    r = json.loads(lines[-1][7:])
    exited = time.perf_counter() - started
    if "error" in r:
        return f"{r['error']} ({r['process_s']:.1f} s)"
    return (f"{r['solve_s']:.2f} / {r['process_s']:.2f} / {exited:.2f} {r['status']} "
            f"({r['backend']})")


def service_row(path: Path) -> str:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        env = dict(os.environ, PLANNER_DATABASE_URL=f"sqlite:///{tmp}/s.db", PLANNER_WORKERS="1",
                   MPLBACKEND="Agg")
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [sys.executable, "-m", "planner.cli.main", "serve", "--host", "127.0.0.1", "--port",
             str(port)], cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            body = json.dumps({"graph": json.loads(path.read_text()), "budget": BUDGET_FRACTION,
                               "method": "auto", "time_limit": LIMIT_S}).encode()
            with httpx.Client(base_url=url, timeout=600) as c:
                started = time.perf_counter()
                r = c.post("/v1/plans", content=body, headers={"content-type": "application/json"})
                ack = time.perf_counter() - started
                if r.status_code >= 400:
                    message = r.json()["error"]["message"][:70]
                    return f"ack {ack:.2f} s: HTTP {r.status_code} {message}"
                job_id = r.json()["id"]
                while True:
                    view = c.get(f"/v1/plans/{job_id}").json()
                    if view["status"] in ("done", "infeasible", "failed", "cancelled"):
                        break
                    time.sleep(0.1)
                total = time.perf_counter() - started
            backend = (view.get("plan") or {}).get("backend", "-")
            return (f"ack {ack:.2f} s, plan at {total:.2f} s: {view['status']} ({backend})"
                    + (f" {view['error'][:60]}" if view.get("error") else ""))
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-solve", action="store_true")
    ap.add_argument("--no-service", action="store_true")
    ap.add_argument("--methods", default="")
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()

    from planner.core.io import write_json
    from planner.core.synthetic import training_graph
    from planner.engine.registry import method_names, method_spec

    sizes = [s for s in args.sizes.split(",") if s]
    # one-device methods: the pipeline partitioners plan for several devices, not this table
    one_device = [m for m in method_names() if (s := method_spec(m)) is None or not s.pipeline]
    methods = args.methods.split(",") if args.methods else one_device
    columns: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            graph = training_graph(SIZES[size], skip=3)
            path = Path(tmp) / f"g{size}.json"
            write_json(path, graph)
            name = f"{len(graph.nodes):,} nodes"
            print(f"# {name}", file=sys.stderr, flush=True)
            col = step_rows(path, args.repeats if len(graph.nodes) < 19000 else 1)
            if not args.no_solve:
                for method in methods:
                    col[f"solve {method}"] = solve_row(path, method)
                    print(f"  {method}: {col[f'solve {method}']}", file=sys.stderr, flush=True)
            if not args.no_service:
                col["service POST (auto, 10 s)"] = service_row(path)
            columns[name] = col
    rows = list(dict.fromkeys(k for col in columns.values() for k in col))
    lines = [
        "# Scaling of every step (issue 14)",
        "",
        f"Made by `.venv/bin/python benchmarks/scale_steps.py --write docs/scale_steps.md` on "
        f"{datetime.now(UTC):%Y-%m-%d}; {machine()}.",
        "",
        "Graphs: `training_graph(L, skip=3)` (2L + 1 nodes, forward + loss + backward). Steps in "
        "seconds (median of 3 below 20,000 nodes). `solve X`: a 10 s limit at budget 0.9 × "
        "store-all peak, each in its own process: seconds in `solve()` / in the process up to the "
        "answer (imports, load and the store-all reference included) / until the process "
        "exited, then the answer's status and "
        "backend; `fallback:…` = the method overran and the engine answered with the best fast "
        "baseline (planner/engine/deadline.py). Offload methods run on the `h100-pcie-gen5` "
        "preset with 256 GiB of host memory. The promise: `solve()` ≤ limit + 2 s up to "
        "20,000 nodes.",
        "",
        "| step | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(col.get(row, "") for col in columns.values())
                     + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_page(args.write, text)


if __name__ == "__main__":
    main()
