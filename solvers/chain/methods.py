"""Planner methods on chains: `rotor`, `revolve`, `chain-chen-sqrt`, with their specs
(planner.solvers.spec; the registry is planner.engine.registry).

A graph built from a chain.json (`planner.solvers.chain.layout.chain_graph`) is solved on that exact
chain; any other graph is linearised first (`planner.solvers.chain.linearize`). The operation
sequence
is translated to plan actions and judged by the simulator in `planner.engine.solve`; the chain
model's own prediction and the operation sequence travel in `details`, the block-level plan in
`MethodResult.block_plan` (typed; its JSON also stays in `details` for version-1 readers), and
`block_plan_actions` gives the actions the simulator judges it by.

Rotor's options are `RotorOptions` (slots, refine, segments, saving, saving_levels).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.core.block_plan import BlockPlan
from planner.core.errors import InputError
from planner.core.plan import Action, PlanStatus
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, option, read_options

# The chain code (and the graph code under it) loads when a method runs: listing the specs
# (`planner-cli methods`) needs none of it. The default length of a linearised chain, as
# `linearize.MAX_SEGMENTS` (tests/engine/test_method_spec.py holds the two equal).
MAX_SEGMENTS = 200

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.solvers.chain.layout import ChainLayout
    from planner.solvers.chain.model import Chain
    from planner.solvers.chain.saving import SavingOption
    from planner.solvers.chain.sequence import Op


@dataclass(frozen=True)
class RotorOptions:
    # 500 is planner.solvers.chain.rotor.DEFAULT_SLOTS (tests/engine/test_method_spec.py holds them
    # equal); importing rotor here would load numpy with the registry.
    slots: int = option(500, "memory discretisation", minimum=1)
    refine: int = option(2, "extra DP runs that win back rounding loss", minimum=0)
    segments: int = option(MAX_SEGMENTS, "a linearised chain's most segments (the DP is cubic "
                           "in them)", minimum=2)
    saving: bool = option(False, "on a linearised graph, let each segment's full-saving forward "
                          "keep less and its backward recompute the rest, chosen per segment "
                          "(false: plain Rotor; auto uses it)")
    saving_levels: int = option(10, "levels of saving per segment (with saving)", minimum=1,
                                maximum=100)


@dataclass(frozen=True)
class ChainProblem:
    chain: Chain
    layout: ChainLayout
    source: str  # "chain.json" or "linearized"
    non_recomputable_stages: frozenset[int]  # stages (1-based) that must run forward once
    notes: tuple[str, ...] = ()
    input_ms: float = 0.0  # computing a^0 once (side values of a linearised graph)


def chain_problem(graph: Graph, max_segments: int | None = None) -> ChainProblem:
    """The graph's chain: its own (chain.json) or a linearisation of at most `max_segments`
    segments (default `linearize.MAX_SEGMENTS`); built once per graph and length (auto asks
    for it up to four times: its length, then the coarse, plain and finer DPs)."""
    length = max_segments or MAX_SEGMENTS
    memo: dict[int, ChainProblem] = graph.index.memo.setdefault("chain_problem", {})
    if length not in memo:
        memo[length] = _chain_problem(graph, length)
    return memo[length]


def _chain_problem(graph: Graph, max_segments: int) -> ChainProblem:
    from planner.solvers.chain.layout import chain_graph, chain_of_graph

    chain = chain_of_graph(graph)
    if chain is not None:
        _, layout = chain_graph(chain)
        return ChainProblem(chain, layout, "chain.json", frozenset())
    from planner.solvers.chain.linearize import linearize

    lin = linearize(graph, max_segments)
    fixed = set(lin.non_recomputable)
    stages = frozenset(
        i for i in range(1, lin.chain.length + 1) if fixed & set(lin.layout.forward[i])
    )
    note = (
        f"linearised into {lin.chain.length} segments at {len(lin.joints)} of "
        f"{lin.candidate_joints} joints (others merged: backward reads across them)"
    )
    side = lin.layout.joint[0]
    if side:
        note += f"; {len(side)} side values (read across the model) computed once, kept"
    input_ms = sum(graph.index.node(v).compute_ms for v in side)
    return ChainProblem(lin.chain, lin.layout, "linearized", stages, (note,), input_ms)


def _forward_runs(ops: tuple[Op, ...] | list[Op], length: int) -> list[int]:
    from planner.solvers.chain.blocks import block_plan_from_ops

    return block_plan_from_ops(length, ops).forward_runs


def plan_result(
    request: SolveRequest,
    problem: ChainProblem,
    ops: list[Op] | tuple[Op, ...],
    backend: str,
    extra: dict[str, Any] | None = None,
) -> MethodResult:
    """Translate a sequence into actions and report what the chain model predicts."""
    from planner.solvers.chain.blocks import block_plan_from_ops, one_level_ops
    from planner.solvers.chain.sequence import ops_text, run_sequence
    from planner.solvers.chain.translate import translate

    chain = problem.chain
    runs = _forward_runs(ops, chain.length)
    twice = sorted(i for i in problem.non_recomputable_stages if runs[i - 1] > 1)
    if twice:
        return MethodResult(
            actions=None,
            status=PlanStatus.error,
            backend=backend,
            notes=list(problem.notes)
            + [f"segments {twice} hold nodes that are not recomputable but would run twice"],
        )
    run = run_sequence(chain, ops)
    blocks = block_plan_from_ops(chain.length, ops)
    one_level = run_sequence(chain, one_level_ops(blocks))
    details: dict[str, Any] = {
        "chain": {"source": problem.source, "stages": chain.length},
        "chain_ops": ops_text(ops),
        "block_plan": blocks.model_dump(),
        "block_plan_text": blocks.text(),
        # what applying the block plan with one level of checkpointing costs (chain model)
        "block_plan_one_level": {
            "peak_bytes": one_level.peak_bytes,
            "compute_cost": one_level.cost + problem.input_ms,
        },
        "chain_predicted": {"peak_bytes": run.peak_bytes,
                            "compute_cost": run.cost + problem.input_ms},
    }
    details.update(extra or {})
    return MethodResult(
        actions=translate(request.graph, problem.layout, ops),
        status=PlanStatus.feasible,
        backend=backend,
        lower_bound=request.graph.total_compute_ms,
        notes=list(problem.notes),
        details=details,
        block_plan=blocks,
    )


def block_plan_actions(graph: Graph, block_plan: BlockPlan) -> list[Action]:
    """The actions of applying `block_plan` with one level of checkpointing, on the chain of
    `graph` (its chain.json layout, or its linearisation): what the simulator judges before a
    block plan is reported or run. Raises ValueError when the plan does not fit the chain."""
    from planner.solvers.chain.blocks import one_level_ops
    from planner.solvers.chain.translate import translate

    problem = chain_problem(graph)
    if len(block_plan.modes) != problem.chain.length:
        raise ValueError(
            f"the block plan has {len(block_plan.modes)} blocks, the graph's chain "
            f"{problem.chain.length} stages"
        )
    return translate(graph, problem.layout, one_level_ops(block_plan))


def _no_plan(problem: ChainProblem, backend: str, smallest: int | None, why: str) -> MethodResult:
    return MethodResult(
        actions=None,
        status=PlanStatus.infeasible,
        backend=backend,
        smallest_feasible_bytes=smallest,
        notes=list(problem.notes) + [why],
    )


def rotor(request: SolveRequest, *, refine_within_s: float | None = None) -> MethodResult:
    """`refine_within_s`: refinements only within this many seconds (the first DP may use the
    whole time limit)."""
    from planner.sim.simulator import PlanError, simulate
    from planner.solvers.chain.rotor import RotorTimeout, solve_rotor

    started = time.perf_counter()
    options = read_options(RotorOptions, request.options)
    try:
        slots = int(options.slots)
        refine = int(options.refine)
        segments = int(options.segments)
        n_levels = int(options.saving_levels)
    except (TypeError, ValueError):
        raise InputError("options: 'slots', 'refine', 'segments' and 'saving_levels' must be "
                         "integers") from None
    if slots < 1 or refine < 0 or segments < 2 or not 1 <= n_levels <= 100:
        raise InputError(f"options: slots {slots} must be ≥ 1, refine {refine} ≥ 0, segments "
                         f"{segments} ≥ 2 and saving_levels {n_levels} within 1..100")
    problem = chain_problem(request.graph, segments)
    saving = options.saving
    if not isinstance(saving, bool):
        raise InputError(f"options: 'saving' must be true or false, not {saving!r}")
    variants: list[SavingOption] = []
    if saving and problem.source == "linearized":
        from planner.solvers.chain.saving import saving_options

        # at most a quarter of the limit: the DP needs the rest
        variants = saving_options(request.graph, problem.layout,
                                  tuple(k / n_levels for k in range(1, n_levels + 1)),
                                  deadline=started + 0.25 * request.time_limit_s)
    option_chains = [option.chain for option in variants]
    budget = request.budget_bytes
    result: MethodResult | None = None
    # the model is exact or an upper bound; retry only where the simulator disagrees (views)
    deadline = started + request.time_limit_s
    refine_deadline = None if refine_within_s is None else started + refine_within_s
    for _ in range(3):
        try:
            sol = solve_rotor(problem.chain, budget, slots, refine=refine, deadline=deadline,
                              options=option_chains, refine_deadline=refine_deadline)
        except RotorTimeout as e:
            if result is not None:
                return result
            return MethodResult(actions=None, status=PlanStatus.timeout, backend="rotor-dp",
                                notes=list(problem.notes) + [str(e)])
        if sol.ops is None:
            return result or _no_plan(
                problem,
                "rotor-dp",
                sol.smallest_feasible_bytes,
                f"no chain schedule within {request.budget_bytes} bytes; the least-memory one "
                f"peaks at {sol.smallest_feasible_bytes} bytes",
            )
        disc = sol.discretisation
        extra: dict[str, Any] = {
            "rotor": {
                "slots": disc.available_slots if disc else None,
                "slot_bytes": disc.slot_bytes if disc else None,
                "exact_slots": disc.exact if disc else None,
                "dp_seconds": round(sol.solve_seconds, 4),
                "dp_cost": sol.dp_cost,
            }
        }
        solved = problem
        if variants:
            from planner.solvers.chain.rotor import combined
            from planner.solvers.chain.saving import combined_layout

            picks = sol.stage_options
            levels = [0.0, *(option.level for option in variants)]
            # per stage, the share of its droppable saved bytes its F_all drops
            extra["rotor_saving_levels"] = [levels[o] for o in picks]
            solved = replace(problem, chain=combined(problem.chain, option_chains, picks),
                             layout=combined_layout(
                                 problem.layout, [option.layout for option in variants], picks))
        result = plan_result(request, solved, sol.ops, "rotor-dp", extra)
        if result.actions is None:
            return result
        try:
            peak = simulate(request.graph, result.actions).peak_bytes
        except PlanError:
            return result  # solve() reports the simulator's error
        if peak <= request.budget_bytes:
            return result
        budget -= peak - request.budget_bytes
    assert result is not None
    return result


def revolve(request: SolveRequest) -> MethodResult:
    from planner.solvers.chain.revolve import solve_revolve

    problem = chain_problem(request.graph)
    sol = solve_revolve(problem.chain, request.budget_bytes)
    if sol.ops is None:
        return _no_plan(
            problem,
            "revolve",
            sol.smallest_feasible_bytes,
            f"no binomial schedule within {request.budget_bytes} bytes",
        )
    return plan_result(request, problem, sol.ops, "revolve", {"revolve": {"slots": sol.slots}})


def chain_chen_sqrt(request: SolveRequest) -> MethodResult:
    from planner.solvers.chain.sequence import chen_sqrt_ops

    problem = chain_problem(request.graph)
    ops = chen_sqrt_ops(problem.chain.length)
    return plan_result(request, problem, ops, "chain-chen-sqrt")


SPECS: tuple[MethodSpec, ...] = (
    MethodSpec(name="rotor", run=rotor, options=RotorOptions,
               summary="Rotor's dynamic programme on the graph's chain (its chain.json, or a "
               "linearisation)"),
    MethodSpec(name="revolve", run=revolve,
               summary="Griewank's binomial checkpointing (Revolve) on the graph's chain"),
    MethodSpec(name="chain-chen-sqrt", run=chain_chen_sqrt,
               summary="Chen's sqrt(n) checkpoints on the graph's chain"),
)
