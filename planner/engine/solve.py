"""solve(): run a method, check its plan with the simulator, and report honestly.

Every plan kind: a pipeline method (its spec's plan kinds are ("pipeline",)) runs the
partition path (planner.engine.pipeline_solve.solve_pipeline: devices, micro-batches and schedule
from `resources`, the budget per device) and returns its pipeline plan; an FSDP method (plan kind
fsdp) chooses one rank's settings, judged by planner.engine.fsdp_solve (the budget per rank); the
rest is below.

Whatever a method claims, the returned Plan's peak and cost are the simulator's, a plan over
budget is never reported as feasible, "optimal" means the gap to a proven bound is closed, and a
claimed bound above the cost of any plan known to fit (`planner.engine.judge`) is an error.

Time limits hold for every method, built-in or plugin (`planner.engine.deadline`): the method
runs in a thread, a fallback from the fast baselines is built while it runs, and a method that
has not answered by its limit plus a grace is abandoned. The answer is then the method's best
plan so far (it offers each better plan to `SolveRequest.incumbent`; `incumbent.py`), or the
fallback only where that is cheaper or the method offered none that fits, and says which. The
answer comes within the limit plus `ANSWER_MARGIN_S` (2 s) up to 20,000 nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.limits import (
    DEFAULT_PIPELINE_TIME_LIMIT_S,
    DEFAULT_TIME_LIMIT_S,
    check_time_limit,
)
from planner.core.plan import (
    Action,
    Plan,
    PlanStatus,
)
from planner.core.resources import Resources
from planner.engine.checked import checked_plan
from planner.engine.deadline import (
    ANSWER_MARGIN_S,
    METHOD_GRACE_S,
    ClosableProgress,
    Fallback,
    MethodRun,
    fallback_plan,
    least_baseline,
)
from planner.engine.incumbent import IncumbentBox, JudgedIncumbent, judged_incumbent
from planner.engine.judge import (
    PLAN_BOOK,
    known_plan,
)
from planner.engine.progress import ProgressFn, monotone_progress
from planner.engine.registry import MethodResult, SolveRequest, load_method, method_spec
from planner.sim.ledger import MemoryLedger
from planner.sim.simulator import (
    SimulationAbandoned,
    lower_bound_peak_bytes,
)

# A method that answers within this is never raced by the fallback's construction (deadline.py).
FALLBACK_AFTER_S = 0.2


def fallback_after_s(time_limit_s: float) -> float:
    """When the fallback is built, counted from the start: building it holds the GIL against
    the method's thread (2.8 s on a 5,000-node graph), so on long limits it waits until a
    quarter of the limit (60 s: 15 s; 20 s: 5 s), leaving far more than it needs (≤ 3 s at
    20,000 nodes); short limits build it at once."""
    return max(FALLBACK_AFTER_S, min(0.5 * time_limit_s - 5.0, 0.25 * time_limit_s))
# Of the answer margin, what is kept for answering with the fallback when the method's plan
# cannot be judged in time (its replay and report, linear in the graph).
JUDGE_RESERVE_S = 1.0
# Kept at the end of the answer margin when the fallback is built after the method's grace.
FALLBACK_SLACK_S = 0.3


def solve(
    graph: Graph,
    budget_bytes: int,
    method: str = "auto",
    *,
    time_limit_s: float | None = None,
    threads: int = 2,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    resources: Resources | None = None,
    known_plans: Iterable[tuple[str, Sequence[Action]]] = (),
    stop: threading.Event | None = None,
) -> Plan:
    """Plan `graph` within `budget_bytes` of device memory with `method`; `resources` (the
    machine: links, host memory) travel with the plan and its simulation. `stop`, once set,
    ends the solve early as an overrun does: the method's best plan so far answers (a
    service sharing its workers with another tenant).

    `progress(best_objective, best_bound)` is called as the method's incumbent or bound
    improves (objective non-increasing, bound non-decreasing, bound ≤ objective; the bound is
    at least every node computed once). `known_plans` ((source, actions), e.g. a sweep's plans
    at smaller budgets) join the plans a claimed bound is checked against. Without
    `time_limit_s`, the default of the method's plan kind (planner.core.limits)."""
    if budget_bytes < 0:
        raise InputError(f"budget {budget_bytes}: must be ≥ 0 bytes")
    if time_limit_s is None:
        spec = method_spec(method)
        pipeline = spec is not None and spec.pipeline
        time_limit_s = DEFAULT_PIPELINE_TIME_LIMIT_S if pipeline else DEFAULT_TIME_LIMIT_S
    time_limit_s = check_time_limit(time_limit_s, "time_limit")
    if (spec := method_spec(method)) is not None and spec.pipeline:
        return _pipeline_plan(graph, budget_bytes, method, time_limit_s, threads, options,
                              resources)
    if spec is not None and spec.fsdp:  # one FSDP2 rank's settings (planner.engine.fsdp_solve)
        from planner.engine.fsdp_solve import solve_fsdp_plan

        return solve_fsdp_plan(graph, budget_bytes, method, time_limit_s=time_limit_s,
                               threads=threads, seed=seed, options=options, resources=resources)
    fn = load_method(method)
    started = time.perf_counter()
    proven = _proven_infeasible(graph, budget_bytes, method, started, time_limit_s, resources)
    if proven is not None:
        return proven
    reporter = monotone_progress(progress, graph.total_compute_ms)
    gate = None if reporter is None else ClosableProgress(reporter)
    box = IncumbentBox(started)
    request = SolveRequest(
        graph=graph,
        budget_bytes=budget_bytes,
        time_limit_s=time_limit_s,
        threads=threads,
        seed=seed,
        options=dict(options or {}),
        progress=gate,
        incumbent=box.offer,
        resources=resources,
    )
    _warm_caches(graph)  # built once here, not raced by the method's thread and the fallback's
    run = MethodRun(fn, request).start()
    limit_at = started + time_limit_s
    fallback: Fallback | None = None
    if not run.wait(min(limit_at, started + fallback_after_s(time_limit_s)), stop) and not (
            stop is not None and stop.is_set()):
        # A method still running: build the answer for the case it overruns (deadline.py).
        try:
            fallback = fallback_plan(graph, budget_bytes, limit_at, lambda: run.running)
        except Exception:  # a fault here must not cost the method's own answer
            fallback = None
    if not run.wait(limit_at + METHOD_GRACE_S, stop):
        run.abandon()
        if gate is not None:
            gate.close()
        why = _stopped_why(method, stop, started, time_limit_s)
        # Half of what is left of the margin replays the method's best plan so far; the
        # rest stays for the fallback, should that plan not fit.
        now = time.perf_counter()
        answer_by = min(limit_at, now) + ANSWER_MARGIN_S - FALLBACK_SLACK_S
        kept = judged_incumbent(graph, budget_bytes, box.close(), resources,
                                now + (answer_by - now) / 2)
        if _better_than_fallback(kept, fallback):
            assert kept is not None
            return _incumbent_answer(graph, budget_bytes, method, time_limit_s, kept, started,
                                     resources, reporter, why, overran=not why)
        if fallback is None or not fallback.fits:
            # Not built while the method ran (a loaded machine, a short limit, a stop): there
            # is no method plan to judge, so the rest of the answer margin is the fallback's.
            fallback = _better_fallback(fallback, graph, budget_bytes, answer_by)
        return _overrun_answer(graph, budget_bytes, method, time_limit_s, fallback, started,
                               resources, reporter, why, overran=not why)
    return _answer(graph, budget_bytes, method, time_limit_s, run, fallback, started,
                   resources, reporter, known_plans, box)


