"""Each module's additive figures for one stage's knapsack (planner.solvers.pipeline.stage_menu):
what keeping, recomputing or offloading it, or one of its op-level options, frees per
micro-batch, adds to the transient and host bytes, and costs in time. Each figure bounds the
simulator's rule (planner.sim.stage_policies), so a sum of them bounds a stage's peak."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from planner.core.pipeline_actions import UnitPolicy
from planner.sim.ledger import MemoryLedger
from planner.sim.stage_costs import checkpoint_state_bytes
from planner.sim.stage_policies import (
    StageFacts,
    UnitFacts,
    unit_weight_reload_ms,
    weight_rerun_bytes,
)
from planner.sim.stage_working import backward_working_bytes, forward_working_bytes
from planner.sim.unit_times import copies_ms
from planner.solvers.pipeline.op_options import (
    OpOption,
    module,
    offload_options,
    selective_options,
)
from planner.solvers.pipeline.problem import PipelineProblem
from planner.solvers.pipeline.region_options import dominated, region_options


class TimeUp(Exception):  # noqa: N818 - a signal, not an error
    """choose() ran past its deadline (nothing is known about the stage)."""


@dataclass(frozen=True)
class Item:
    """One module's additive figures (bytes of storage roots)."""

    name: str
    host_bytes: int  # its host copies when offloaded
    exclusive_bytes: int  # saved roots no other module or outside node of the stage keeps
    inputs_bytes: int
    recompute_transient_bytes: int  # its backward working bytes, recomputed (upper bound)
    offload_transient_bytes: int  # and offloaded
    recompute_ms: float
    offload_ms: float  # its copies out and back in the stage's stream (and a split W's reloads)
    weight_rerun_bytes: int = 0  # recomputed: what its reruns leave in a split W (bound)
    ops: tuple[OpOption, ...] = ()  # op-level options: selective checkpoints, partial offloads


def items(problem: PipelineProblem, facts: StageFacts, weight_reruns: bool = False,
          op_level: bool = True, offload: bool = True,
          deadline: float | None = None) -> list[Item]:
    """Each module's figures; `weight_reruns`: a split W (zero-bubble, not the first stage)
    keeps its reruns (planner.sim.stage_policies.weight_rerun_bytes, one module at a time:
    their sum bounds the simulator's); `op_level`: with its op-level options; `offload`
    False: no offload figures (a knapsack without the host tier). TimeUp past `deadline`."""
    size = MemoryLedger.of(problem.graph).storage_bytes
    res = problem.resources
    out = []
    least = set(facts.rest_saved | facts.held)  # kept whatever the policies
    inputs = set().union(*(u.inputs for u in facts.units))  # never freed, whoever recomputes
    host_tier = offload and res is not None and res.d2h is not None and res.h2d is not None
    split = problem.plan_schedule.split_backward
    for u in facts.units:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeUp

        def copy_ms(moved: frozenset[int] | None, u: UnitFacts = u) -> float:
            """Its copies out and back in the stage's stream (planner.sim.unit_times), and a
            split W's reloads of what its weight-gradient nodes read (`moved`: the roots an
            op-level option moves; None: every saved one)."""
            if res is None or res.d2h is None or res.h2d is None:
                return 0.0
            nbytes, copies = u.host_bytes_of(moved, size), u.copies_of(moved)
            ms = copies_ms(res.d2h, nbytes, copies) + copies_ms(res.h2d, nbytes, copies)
            if weight_reruns:
                ms += unit_weight_reload_ms(u, moved, size, res.h2d)
            return ms

        m = module(facts, u, least, inputs)
        alone: dict[str, UnitPolicy] = {w.name: "keep" for w in facts.units}
        transient = []
        policy: UnitPolicy
        for policy in ("recompute", "offload") if host_tier else ("recompute",):
            alone[u.name] = policy
            kept = least | u.inputs if policy == "recompute" else least
            transient.append(backward_working_bytes(problem.graph, facts, alone, kept, inputs))
        alone[u.name] = "recompute"
        rerun = weight_rerun_bytes(problem.graph, facts, alone, False) if weight_reruns else 0
        ops = selective_options(problem.graph, m, weight_reruns) if op_level else ()
        if host_tier and not split and op_level:  # zero-bubble: 0.6 % under torch there
            ops += offload_options(problem.graph, m, copy_ms)
        again_ms = u.forward_ms if weight_reruns and u.weight_groups else 0.0  # W's rerun
        ops = tuple(replace(o, ms=o.ms + again_ms) if o.policy == "recompute" else o
                    for o in ops)
        if op_level and not weight_reruns:  # submodule checkpoints; not under a split W,
            # where their W-rerun figures grew the knapsack's frontier ~3x slower for no
            # faster plan (GPT-48 on 4 ranks, ZB-H1, 1x: 81.17 ms in 5 s, 66.16 in 20 s,
            # 65.50 without them in 5 s)
            regions = region_options(problem.graph, m)
            ops = tuple(o for o in ops if not dominated(o, regions)) + regions
        out.append(Item(u.name, u.host_bytes, sum(size[r] for r in m.exclusive),
                        sum(size[r] for r in u.inputs) + checkpoint_state_bytes(problem.graph),
                        transient[0],
                        transient[1] if host_tier else 0,
                        u.rerun_ms + again_ms, copy_ms(None), rerun, ops))
    return out


def forward_bytes(problem: PipelineProblem, facts: StageFacts) -> int:
    """The F's working bytes with only what the stage keeps whatever the policies kept: at
    least the simulator's under any policies."""
    return forward_working_bytes(problem.graph, facts, facts.rest_saved | facts.held)
