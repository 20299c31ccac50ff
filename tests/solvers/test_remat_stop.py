"""Ending CP-SAT searches from another thread (auto's HiGHS race stops them on a proof)."""

from __future__ import annotations

import threading
import time

from planner.core.synthetic import training_graph
from planner.sim.simulator import simulate
from planner.solvers.baselines import store_all_peak_bytes
from planner.solvers.remat.dtr import best_dtr
from planner.solvers.remat.exact import solve_milp
from planner.solvers.remat.intervals import solve_intervals
from planner.solvers.remat.problem import problem_from_graph
from planner.solvers.remat.stop import SearchStop, StallWatch


def _hard_problem():  # type: ignore[no-untyped-def]
    g = training_graph(40, skip=3, seed=3)
    return g, problem_from_graph(g, int(0.6 * store_all_peak_bytes(g)))


def test_a_stopped_search_returns_its_hint_at_once() -> None:
    g, problem = _hard_problem()
    hint = best_dtr(problem)
    assert hint is not None
    stop = SearchStop()
    stop.stop()
    started = time.perf_counter()
    r = solve_intervals(problem, max_computations=2, time_limit_s=60, threads=1, hint=hint,
                        stop=stop)
    assert time.perf_counter() - started < 30
    assert r.actions is not None and simulate(g, r.actions).peak_bytes <= problem.budget_bytes


def test_stop_ends_a_running_search_early() -> None:
    _, problem = _hard_problem()
    for solve in (
        lambda stop: solve_intervals(problem, max_computations=2, time_limit_s=120, threads=1,
                                     stop=stop),
        lambda stop: solve_milp(problem, "cpsat", time_limit_s=120, threads=1, stop=stop),
    ):
        stop = SearchStop()
        timer = threading.Timer(1.0, stop.stop)
        timer.start()
        started = time.perf_counter()
        r = solve(stop)
        timer.cancel()
        # Well under the 120 s limit (generous margins: the machine may be loaded).
        assert time.perf_counter() - started < 60, r
        assert r.status != "optimal" or r.actions is not None


def test_a_highs_solve_in_a_thread_leaves_stdout_alone(capfd) -> None:  # type: ignore[no-untyped-def]
    """auto races the HiGHS MILP in a thread: the rest of the program must keep its stdout
    (a redirect of file descriptor 1 there once swallowed benchmark rows and CLI output)."""
    import os

    _, problem = _hard_problem()
    thread = threading.Thread(
        target=lambda: solve_milp(problem, "highs", time_limit_s=3, threads=1))
    thread.start()
    time.sleep(0.5)
    os.write(1, b"still-here\n")  # the file descriptor itself, as native code writes
    thread.join()
    assert "still-here" in capfd.readouterr().out


class _Recorder:
    """Stands in for a CP-SAT solver: records stop_search calls."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop_search(self) -> None:
        self.stopped.set()


def test_a_child_stop_follows_its_parent_not_the_other_way() -> None:
    parent = SearchStop()
    child = SearchStop(parent=parent)
    solver = _Recorder()
    assert child.register(solver)
    child.stop()  # a phase ends its own search only
    assert solver.stopped.is_set() and not parent.stopped
    second = SearchStop(parent=parent)
    other = _Recorder()
    assert second.register(other)
    parent.stop()  # a proof elsewhere ends every phase
    assert other.stopped.is_set() and second.stopped
    assert SearchStop(parent=parent).stopped  # born after the parent stopped: stopped


def test_stall_watch_stops_a_search_that_no_longer_improves() -> None:
    stop = SearchStop()
    solver = _Recorder()
    assert stop.register(solver)
    heard: list[float | None] = []
    with StallWatch(stop, 0.4, lambda objective, _bound: heard.append(objective)) as watch:
        for cost in (10.0, 9.0, 8.0):  # improvements keep it going
            watch(cost, None)
            time.sleep(0.2)
        assert not stop.stopped
        watch(8.0, 1.0)  # no better objective: the clock keeps running
        assert solver.stopped.wait(5.0)
    assert heard == [10.0, 9.0, 8.0, 8.0]
    idle = SearchStop()
    with StallWatch(idle, float("inf")):
        time.sleep(0.3)
    assert not idle.stopped