def _proven_infeasible(graph: Graph, budget_bytes: int, method: str, started: float,
                       time_limit_s: float, resources: Resources | None) -> Plan | None:
    """The answer without solving when some node's inputs, output and workspace alone exceed
    the budget; None otherwise."""
    floor_bytes = lower_bound_peak_bytes(graph)
    if budget_bytes >= floor_bytes:
        return None
    proof = MethodResult(
        actions=None,
        status=PlanStatus.infeasible,
        backend="proof",
        notes=[
            f"proven infeasible: computing {_floor_node(graph)} needs {floor_bytes} bytes (its "
            "inputs, output, workspace, the fixed memory and what the nodes before it hold to "
            f"the end of the step, such as weight gradients), more than the budget of "
            f"{budget_bytes}"
        ],
        details={"budget_lower_bound_bytes": floor_bytes},
        smallest_feasible_bytes=smallest_baseline_peak_bytes(graph, started + time_limit_s),
    )
    return checked_plan(
        graph, budget_bytes, method, proof, time.perf_counter() - started, resources
    )


def _floor_node(graph: Graph) -> str:
    """Where the peak lower bound is met, for the note: 'node 366 (add_40)'."""
    from planner.sim.lower_bound import peak_lower_bound_node

    v = peak_lower_bound_node(graph)
    if v is None:
        return "some node"
    return f"node {v} ({graph.index.node(v).name})"


