"""Whole-job plans run as planned, every rank on one GPU: per-rank device peaks measured by the
CUDA allocator against the plan's predictions, host peaks, and parity with one process.

Two steps, so the device's time goes to running, not planning:

    python3 benchmarks/gpu/whole_job_ranks.py plan DIR [--tiny]      # here: trace, plan, save
    python3 benchmarks/gpu/whole_job_ranks.py run DIR [--device cuda] [--out F.json] [--docs F.md]

`plan` traces a GPT (op level, one micro-batch), plans each row with `pipeline-whole` (memory a
share of the least any plain contiguous split needs, so stages must recompute or offload), and
one row with the schedule and micro-batch size chosen (`choose_job`); it writes DIR/manifest.json
and one plan file a row. `run` runs every row's plan with torch.distributed.pipelining in
`world` processes joined by gloo; on CUDA they share the one GPU (planner/runtime/staged_p2p.py
stages their messages through host memory; NCCL needs a device a rank). Per rank it measures:

- **tracker**: the project's own accounting (parameters, gradients, torch's receive buffers and
  the step's peak of live storages: `PipelineRun.measure_step`), as the CPU tests measure;
- **allocator**: the same state plus `torch.cuda.max_memory_allocated()` above the step's start
  (what the caching allocator really handed out, 512-byte rounding included);

and compares both with the plan's predicted per-rank peak. Step times are printed but are not a
pipeline's: the ranks share one GPU's compute and their messages go through host memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

GPT = {"context": 512, "dim": 512, "layers": 8, "vocab": 8192, "dropout": 0.0}
TINY = {"context": 32, "dim": 32, "layers": 8, "vocab": 64, "dropout": 0.0}
BATCH, MICROBATCHES = 16, 4
# (name, ranks, schedule, host tier, share of the least plain split's memory, method)
ROWS = [
    ("plain-1f1b-4", 4, "1f1b", False, 1.0, "dp"),
    ("whole-1f1b-2-host", 2, "1f1b", True, 0.85, "whole"),
    ("whole-1f1b-4-host", 4, "1f1b", True, 0.85, "whole"),
    ("whole-1f1b-2", 2, "1f1b", False, 0.85, "whole"),
    ("whole-1f1b-4", 4, "1f1b", False, 0.8, "whole"),
    ("whole-zb-h1-2", 2, "zb-h1", False, 0.85, "whole"),
    ("whole-zb-h1-4", 4, "zb-h1", False, 0.8, "whole"),  # full backwards for memory
    ("whole-interleaved-2-host", 2, "interleaved-1f1b", True, 0.85, "whole"),
]
CHOICE = ("chosen-4", 4, "auto", False, 0.85, "whole")


def _machine(host: bool) -> Any:
    from planner.core.resources import resources_preset
    from planner.engine.request import with_host_memory

    if not host:
        return resources_preset("h100-pcie-gen5")
    # Host rows are planned for a GH200's host link (NVLink-C2C, 450 GB/s each way), where
    # copying some modules beats recomputing them; over PCIe Gen5 the planner offloads nothing
    # on this GPT, since a copy holds the stage's stream (docs/whole_job.md, "Copies in the
    # step"). The lent H100 copies over PCIe, so these rows' step times are not their plans';
    # memory is what they check.
    return with_host_memory(resources_preset("gh200"), "64GiB")


def _graph(gpt: dict[str, Any], micro_batch: int, cache: dict[int, Any], device: str) -> Any:
    """One micro-batch's op graph, traced on `device` (on CUDA it records each op's workspace,
    the transient buffers a CPU trace cannot see)."""
    from planner import zoo
    from planner.tracing.api import trace

    if micro_batch not in cache:
        model, inputs = zoo.gpt(batch_size=micro_batch, **gpt)
        model = model.to(device)
        cache[micro_batch] = trace(model, tuple(x.to(device) for x in inputs)).graph
    return cache[micro_batch]


def _least_plain(graph: Any, ranks: int, microbatches: int) -> int:
    from planner.solvers.pipeline.dp import least_memory_split
    from planner.solvers.pipeline.problem import PipelineProblem
    from planner.solvers.pipeline.units import UnitChain

    plain = PipelineProblem(graph, UnitChain(graph), ranks, microbatches, "1f1b", None)
    return int(least_memory_split(plain)[0])


def plan_rows(out: Path, tiny: bool, time_limit_s: float, device: str) -> None:
    from planner.engine.job_choice import choose_job
    from planner.engine.job_options import AUTO_SCHEDULES
    from planner.engine.partition import partition_plan
    from planner.runtime.pipeline_checks import runs_split_backward
    from planner.solvers.pipeline.schedules import SPLIT_BACKWARD

    # Planned where they run (the rankplan phase): a torch whose split backward the runtime
    # refuses (docs/whole_job.md, "On a GPU") gets no W schedule, so no row is planned in vain.
    no_w = device != "cpu" and not runs_split_backward()
    schedules = tuple(s for s in AUTO_SCHEDULES if not (no_w and s in SPLIT_BACKWARD))

    gpt = TINY if tiny else GPT
    batch = 8 if tiny else BATCH
    out.mkdir(parents=True, exist_ok=True)
    cache: dict[int, Any] = {}
    manifest = []
    for name, ranks, schedule, host, share, method in [*ROWS, CHOICE]:
        if schedule not in schedules and schedule != "auto":
            print(f"{name}: not planned (torch {torch.__version__} runs no W actions)")
            continue
        started = time.perf_counter()
        graph = _graph(gpt, batch // MICROBATCHES, cache, device)
        memory = int(share * _least_plain(graph, ranks, MICROBATCHES))
        common = dict(devices=ranks, device_memory_bytes=memory, method=method,
                      resources=_machine(host), threads=2)
        try:
            if schedule == "auto":
                graphs = [(f"b{b}", _graph(gpt, b, cache, device)) for b in (1, 2, 4)
                          if batch % b == 0]
                choice = choose_job(graphs, global_batch=batch, schedules=schedules,
                                    time_limit_s=6 * time_limit_s, **common)
                assert choice.best.report is not None, "choose_job found no plan"
                plan = choice.best.report.plan
            else:
                plan = partition_plan(graph, microbatches=MICROBATCHES, schedule=schedule,
                                      time_limit_s=time_limit_s, **common).plan
        except Exception as e:  # noqa: BLE001  (a row without a plan is reported, not fatal)
            print(f"{name}: no plan ({type(e).__name__}: {e})")
            continue
        assert plan.partition is not None and plan.predicted is not None
        micro_batch = _micro_batch(plan, batch)
        (out / f"{name}.json").write_text(plan.model_dump_json())
        row = {"name": name, "ranks": ranks, "schedule": plan.details.get("schedule", schedule),
               "host": host, "share": share, "method": method, "memory_bytes": memory,
               "gpt": gpt, "batch": batch, "micro_batch": micro_batch, "traced_on": device,
               "policies": _policies(plan),
               "predicted": plan.predicted.per_rank_peak_bytes,
               "predicted_host": plan.predicted.host_peak_bytes,
               "predicted_host_ranks": plan.predicted.per_rank_host_peak_bytes,
               "plan_seconds": round(time.perf_counter() - started, 1)}
        manifest.append(row)
        print(f"{name}: {row['schedule']}, b {micro_batch}, memory {memory:,} B, predicted "
              f"{row['predicted']}, {row['policies']} ({row['plan_seconds']} s)")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    from planner.core.io import write_json

    for b, graph in cache.items():  # the plans' graphs (on CUDA: with the op workspaces)
        write_json(out / f"graph-b{b}-{device}.json", graph)


def _micro_batch(plan: Any, batch: int) -> int:
    microbatches = 1 + max(a.microbatch_index for row in plan.rank_actions for a in row)
    return batch // microbatches


def _policies(plan: Any) -> list[str]:
    """Per stage, its units' policies in short (`h.3 rc[3 kept]`, `h.5 off[2 moved]`)."""
    out = []
    for s in plan.partition.stages:
        parts = []
        for unit, policy in s.unit_policies.items():
            kept = s.unit_saved_ops.get(unit)
            moved = s.unit_offload_ops.get(unit)
            detail = f"[{len(kept)} kept]" if kept else f"[{len(moved)} moved]" if moved else ""
            parts.append(f"{unit} {'rc' if policy == 'recompute' else 'off'}{detail}")
        if s.variants:
            parts.append(f"+{len(s.variants)} variant(s)")
        out.append(", ".join(parts) or "keep")
    return out


