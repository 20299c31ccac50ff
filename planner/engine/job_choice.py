"""The schedule and the micro-batch count chosen with the split (`partition --schedule auto`,
`--global-batch`): each option, a graph traced at one micro-batch size under one schedule, is
planned by the partitioner (`partition_plan`) and judged by the simulator; the fastest step that
fits wins.

With a fixed global batch B, a graph traced at micro-batch size b runs m = B / b micro-batches a
step, so every option does the same work and the step time alone ranks them. Smaller
micro-batches shrink the bubble and each rank's in-flight activations, but each op does less
work for its fixed overhead: the graphs' own costs (one trace per size) say by how much, so no
figure is scaled from another size.

Time (docs/job_choice.md): options are tried most promising first (the work bound with the
schedule's textbook bubble); half the limit is shared by them, and none is started once the
limit has passed; the rest goes to the fastest few whose answer is neither proven nor ruled out
(their partitioner ran out of time), each run again with its share. An option whose lower bound
(the work bound, or the whole-job planner's) reaches the best step cannot win; the choice is
proven fastest over the options when the winner is proven and every other option is ruled out
so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from planner.core.budget import format_bytes
from planner.core.errors import InputError, NoPlanFits
from planner.core.graph import Graph
from planner.core.plan import PlanStatus
from planner.core.resources import Resources
from planner.engine.job_options import (
    AUTO_SCHEDULES,
    JobOption,
    estimated_step_ms,
    job_options,
    work_bound_ms,
)
from planner.engine.partition import PartitionReport, partition_plan
from planner.solvers.pipeline.problem import PipelineProblem

FIRST_ROUND_SHARE = 0.5  # of the time limit, shared by every option
FINALISTS = 3  # options run again with the time left
USED_TIME_SHARE = 0.8  # a run that used less of its time finished: more would not change it
MIN_OPTION_S = 0.1  # each option's least time (a solver given none may answer nothing)
# The default limit, per option: a 48-block GPT's whole-job plan needs about 1 s for its first
# answer on 2 cores (benchmarks/job_choice.py), so a tenth of that per option would overrun.
DEFAULT_S_PER_OPTION = 2.0


@dataclass(frozen=True)
class OptionResult:
    option: JobOption
    report: PartitionReport | None  # None: refused or nothing fits (see note)
    solve_seconds: float
    note: str = ""
    runs: int = 1
    least_bytes: int | None = None  # when nothing fits: the least device memory it needs
    work_bound_ms: float | None = None  # m x the step's compute / P: no plan's step is less
    error: InputError | None = None  # why this option cannot run at all

    @property
    def fits(self) -> bool:
        return self.report is not None and self.report.fits

    @property
    def step_ms(self) -> float | None:
        return self.report.makespan_ms if self.report is not None else None

    @property
    def proven(self) -> bool:
        return self.fits and self.report is not None and \
            self.report.plan.status == PlanStatus.optimal

    @property
    def lower_bound_ms(self) -> float | None:
        """The least step any plan of this option can have: the work bound, or the whole-job
        planner's (the other partitioners' bounds are on a proxy objective)."""
        bounds = [self.work_bound_ms]
        if self.report is not None and self.report.plan.method == "whole":
            bounds.append(self.report.plan.lower_bound)
        known = [b for b in bounds if b is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class JobChoice:
    best: OptionResult  # fits
    results: list[OptionResult] = field(default_factory=list)  # every option, tried order
    proven: bool = False  # best is the fastest plan of every option, proven
    wall_seconds: float = 0.0

    @property
    def report(self) -> PartitionReport:
        assert self.best.report is not None
        return self.best.report


def _ranks(kwargs: Mapping[str, object]) -> int | None:
    devices = kwargs.get("devices")
    resources = kwargs.get("resources")
    if isinstance(devices, int) and devices >= 1:
        return devices
    if isinstance(resources, Resources) and devices is None:
        return resources.device_count
    return None  # partition_plan says what is wrong


def _run(option: JobOption, graph: Graph, time_limit_s: float, kwargs: dict,
         problems: dict[tuple[object, ...], PipelineProblem] | None = None) -> OptionResult:
    start = time.perf_counter()
    try:
        report = partition_plan(graph, microbatches=option.microbatches,
                                schedule=option.schedule, time_limit_s=time_limit_s,
                                problems=problems, **kwargs)
    except NoPlanFits as e:
        least = e.smallest_feasible_bytes
        return OptionResult(option, None, time.perf_counter() - start,
                            f"nothing fits (least {format_bytes(least)})" if least else
                            "nothing fits", least_bytes=least)
    except InputError as e:  # this schedule and count cannot run here (e.g. interleaved's m)
        return OptionResult(option, None, 0.0, f"not possible: {e}", error=e)
    note = "" if report.fits else "overflows"
    return OptionResult(option, report, time.perf_counter() - start, note)


def _better(a: OptionResult, b: OptionResult) -> OptionResult:
    """The faster of two runs of one option (a fitting plan over none), counting both runs."""
    b_wins = b.fits and (not a.fits or (b.step_ms or 0.0) < (a.step_ms or 0.0) - 1e-9
                         or b.proven)
    return replace(b if b_wins else a, runs=a.runs + 1,
                   solve_seconds=a.solve_seconds + b.solve_seconds)


def _fastest(results: Sequence[OptionResult]) -> OptionResult | None:
    fitting = [r for r in results if r.fits]
    return min(fitting, key=lambda r: r.step_ms or 0.0) if fitting else None


def ruled_out(result: OptionResult, best_ms: float) -> bool:
    """No plan of this option is faster than `best_ms`: proven at least as slow, or its lower
    bound on the step says so."""
    bound = result.lower_bound_ms
    return (result.proven and (result.step_ms or 0.0) >= best_ms - 1e-9) or \
        (bound is not None and bound >= best_ms - 1e-9)


def proven_fastest(best: OptionResult, results: Sequence[OptionResult]) -> bool:
    """`best` is proven and every other option is ruled out (options that cannot run at all,
    e.g. an interleaved schedule the count cannot divide, have no plan to rule out)."""
    if not best.proven:
        return False
    step = best.step_ms or 0.0
    return all(r.option == best.option or r.error is not None or ruled_out(r, step)
               for r in results)


def _finalists(results: Sequence[OptionResult], time_limits: Sequence[float]
               ) -> list[int]:
    """The fastest few options (index) whose answer more time may improve: they fit, are not
    proven, not ruled out by the best, and used most of their time."""
    best = _fastest(results)
    if best is None:
        return []
    step = best.step_ms or 0.0
    open_ = [k for k, r in enumerate(results)
             if r.fits and not r.proven and not (r is not best and ruled_out(r, step))
             and r.solve_seconds >= USED_TIME_SHARE * time_limits[k]]
    return sorted(open_, key=lambda k: results[k].step_ms or 0.0)[:FINALISTS]


def choose_job(
    graphs: Sequence[tuple[str, Graph]],
    *,
    global_batch: int | None = None,
    microbatches: int | None = None,
    schedules: Sequence[str] = AUTO_SCHEDULES,
    time_limit_s: float | None = None,
    **kwargs: object,
) -> JobChoice:
    """Plan every option with `partition_plan(**kwargs)` (method, devices, device memory, ...)
    in `time_limit_s` overall (default DEFAULT_S_PER_OPTION an option); the fastest fitting
    step. NoPlanFits (with the least memory any option needs) when no option fits; InputError
    for a request no option can run."""
    start = time.perf_counter()
    options, notes = job_options(graphs, global_batch=global_batch, microbatches=microbatches,
                                 schedules=schedules)
    limit_s = DEFAULT_S_PER_OPTION * len(options) if time_limit_s is None else time_limit_s
    ranks = _ranks(kwargs)
    work = [work_bound_ms(graphs[o.graph_index][1], o.microbatches, ranks) if ranks else None
            for o in options]

    # each option's problem: a second-round run goes on from its first run's search caches
    problems: dict[tuple[object, ...], PipelineProblem] = {}

    def run(k: int, seconds: float) -> OptionResult:
        o = options[k]
        return replace(_run(o, graphs[o.graph_index][1], seconds, kwargs, problems),
                       work_bound_ms=work[k])

    chunks = kwargs.get("chunks", 2)
    guess = [estimated_step_ms(o, work[k] or 0.0, ranks or 1,
                               chunks if isinstance(chunks, int) else 2)
             for k, o in enumerate(options)]
    order = sorted(range(len(options)), key=lambda k: guess[k])  # the most promising first
    results, limits = _first_round(options, order, work, run, start, limit_s)
    finalists = _finalists(results, limits)
    for n, k in enumerate(finalists):
        left = limit_s - (time.perf_counter() - start)
        if left <= 0:
            break
        results[k] = _better(results[k], run(k, left / (len(finalists) - n)))
    best = _fastest(results)
    if best is None:
        _raise_none_fits(results)
    assert best is not None
    return _chosen(best, results, options, notes, start)


def _first_round(options: Sequence[JobOption], order: Sequence[int],
                 work: Sequence[float | None], run: Callable[[int, float], OptionResult],
                 start: float, limit_s: float) -> tuple[list[OptionResult], list[float]]:
    """Every option in `order`, each with the first round's time left over the options left,
    unless ruled out by its work bound or started past the limit; (results, time given)."""
    results = [OptionResult(o, None, 0.0, "not run") for o in options]
    limits = [0.0] * len(options)
    first_round_end = start + FIRST_ROUND_SHARE * limit_s
    for n, k in enumerate(order):
        best, bound = _fastest(results), work[k]
        if best is not None and bound is not None and bound >= (best.step_ms or 0.0) - 1e-9:
            results[k] = OptionResult(options[k], None, 0.0, "ruled out: its compute alone, "
                                      f"spread evenly, takes {bound:.4g} ms", work_bound_ms=bound)
        elif n and time.perf_counter() - start >= limit_s:
            results[k] = replace(results[k], note="not run (time limit)", work_bound_ms=bound)
        else:
            left = first_round_end - time.perf_counter()
            limits[k] = max(MIN_OPTION_S, left / (len(order) - n))
            results[k] = run(k, limits[k])
    return results, limits


def _chosen(best: OptionResult, results: Sequence[OptionResult], options: Sequence[JobOption],
            notes: Sequence[str], start: float) -> JobChoice:
    """The choice, its plan noting it: every option's row in details.choice."""
    report = best.report
    assert report is not None
    proven = proven_fastest(best, results)
    text = (f"chosen over {len(results)} options ({_summary(options)}): the fastest simulated "
            "step " + ("proven over every option" if proven else "found (not proven over "
                                                               "every option)"))
    report = replace(report, notes=[*report.notes, text, *notes])
    plan = report.plan
    details = {**plan.details, "choice": [_row(r) for r in results], "choice_proven": proven}
    plan = plan.model_copy(update={"notes": [*plan.notes, text, *notes], "details": details})
    best = replace(best, report=replace(report, plan=plan))
    return JobChoice(best, [best if r.option == best.option else r for r in results], proven,
                     time.perf_counter() - start)