def _answer(graph: Graph, budget_bytes: int, method: str, time_limit_s: float, run: MethodRun,
            fallback: Fallback | None, started: float, resources: Resources | None,
            reporter: ProgressFn | None,
            known_plans: Iterable[tuple[str, Sequence[Action]]], box: IncumbentBox) -> Plan:
    """The answer from a method that finished in time: its plan judged by the simulator, or
    the fallback's where it has none, ran out of memory, or cannot be judged in time."""
    judged_by = started + time_limit_s + ANSWER_MARGIN_S - JUDGE_RESERVE_S
    try:
        result = run.result()
    except MemoryError:  # a model too large for this machine: its best plan so far, or the
        kept = judged_incumbent(graph, budget_bytes, box.close(), resources, judged_by)
        if kept is not None and kept.fits:  # fast baselines' where it had none
            return _incumbent_answer(graph, budget_bytes, method, time_limit_s, kept, started,
                                     resources, reporter, f"method {method} ran out of memory",
                                     overran=False)
        if fallback is None:
            fallback = fallback_plan(graph, budget_bytes, judged_by)
        return _overrun_answer(graph, budget_bytes, method, time_limit_s, fallback, started,
                               resources, reporter, f"method {method} ran out of memory",
                               overran=False)
    if result.actions is None and result.status is PlanStatus.timeout:
        # Out of time without a plan: the best plan so far is the fast baselines' when it fits.
        if fallback is None:
            fallback = fallback_plan(graph, budget_bytes, judged_by)
        if fallback is not None and fallback.fits:
            why = (f"method {method} found no plan within the budget in its time limit of "
                   f"{time_limit_s:g} s (status timeout{_first_note(result)})")
            return _overrun_answer(graph, budget_bytes, method, time_limit_s, fallback, started,
                                   resources, reporter, why, overran=False)
    wall = time.perf_counter() - started
    witnesses = [k for source, actions in known_plans
                 if (k := known_plan(graph, source, actions)) is not None]
    # Judging is linear in the plan, which may be far longer than the graph: one that cannot
    # be replayed within the margin is answered for by the fallback too.
    try:
        plan = checked_plan(graph, budget_bytes, method, result, wall, resources, witnesses,
                            deadline=judged_by)
    except SimulationAbandoned:
        if fallback is None:
            fallback = fallback_plan(graph, budget_bytes, judged_by)
        why = (f"the plan of method {method} ({len(result.actions or ())} actions) could not "
               f"be replayed within its time limit of {time_limit_s:g} s (+{ANSWER_MARGIN_S:g} "
               "s margin)")
        return _overrun_answer(graph, budget_bytes, method, time_limit_s, fallback, started,
                               resources, reporter, why)
    if plan.status in (PlanStatus.optimal, PlanStatus.feasible) and plan.actions:
        mine = known_plan(graph, f"{method}/{plan.backend}", plan.actions, judged_by)
        if mine is not None:
            PLAN_BOOK.add(plan.graph_hash, mine)
        if reporter is not None:  # the simulator's cost, the judged bound
            reporter(plan.objective, plan.lower_bound)
    return plan


def _pipeline_plan(graph: Graph, budget_bytes: int, method: str, time_limit_s: float,
                   threads: int, options: dict[str, Any] | None,
                   resources: Resources | None) -> Plan:
    """A pipeline method's plan (planner.engine.partition; imported here, when asked for)."""
    from planner.engine.pipeline_solve import solve_pipeline

    return solve_pipeline(graph, budget_bytes, method, time_limit_s=time_limit_s,
                          threads=threads, options=options, resources=resources)


def _first_note(result: MethodResult) -> str:
    return f": {result.notes[0]}" if result.notes else ""


def _warm_caches(graph: Graph) -> None:
    """The graph's derived views every method and the fallback read (linear in the graph)."""
    index = graph.index
    graph.content_hash()
    for view in ("topological_order", "order_predecessors", "outputs", "storage_bytes",
                 "model_state_resident", "loss_nodes", "control_predecessors"):
        getattr(index, view)
    MemoryLedger.of(graph)  # once here, not once per thread that asks for it


def _better_fallback(known: Fallback | None, graph: Graph, budget_bytes: int,
                     deadline: float) -> Fallback | None:
    try:
        again = fallback_plan(graph, budget_bytes, deadline)
    except Exception:  # a fault here must not cost the answer
        return known
    if again is None or (known is not None and not again.fits):
        return known
    return again