def _worker(rank: int, world: int, plan_json: str, row: dict[str, Any], device_name: str,
            stage_all: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from planner import zoo
    from planner.core.plan import Plan
    from planner.runtime.pipeline import build_pipeline
    from planner.runtime.staged_p2p import install

    install(stage_all=stage_all)
    cuda = device_name.startswith("cuda")
    device = torch.device("cuda", 0) if device_name == "cuda" else torch.device(device_name)
    if cuda:
        torch.cuda.set_device(device)
    plan = Plan.model_validate_json(plan_json)
    reference = _reference(row, device) if rank == 0 else None
    model, inputs = zoo.gpt(batch_size=row["batch"], **row["gpt"])  # the same seed: same weights
    run = build_pipeline(model, plan, inputs, device=device)
    on_device = tuple(x.to(device) for x in inputs)
    loss = run.step(*on_device)  # the first step: torch builds its buffers; gradients from zero
    grads = {k: p.grad.detach().cpu() for k, p in run.parameters().items() if p.grad is not None}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, grads)
    tracker = run.measure_step(*on_device)
    allocator = _allocator_step(run, on_device, cuda, tracker)
    out = {"rank": rank, "loss": loss, "device": _device_text(device),
           "tracker": tracker.__dict__ | {"peak": tracker.peak_bytes},
           "allocator": allocator, "step_ms": run.time_steps(*on_device, repeats=3)}
    if reference is not None:
        out["parity"] = _parity(reference, loss, gathered)
    return out