def _summary(options: Sequence[JobOption]) -> str:
    schedules = list(dict.fromkeys(o.schedule for o in options))
    counts = list(dict.fromkeys(o.microbatches for o in options))
    return f"schedules {', '.join(schedules)}; micro-batch counts {', '.join(map(str, counts))}"


def _row(r: OptionResult) -> dict[str, object]:
    o = r.option
    return {"graph": o.graph_label, "micro_batch_size": o.micro_batch_size,
            "microbatches": o.microbatches, "schedule": o.schedule, "fits": r.fits,
            "step_ms": r.step_ms, "proven": r.proven, "lower_bound_ms": r.lower_bound_ms,
            "solve_seconds": round(r.solve_seconds, 3), "runs": r.runs, "note": r.note}


def _raise_none_fits(results: Sequence[OptionResult]) -> None:
    """NoPlanFits naming what each option lacks and the least memory any option needs; an
    InputError when no option can run at all."""
    tried = [r for r in results if r.error is None]
    if not tried:  # the first option's reason (the request's, when every option has it)
        assert results[0].error is not None
        raise results[0].error
    notes = "; ".join(f"{r.option.text()}: {r.note or 'overflows'}" for r in tried[:4])
    more = f" (and {len(tried) - 4} more)" if len(tried) > 4 else ""
    least = [r.least_bytes for r in tried if r.least_bytes]
    raise NoPlanFits(f"no option fits: {notes}{more}", min(least) if least else None)
