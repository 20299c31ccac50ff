"""How well a traced graph predicts a real training step: memory and time ratios.

Memory: the simulator's peak for store-all with graph outputs (loss, gradients) kept to the end
of the step, minus fixed memory, against the live storage the project measures in a real eager
step (saved tensors, live outputs, gradients as they appear). Time: the graph's total cost
against a measured eager step. Ratios are traced / measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.core.graph import Graph
from planner.core.plan import Action, compute, free


def store_all_keeping_outputs(graph: Graph) -> list[Action]:
    """Reference order; each value freed after its last consumer, outputs kept to the end."""
    index = graph.index
    order = index.topological_order
    pos = {v: i for i, v in enumerate(order)}
    outputs = set(index.outputs)
    last = {v: max((pos[w] for w in index.successors[v]), default=pos[v]) for v in order}
    frees_at: dict[int, list[int]] = {}
    for v in order:
        if v not in outputs:
            frees_at.setdefault(last[v], []).append(v)
    actions: list[Action] = []
    for i, v in enumerate(order):
        actions.append(compute(v))
        actions.extend(free(u) for u in frees_at.get(i, []))
    actions.extend(free(v) for v in order if v in outputs)
    return actions


def simulated_step_bytes(graph: Graph) -> int:
    """Store-all peak of the step's own allocations (fixed memory left out)."""
    from planner.sim.simulator import simulate

    return simulate(graph, store_all_keeping_outputs(graph)).peak_bytes - graph.fixed_bytes


@dataclass(frozen=True)
class Fidelity:
    model: str
    nodes: int
    simulated_bytes: int
    measured_bytes: int
    graph_ms: float | None = None
    measured_step_ms: float | None = None

    @property
    def memory_ratio(self) -> float:
        return self.simulated_bytes / self.measured_bytes if self.measured_bytes else float("nan")

    @property
    def time_ratio(self) -> float | None:
        if self.graph_ms is None or not self.measured_step_ms:
            return None
        return self.graph_ms / self.measured_step_ms


def check_fidelity(
    name: str, model: Any, inputs: tuple[Any, ...], graph: Graph, loss_fn: Any = None,
    *, time_it: bool = True, repeats: int = 5, clock: str = "wall",
) -> Fidelity:
    """Measure a real step of `model` and compare it with `graph` (traced from it)."""
    from planner.tracing.costs import real_step_ms
    from planner.tracing.memory import measure_training_step

    measured = measure_training_step(model, inputs, loss_fn).peak_bytes
    step_ms = None
    if time_it:
        step_ms = real_step_ms(model, inputs, loss_fn, repeats=repeats, clock=clock)
    return Fidelity(
        model=name,
        nodes=len(graph.nodes),
        simulated_bytes=simulated_step_bytes(graph),
        measured_bytes=measured,
        graph_ms=graph.total_compute_ms if time_it else None,
        measured_step_ms=step_ms,
    )


def interleaved_times(
    result: Any, model: Any, inputs: tuple[Any, ...], loss_fn: Any = None,
    *, repeats: int = 5, warmup: int = 1, clock: str = "wall",
) -> tuple[float, float]:
    """(median op-by-op joint graph ms, median eager step ms), runs alternating so that both
    see the same machine load; the graph figure is the sum of per-node costs as traced."""
    import statistics

    from planner.tracing.costs import joint_arguments, measure_fx_ms, real_step_ms

    if result.capture is None:
        raise ValueError("interleaved timing needs an op-level trace")
    args = joint_arguments(result.capture, model, inputs)
    graph_ms: list[float] = []
    step_ms: list[float] = []
    for i in range(warmup + repeats):
        g = sum(measure_fx_ms(result.capture, args, warmup=0, repeats=1, clock=clock).values())
        s = real_step_ms(model, inputs, loss_fn, warmup=0, repeats=1, clock=clock)
        if i >= warmup:
            graph_ms.append(g)
            step_ms.append(s)
    return statistics.median(graph_ms), statistics.median(step_ms)
