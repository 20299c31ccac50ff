"""Time limits that hold for every method, built-in or plugin: the answer comes within the limit
plus `ANSWER_MARGIN_S`.

`planner.engine.solve` runs the method in a worker thread and, while it runs, builds a fallback
from the baselines whose plans are linear in the graph (store-all, Chen's sqrt(n); Chen's greedy
segmentation when neither fits and time is left; then recompute-all while its plan stays under
`FALLBACK_QUADRATIC_MAX_ACTIONS`). The method's own answer is awaited until the time limit plus
`METHOD_GRACE_S`; a method still running then is abandoned (it finishes in the
background; a service worker process exits with the answer) and the fallback is the answer: its
plan when it fits the budget (judged like any plan, with a note), else status timeout with the
least peak a baseline reached as the smallest feasible budget known.

The margin: `METHOD_GRACE_S` for a method that stops at its limit and then builds its answer,
the rest for judging the plan (one simulation and the bound check, linear in the graph). Up to
20,000 nodes the answer comes within `ANSWER_MARGIN_S` of the limit (benchmarks/scale_steps.py,
docs/scale_steps.md).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.core.graph import Graph
from planner.core.plan import Action
from planner.sim.simulator import SimulationAbandoned, SimulationResult, simulate
from planner.solvers.baselines import (
    ScheduleAbandoned,
    bounded_baselines,
    chen_greedy,
    chen_sqrt,
    recompute_all,
    store_all,
)

__all__ = [
    "ANSWER_MARGIN_S", "METHOD_GRACE_S", "ClosableProgress", "Fallback", "LeastBaseline",
    "MethodAbandoned", "MethodRun", "abandoned_methods", "fallback_plan", "least_baseline",
]

ANSWER_MARGIN_S = 2.0  # documented: a solve answers within time_limit_s + this (≤ 20k nodes)
METHOD_GRACE_S = 1.0  # a method's own answer is still awaited this long after its limit
STOP_POLL_S = 0.05  # how often a wait looks at its stop event (a service's fair time)
# recompute-all joins the fallback up to this plan length (~0.1 s to build; it holds the GIL
# against the method, so not the 2 M actions the reference baselines allow)
FALLBACK_QUADRATIC_MAX_ACTIONS = 200_000


@dataclass(frozen=True)
class Fallback:
    """The best linear baseline plan: fits the budget when `fits`, else the least peak found."""

    name: str  # baseline name, e.g. "store-all"
    actions: list[Action]
    simulation: SimulationResult
    fits: bool
    seconds: float  # time spent building it


def fallback_plan(
    graph: Graph,
    budget_bytes: int,
    deadline: float,
    wanted: Callable[[], bool] = lambda: True,
) -> Fallback | None:
    """The cheapest plan within the budget among store-all and Chen's sqrt(n) (then Chen's
    greedy segmentation and recompute-all, each only when none fits yet), else the one with
    the least peak; None when not even one was finished by `deadline` (a time.perf_counter()
    value). No further baseline is started once `wanted()` is false (the method answered)."""
    started = time.perf_counter()
    best: tuple[tuple[int, float, int], str, list[Action], SimulationResult] | None = None

    def offer(name: str, make: Callable[[], list[Action]]) -> None:
        nonlocal best
        if time.perf_counter() > deadline or not wanted():
            return
        try:
            actions = make()
            sim = simulate(graph, actions, deadline=deadline)
        except (ScheduleAbandoned, SimulationAbandoned):
            return
        fits = sim.peak_bytes <= budget_bytes
        key = (0, sim.compute_cost, sim.peak_bytes) if fits else (1, sim.peak_bytes, 0)
        if best is None or key < best[0]:
            best = (key, name, actions, sim)

    offer("store-all", lambda: store_all(graph, deadline=deadline))
    if best is not None and best[0][0] == 0:  # store-all fits: no plan is cheaper
        return _fallback(best, started)
    offer("chen-sqrt", lambda: chen_sqrt(graph, deadline=deadline))
    if best is None or best[0][0] == 1:
        offer("chen-greedy", lambda: chen_greedy(graph, budget_bytes, deadline=deadline))
    if best is None or best[0][0] == 1:
        # the least peak of all baselines, while its plan stays short (a 4-layer GPT at 0.6:
        # the only one that fits, where the fallback answered with no plan)
        offer("recompute-all", lambda: recompute_all(
            graph, max_actions=FALLBACK_QUADRATIC_MAX_ACTIONS, deadline=deadline))
    return None if best is None else _fallback(best, started)


def _fallback(
    best: tuple[tuple[int, float, int], str, list[Action], SimulationResult], started: float
) -> Fallback:
    key, name, actions, sim = best
    return Fallback(name, actions, sim, key[0] == 0, time.perf_counter() - started)


@dataclass(frozen=True)
class LeastBaseline:
    """The baseline plan with the least peak: a budget known to work."""

    name: str
    actions: list[Action]
    peak_bytes: int


def least_baseline(graph: Graph, deadline: float | None = None) -> LeastBaseline | None:
    """The affordable baseline (`planner.solvers.baselines.bounded_baselines`: recompute-all only
    while
    its plan stays small) with the least peak, ties to the first in BASELINES' order; None when
    none was finished by `deadline`."""
    best: LeastBaseline | None = None
    for name, actions in bounded_baselines(graph, None, deadline=deadline):
        peak = simulate(graph, actions).peak_bytes
        if best is None or peak < best.peak_bytes:
            best = LeastBaseline(name, actions, peak)
    held_last = _held_last_store_all(graph, deadline)
    if held_last is not None and (best is None or held_last.peak_bytes < best.peak_bytes):
        best = held_last
    return best


def _held_last_store_all(graph: Graph, deadline: float | None) -> LeastBaseline | None:
    """Store-all with the nodes that hold bytes to the end of the step (weight gradients)
    computed as late as their successors allow (`held_orders`, linear): on a traced GPT-2 its
    peak is 755 MiB where every baseline's is 811 MiB, so an infeasible budget is told a
    smaller budget that works. None without held bytes or past `deadline`."""
    from planner.solvers.order import schedule_order
    from planner.solvers.remat.held_orders import held_last_order
    from planner.solvers.remat.orders import with_order

    order = held_last_order(graph, schedule_order(graph))
    if order is None or (deadline is not None and time.perf_counter() > deadline):
        return None
    try:
        actions = store_all(with_order(graph, order), deadline=deadline)
        peak = simulate(graph, actions, deadline=deadline).peak_bytes
    except (ScheduleAbandoned, SimulationAbandoned):
        return None
    return LeastBaseline("store-all@held-last", actions, peak)


class MethodAbandoned(BaseException):
    """Raised in an abandoned method's thread (a BaseException: `except Exception` in a method
    does not swallow it)."""


class MethodRun:
    """A method's call in a daemon thread: `wait(until)` says whether it answered by then;
    `result()` returns its value or raises its exception."""

    def __init__(self, fn: Callable[[Any], Any], request: Any) -> None:
        self._fn, self._request = fn, request
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="planner-method", daemon=True)

    def start(self) -> MethodRun:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._value = self._fn(self._request)
        except BaseException as e:  # handed to the caller's thread by result()
            self._error = e
        finally:
            self._done.set()

    def wait(self, until: float, stop: threading.Event | None = None) -> bool:
        """Whether the method has answered by `until` (time.perf_counter()); with `stop`,
        the wait also ends (False unless answered) once it is set."""
        if stop is None:
            return self._done.wait(max(0.0, until - time.perf_counter()))
        while True:
            left = until - time.perf_counter()
            if self._done.wait(max(0.0, min(STOP_POLL_S, left))):
                return True
            if stop.is_set() or left <= STOP_POLL_S:
                return self._done.is_set()

    def abandon(self) -> None:
        """Give up on the method: MethodAbandoned is raised in its thread at its next Python
        instruction (a method inside a native call, a solver's search, stops when that call
        returns), so that it stops competing with the answer for the interpreter; counted by
        `abandoned_methods` until its thread ends."""
        with _ABANDONED_LOCK:
            _ABANDONED.append(self)
        ident = self._thread.ident
        if ident is not None and self.running:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(ident), ctypes.py_object(MethodAbandoned))

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def result(self) -> Any:
        assert self._done.is_set()
        if self._error is not None:
            raise self._error
        return self._value


_ABANDONED: list[MethodRun] = []
_ABANDONED_LOCK = threading.Lock()


def abandoned_methods() -> int:
    """Methods given up on by this process that are still running. A program about to exit
    with some may end with os._exit after flushing its output: the interpreter's exit would
    otherwise wait for any non-daemon threads (thread pools) such a method started."""
    with _ABANDONED_LOCK:
        _ABANDONED[:] = [r for r in _ABANDONED if r.running]
        return len(_ABANDONED)


class ClosableProgress:
    """A progress callback that stops passing reports on once closed (an abandoned method's
    thread may keep calling it)."""

    def __init__(self, report: Callable[[float | None, float | None], None]) -> None:
        self._report = report
        self._open = True

    def __call__(self, objective: float | None, bound: float | None) -> None:
        if self._open:
            self._report(objective, bound)

    def close(self) -> None:
        self._open = False
