"""A module's selective-checkpoint options (planner.solvers.pipeline.op_options).

A selective checkpoint reruns every call of the module it does not keep up to the module's
last saving (torch's early stop), whether the backward reads the call's output or not. So the
options may keep calls nobody reads (a GPT block's mask, its attention's output projection).
Each option keeps the calls that save the most rerun time per byte kept while they fit:
checked here against every subset of a block's calls.
"""

from __future__ import annotations

import pytest

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage
from planner.sim.ledger import MemoryLedger
from planner.sim.selective_units import cached_nodes, rerun_ms
from planner.sim.stage_costs import stage_of_nodes
from planner.sim.stage_policies import StageFacts, stage_facts
from planner.solvers.pipeline import op_options

MODULES = ["h.1", "h.2", "h.3"]


@pytest.fixture(scope="module")
def facts() -> tuple[Graph, StageFacts]:
    """Stage 1 of a traced GPT-4 split after h.0 (its blocks h.1 to h.3, ln_f and head)."""
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=4, vocab=64)
    graph = trace(model, inputs).graph
    mods = [["tok", "pos", "h.0"], [*MODULES, "ln_f", "head"]]
    part = Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(mods)])
    nodes = [v for v, i in stage_of_nodes(graph, part).items() if i == 1]
    return graph, stage_facts(graph, nodes, mods[1])


def _module(graph: Graph, facts: StageFacts, name: str) -> op_options.Module:
    least = set(facts.rest_saved | facts.held)
    inputs = set().union(*(u.inputs for u in facts.units))
    unit = next(u for u in facts.units if u.name == name)
    return op_options.module(facts, unit, least, inputs)


def _most_gain_ms(calls: list[op_options._Call], budget_bytes: int) -> float:
    """The most rerun time any subset of `calls` saves within `budget_bytes` (exact: a
    knapsack over the distinct byte sums)."""
    best = {0: 0.0}  # kept bytes -> most time saved
    for c in calls:
        for nbytes, gain in list(best.items()):
            total = nbytes + c.cost_bytes
            if total <= budget_bytes and best.get(total, -1.0) < gain + c.gain_ms:
                best[total] = gain + c.gain_ms
    return max(best.values())


@pytest.mark.parametrize("name", MODULES)
def test_each_option_saves_the_most_rerun_time_its_bytes_allow(
        facts: tuple[Graph, StageFacts], name: str) -> None:
    graph, stage = facts
    m = _module(graph, stage, name)
    calls = op_options.calls_of(graph, m)
    by_name = {c.name: c for c in calls}
    forward = [(v, n) for v, n in stage.forward if n == name]
    unit = next(u for u in stage.units if u.name == name)
    whole_ms = sum(MemoryLedger.of(graph).compute_ms[v] for v in unit.rerun)  # what it reruns
    options = op_options.selective_options(graph, m, weight_reruns=False)
    assert len(options) == len(op_options.FRACTIONS)
    for o in options:
        kept = [by_name[c] for c in o.ops]
        budget = sum(c.cost_bytes for c in kept)
        saved_ms = sum(c.gain_ms for c in kept)
        # its time is the simulator's rerun of everything it does not keep
        cached = cached_nodes(graph, {name: [v for v, _ in forward]}, {name: list(o.ops)})
        assert o.ms == pytest.approx(rerun_ms(graph, stage, cached)[name])
        assert o.ms == pytest.approx(whole_ms - saved_ms)
        # the greedy fill is within 1 % of the best subset with its bytes (0.26 % here)
        assert _most_gain_ms(calls, budget) * 0.99 <= saved_ms


def test_options_keep_calls_whose_outputs_the_backward_never_reads(
        facts: tuple[Graph, StageFacts]) -> None:
    """Keeping such calls costs bytes a plain checkpoint would not hold, but saves their
    rerun: the lightest option of a block keeps the causal mask (aten.ones, aten.tril), and
    saves more rerun time than any set of read calls alone with its bytes."""
    graph, stage = facts
    m = _module(graph, stage, "h.2")
    read = {c.name for c in op_options.calls_of(graph, m, saved_only=True)}
    options = op_options.selective_options(graph, m, weight_reruns=False)
    assert {"aten.ones#0", "aten.tril#0"} <= set(options[0].ops) - read, options[0].ops
    calls = {c.name: c for c in op_options.calls_of(graph, m)}
    for o in options:
        kept = [calls[c] for c in o.ops]
        budget = sum(c.cost_bytes for c in kept)
        read_only = [c for c in calls.values() if c.name in read]
        assert _most_gain_ms(read_only, budget) < sum(c.gain_ms for c in kept)
