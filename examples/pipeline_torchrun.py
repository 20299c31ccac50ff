"""Run a pipeline plan on a GPT with torch.distributed.pipelining (CPU: gloo; GPU: nccl).

    torchrun --nproc-per-node 4 examples/pipeline_torchrun.py --schedule 1f1b --check
    torchrun --nproc-per-node 2 examples/pipeline_torchrun.py --plan plan.json

Every rank builds the same model (seeded) and batch, `planner.runtime.pipeline.build_pipeline`
splits
it by the plan's module names and runs the plan's per-rank action lists. Without `--plan` a plan
is made here: the GPT's blocks split evenly (embeddings on the first stage, final norm and head
on the last) and the GPipe or 1F1B action lists with their SEND/RECV. Rank 0 prints, per rank,
the measured peak (model state, torch's receive buffers, what the step allocated by the
live-storage tracker and by the allocator's records; the larger counts) next to the
simulator's prediction for the plan, the measured step time next to the simulated makespan
and, with `--check`, the largest difference from the single-process step's loss and gradients.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from planner.core.pipeline_actions import Partition, PipelineAction, pipeline_action
from planner.core.pipeline_actions import PipelineStage as StageSpec
from planner.core.plan import Plan, PlanStatus
from planner.core.resources import Resources


def even_split(layers: int, stages: int) -> list[list[str]]:
    """GPT module names per stage: blocks split evenly, embeddings first, norm and head last."""
    if not 1 <= stages <= layers:
        raise SystemExit(f"--layers {layers}: need at least one block per stage ({stages})")
    bounds = [round(i * layers / stages) for i in range(stages + 1)]
    out = [[f"h.{b}" for b in range(bounds[s], bounds[s + 1])] for s in range(stages)]
    out[0] = ["tok", "pos", *out[0]]
    out[-1] = [*out[-1], "ln_f", "head"]
    return out


def schedule_rows(kind: str, stages: int, m: int) -> list[list[PipelineAction]]:
    """GPipe or 1F1B action lists, one stage per rank, with their SEND/RECV."""
    rows = []
    for s in range(stages):
        if kind == "gpipe":
            order = [("F", mb) for mb in range(m)] + [("B", mb) for mb in range(m)]
        else:
            warmup = min(stages - 1 - s, m)
            order = [("F", mb) for mb in range(warmup)]
            for i in range(m - warmup):
                order += [("F", warmup + i), ("B", i)]
            order += [("B", mb) for mb in range(m - warmup, m)]
        row = []
        for op, mb in order:
            if op == "F" and s > 0:
                row.append(pipeline_action(s, "RECV_F", mb))
            if op == "B" and s < stages - 1:
                row.append(pipeline_action(s, "RECV_B", mb))
            row.append(pipeline_action(s, op, mb))
            if op == "F" and s < stages - 1:
                row.append(pipeline_action(s, "SEND_F", mb))
            if op == "B" and s > 0:
                row.append(pipeline_action(s, "SEND_B", mb))
        rows.append(row)
    return rows


def make_plan(args: argparse.Namespace, ranks: int) -> Plan:
    split = even_split(args.layers, ranks)
    part = Partition(stages=[StageSpec(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(split)])
    return Plan(
        graph_hash="example", method="even-split", status=PlanStatus.feasible, partition=part,
        rank_actions=schedule_rows(args.schedule, ranks, args.microbatches),
        resources=Resources(microbatches=args.microbatches, pipeline_schedule=args.schedule),
    )


def with_recompute(plan: Plan, stages: list[int]) -> Plan:
    """The plan with every micro-batch of `stages` recomputed (recompute_microbatches), so that
    the runtime and the simulator both see it."""
    if not stages or plan.partition is None or not plan.rank_actions:
        return plan
    every = list(range(1 + max(a.microbatch_index for row in plan.rank_actions for a in row)))
    part = Partition(stages=[
        s.model_copy(update={"recompute_microbatches": every}) if s.stage_index in stages else s
        for s in plan.partition.stages
    ])
    return plan.model_copy(update={"partition": part, "predicted": None})


def predict(args: argparse.Namespace, plan: Plan) -> Any:
    """The simulator's view of the plan, on the op-level trace of one micro-batch."""
    from planner import zoo
    from planner.sim.pipeline_ranks import simulate_pipeline
    from planner.tracing.api import trace

    model, inputs = zoo.gpt(batch_size=args.batch // args.microbatches, **gpt_options(args))
    graph = trace(model, inputs, costs="measure").graph
    assert plan.partition is not None and plan.rank_actions is not None
    return simulate_pipeline(graph, plan.partition, plan.rank_actions)


def gpt_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"context": args.context, "dim": args.dim, "layers": args.layers, "vocab": args.vocab,
            "dropout": 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default=None, help="plan.json of kind pipeline")
    parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--recompute", type=int, nargs="*", default=[], help="stage indices")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median)")
    parser.add_argument("--check", action="store_true", help="compare with one process")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))

    from planner import zoo
    from planner.runtime.pipeline import (
        build_pipeline,
        gather_gradients,
        gather_memory,
        memory_table,
    )

    model, inputs = zoo.gpt(batch_size=args.batch, **gpt_options(args))
    reference = copy.deepcopy(model) if args.check else None
    model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    from planner.core.errors import InputError
    from planner.runtime.apply import load

    try:
        plan = with_recompute(load(args.plan) if args.plan else make_plan(args, ranks),
                              args.recompute)
        run = build_pipeline(model, plan, inputs, device=device)
    except InputError as e:  # one clear line, exit 2 (every rank sees the same input)
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    loss = run.step(*inputs)
    error = None
    if reference is not None:
        ref_loss = reference(*(x.cpu() for x in inputs))
        ref_loss.backward()
        grads = gather_gradients(run)
        error = max(float((grads[k].cpu() - p.grad).abs().max())
                    for k, p in reference.named_parameters() if p.grad is not None)
        error = max(error, abs(loss - float(ref_loss.detach())))
    memory = gather_memory(run, run.measure_step(*inputs))
    step_ms = run.time_steps(*inputs, repeats=args.steps)
    times: list[Any] = [None] * ranks
    dist.all_gather_object(times, step_ms)
    if rank == 0:
        sim = predict(args, plan)
        planned = plan.predicted.per_rank_peak_bytes if plan.predicted else None
        print(f"plan {plan.method}, {plan.partition.stage_count if plan.partition else 0} "
              f"stages on {ranks} ranks, {run.microbatches} micro-batches, loss {loss:.6f}")
        if error is not None:
            print(f"largest |difference| from the single-process step (loss, gradients): "
                  f"{error:.3g}")
        source = "the plan's prediction" if planned else "the simulator on this machine's trace"
        print(f"predicted: {source}")
        print(memory_table(memory, planned or [r.peak_bytes for r in sim.ranks]))
        slowest = max(times)
        print(f"step time (median of {args.steps}, slowest rank): {slowest:.1f} ms; simulated "
              f"makespan {sim.makespan_ms:.1f} ms (ratio {slowest / sim.makespan_ms:.2f})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