def _device_text(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{name}, torch {torch.__version__}"


def _reference(row: dict[str, Any], device: torch.device) -> dict[str, Any]:
    from planner import zoo

    model, inputs = zoo.gpt(batch_size=row["batch"], **row["gpt"])
    model = model.to(device)
    loss = model(*(x.to(device) for x in inputs))
    loss.backward()
    grads = {k: p.grad.detach().cpu() for k, p in model.named_parameters() if p.grad is not None}
    out = {"loss": float(loss.detach()), "grads": grads}
    del model, loss
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _parity(reference: dict[str, Any], loss: float, gathered: list[Any]) -> dict[str, Any]:
    grads: dict[str, torch.Tensor] = {}
    for part in gathered:
        grads.update(part)
    expected = reference["grads"]
    same = sorted(grads) == sorted(expected)
    errors = {k: float((grads[k] - g).abs().max()) for k, g in expected.items() if k in grads}
    scale = max(float(g.abs().max()) for g in expected.values())
    worst = sorted(errors, key=lambda k: -errors[k])[:3]
    return {"same_parameters": same, "loss": loss, "reference_loss": reference["loss"],
            "max_grad_error": max(errors.values()) if same else None, "grad_scale": scale,
            "worst": [(k, errors[k], float(expected[k].abs().max()),
                       float(grads[k].norm() / max(float(expected[k].norm()), 1e-30)))
                      for k in worst]}


def _allocator_step(run: Any, inputs: tuple[Any, ...], cuda: bool,
                    tracked: Any) -> dict[str, int] | None:
    """One step's device memory from the CUDA caching allocator: the state the plan counts
    (this rank's parameters, gradients and torch's receive buffers) plus the step's peak above
    its start; `process` is the process's whole allocator peak (CUDA workspaces, the inputs)."""
    import torch.distributed as dist

    if not cuda:
        return None
    run.zero_grad()
    torch.cuda.synchronize()
    dist.barrier(group=run.group)
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run.host.reset_peak()
    run.step(*inputs)
    torch.cuda.synchronize()
    process = torch.cuda.max_memory_allocated()
    # the same storages the tracked step counted (they persist across steps)
    state = tracked.parameters_bytes + tracked.gradients_bytes + tracked.pipeline_buffers_bytes
    return {"state": state, "above_start": process - start, "peak": state + process - start,
            "process": process, "host_peak": run.host.peak_bytes}


def run_rows(folder: Path, device_name: str, only: list[str] | None,
             start_method: str) -> list[dict[str, Any]]:
    from planner.runtime.pipeline_launch import run_local

    manifest = json.loads((folder / "manifest.json").read_text())
    stage_all = not device_name.startswith("cuda")
    results = []
    for row in manifest:
        if only and row["name"] not in only:
            continue
        started = time.perf_counter()
        plan_json = (folder / f"{row['name']}.json").read_text()
        try:
            ranks = run_local(_worker, row["ranks"], plan_json, row, device_name, stage_all,
                              start_method=start_method, timeout_s=300.0)
            result = {**row, "ranks_measured": ranks, "error": None}
        except Exception as e:  # noqa: BLE001  (a failed row is reported; the others still run)
            result = {**row, "ranks_measured": None, "error": f"{type(e).__name__}: {e}"[:600]}
        result["run_seconds"] = round(time.perf_counter() - started, 1)
        results.append(result)
        print(_row_text(result), flush=True)
    return results


def _row_text(r: dict[str, Any]) -> str:
    head = (f"## {r['name']}: {r['ranks']} ranks, {r['schedule']}, micro-batch {r['micro_batch']}"
            f", memory {r['memory_bytes']:,} B, {'host tier' if r['host'] else 'no host tier'}, "
            f"traced on {r.get('traced_on', 'cpu')}"
            f" ({r['run_seconds']} s)\npolicies: {' | '.join(r['policies'])}")
    if r["error"]:
        return f"{head}\nFAILED: {r['error']}"
    lines = [head, f"device: {r['ranks_measured'][0]['device']}",
             _parity_text(r["ranks_measured"][0].get("parity")),
             "| rank | predicted B | tracker B | tracker / pred | allocator B | allocator / pred "
             "| process peak B | host measured / predicted B | step ms |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    host_pred = r.get("predicted_host_ranks") or r["predicted_host"]
    for m, pred in zip(r["ranks_measured"], r["predicted"], strict=True):
        alloc = m["allocator"]
        a_text = (f"{alloc['peak']:,} | {alloc['peak'] / pred:.3f} | {alloc['process']:,}"
                  if alloc else "- | - | -")
        host = _host_measured(m)
        lines.append(f"| {m['rank']} | {pred:,} | {m['tracker']['peak']:,} | "
                     f"{m['tracker']['peak'] / pred:.3f} | {a_text} | {host:,} / "
                     f"{_host_of(host_pred, m['rank'])} | {m['step_ms']:.1f} |")
    return "\n".join(lines)


def _host_of(predicted: Any, rank: int) -> str:
    if isinstance(predicted, list):
        return f"{predicted[rank]:,}" if rank < len(predicted) else "-"
    return f"{predicted:,} (all ranks)" if predicted is not None else "-"


def _parity_text(p: dict[str, Any] | None) -> str:
    if p is None:
        return "parity: -"
    return (f"parity: same parameters {p['same_parameters']}, loss {p['loss']:.6f} vs "
            f"{p['reference_loss']:.6f}, max gradient error {p['max_grad_error']:.3g} "
            f"(largest gradient {p['grad_scale']:.3g})" + (
                "" if p["max_grad_error"] is not None
                and p["max_grad_error"] <= 1e-5 * max(1.0, p["grad_scale"]) else
                "; WRONG: " + ", ".join(f"{k} error {e:.3g} of {m:.3g} (norm ratio {r:.4f})"
                                        for k, e, m, r in p["worst"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["plan", "run"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tiny", action="store_true", help="plan the test-sized GPT (CPU dry run)")
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds a plan (plan step)")
    ap.add_argument("--trace-device", default="cpu",
                    help="where the plan step traces (cuda: the op workspaces the GPU allocates)")
    ap.add_argument("--device", default="cuda", help="cuda (every rank on GPU 0) or cpu")
    ap.add_argument("--start-method", default=None,
                    help="of the rank processes (default: spawn on CUDA, whose driver does not "
                         "survive a fork, else fork)")
    ap.add_argument("--rows", default="", help="comma-separated row names (run step)")
    ap.add_argument("--out", type=Path, help="write every row as JSON here (run step)")
    args = ap.parse_args()
    if args.step == "plan":
        plan_rows(args.folder, args.tiny, args.time_limit, args.trace_device)
        return
    # the parent never touches CUDA (the ranks are its children); rank 0 names the device
    start = args.start_method or ("spawn" if args.device.startswith("cuda") else "fork")
    results = run_rows(args.folder, args.device, [r for r in args.rows.split(",") if r], start)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    print(_summary(results))
    sys.exit(1 if any(r["error"] or not _parity_ok(r) for r in results) else 0)


def _parity_ok(r: dict[str, Any]) -> bool:
    p = r["ranks_measured"][0].get("parity") if r["ranks_measured"] else None
    return p is None or (p["same_parameters"] and p["max_grad_error"] is not None
                         and p["max_grad_error"] <= 1e-5 * max(1.0, p["grad_scale"]))


def _summary(results: list[dict[str, Any]]) -> str:
    """Rows failed, rows with wrong gradients, and ranks measured over their prediction."""
    failed = [r["name"] for r in results if r["error"]]
    wrong = [r["name"] for r in results if not r["error"] and not _parity_ok(r)]
    ratios = {kind: [m[kind]["peak"] / p for r in results if r["ranks_measured"]
                     for m, p in zip(r["ranks_measured"], r["predicted"], strict=True)
                     if m[kind] is not None]
              for kind in ("allocator", "tracker")}
    over = "; ".join(f"{k}: {sum(x > 1 for x in v)} of {len(v)} ranks over their prediction "
                     f"(max {max(v):.4f})" for k, v in ratios.items() if v)
    host = [(_host_measured(m), p) for r in results
            if r["ranks_measured"] and r.get("predicted_host_ranks")
            for m, p in zip(r["ranks_measured"], r["predicted_host_ranks"], strict=True)]
    host_text = (f"; host: {sum(b > p for b, p in host)} of {len(host)} ranks over their "
                 "prediction") if host else ""
    return (f"rows run {len(results)}, failed {len(failed)} {failed}, wrong gradients "
            f"{len(wrong)} {wrong}" + (f"; {over}" if over else "") + host_text)


def _host_measured(m: dict[str, Any]) -> int:
    return int(m["allocator"]["host_peak"] if m["allocator"] else m["tracker"]["host_peak_bytes"])


if __name__ == "__main__":
    main()