def _stopped_why(method: str, stop: threading.Event | None, started: float,
                 time_limit_s: float) -> str:
    """The note of a solve ended by `stop` before its limit; "" for an overrun."""
    if stop is None or not stop.is_set():
        return ""
    return (f"method {method} was stopped after {time.perf_counter() - started:.1f} s of its "
            f"{time_limit_s:g} s limit (the service shares its workers with a waiting tenant)")


def _better_than_fallback(kept: JudgedIncumbent | None, fallback: Fallback | None) -> bool:
    """Whether the method's best plan so far answers rather than the fallback: it fits, and no
    fitting fallback is cheaper (a fallback that fits is at least store-all's cost or a
    baseline's, rarely below an incumbent; then the cheaper plan answers)."""
    if kept is None or not kept.fits:
        return False
    return (fallback is None or not fallback.fits
            or kept.simulation.compute_cost <= fallback.simulation.compute_cost)


def _overran_why(method: str, time_limit_s: float) -> str:
    return (f"method {method} did not answer within its time limit of {time_limit_s:g} s "
            f"(+{METHOD_GRACE_S:g} s grace); it was abandoned")


def _reported(plan: Plan, reporter: ProgressFn | None) -> Plan:
    """`plan`, its cost and bound told to the listener first."""
    if reporter is not None and plan.objective is not None:
        reporter(plan.objective, plan.lower_bound)
    return plan


def _incumbent_answer(
    graph: Graph,
    budget_bytes: int,
    method: str,
    time_limit_s: float,
    kept: JudgedIncumbent,
    started: float,
    resources: Resources | None,
    reporter: ProgressFn | None,
    why: str = "",
    *,
    overran: bool = True,
) -> Plan:
    """The answer when the method did not answer in time but had offered plans: the best of
    them, judged like any plan, with the bound the method gave for it."""
    why = why or _overran_why(method, time_limit_s)
    found = kept.incumbent
    result = MethodResult(
        actions=list(found.actions),
        status=PlanStatus.feasible,
        backend=f"{method}:{found.source}",
        lower_bound=found.lower_bound_ms,
        notes=[f"{why}: this is its best plan so far, found {found.found_after_s:.2f} s into "
               "the solve (the anytime answer)"],
        details={"method_overran": overran, "fallback": False, "incumbent": True,
                 "incumbent_found_s": round(found.found_after_s, 3)},
    )
    plan = checked_plan(graph, budget_bytes, method, result, time.perf_counter() - started,
                        resources, simulated=kept.simulation)
    return _reported(plan, reporter)


def _overrun_answer(
    graph: Graph,
    budget_bytes: int,
    method: str,
    time_limit_s: float,
    fallback: Fallback | None,
    started: float,
    resources: Resources | None,
    reporter: ProgressFn | None,
    why: str = "",
    *,
    overran: bool = True,
) -> Plan:
    """The answer when the method has not answered by its limit plus METHOD_GRACE_S (or its
    plan cannot be judged in time): the fallback's plan when it fits the budget, else status
    timeout (see deadline.py)."""
    why = why or _overran_why(method, time_limit_s)
    details: dict[str, Any] = {"method_overran": overran, "fallback": True}
    if fallback is not None and fallback.fits:
        result = MethodResult(
            actions=fallback.actions,
            status=PlanStatus.feasible,
            backend=f"fallback:baseline:{fallback.name}",
            notes=[f"{why}: this is the {fallback.name} baseline plan, the best of the fast "
                   f"baselines, built in {fallback.seconds:.2f} s while it ran"],
            details=details,
        )
    else:
        tried = ("no fast baseline plan was finished in time either" if fallback is None else
                 f"the best fast baseline ({fallback.name}) peaks at "
                 f"{fallback.simulation.peak_bytes} bytes, over the budget")
        result = MethodResult(
            actions=None,
            status=PlanStatus.timeout,
            backend="fallback",
            notes=[f"{why}; {tried}"],
            details=details,
            smallest_feasible_bytes=None if fallback is None else fallback.simulation.peak_bytes,
        )
    # Its replay (compute/free only: the same with any resources) is done already.
    simulated = fallback.simulation if fallback is not None else None
    plan = checked_plan(graph, budget_bytes, method, result, time.perf_counter() - started,
                        resources, simulated=simulated)
    return _reported(plan, reporter)


def smallest_baseline_peak_bytes(graph: Graph, deadline: float | None = None) -> int | None:
    """The least peak any affordable baseline reaches (`deadline.least_baseline`): a budget
    known to work; None when none finished by `deadline`."""
    least = least_baseline(graph, deadline)
    return None if least is None else least.peak_bytes
