"""Checkpoints of submodules (a policy on 'h.2.mlp'; planner.sim.stage_facts.region_facts,
planner.solvers.pipeline.region_options, planner.runtime.pipeline_units): the rule frees what
only the submodule's backward reads and reruns the submodule alone; the planner's options are
bounds of that rule and free more per rerun ms than any selective checkpoint of the whole
block; the runtime reruns the submodule alone, with the one-process loss and gradients; a
name outside the stage's modules, inside another named one, or without ops is refused in one
line."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage
from planner.sim.ledger import MemoryLedger
from planner.sim.result import PlanError
from planner.sim.stage_costs import StageCosts, stage_costs, stage_of_nodes
from planner.sim.stage_facts import StageFacts, region_facts, stage_facts
from planner.sim.stage_policies import policy_stage_costs
from planner.solvers.pipeline import op_options, region_options

MODS = [["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]]


@pytest.fixture(scope="module")
def stage() -> tuple[Graph, StageFacts, StageCosts]:
    """Stage 1 (h.2, h.3, ln_f, head) of a traced GPT-4 split after h.1."""
    from planner import zoo
    from planner.tracing import trace

    model, inputs = zoo.gpt(batch_size=2, context=16, dim=32, layers=4, vocab=64)
    graph = trace(model, inputs).graph
    part = Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(MODS)])
    nodes = [v for v, i in stage_of_nodes(graph, part).items() if i == 1]
    return graph, stage_facts(graph, nodes, MODS[1]), stage_costs(graph, part)[1]


def _module(graph: Graph, facts: StageFacts, name: str) -> op_options.Module:
    least = set(facts.rest_saved | facts.held)
    inputs = set().union(*(u.inputs for u in facts.units))
    return op_options.module(facts, next(u for u in facts.units if u.name == name), least,
                             inputs)


def test_a_submodule_checkpoint_frees_what_only_it_saves_and_reruns_it_alone(
        stage: tuple[Graph, StageFacts, StageCosts]) -> None:
    graph, facts, base = stage
    size = MemoryLedger.of(graph).storage_bytes
    split = region_facts(graph, facts, ["h.2.mlp"])
    units = {u.name: u for u in split.units}
    mlp, rest = units["h.2.mlp"], units["h.2"]
    assert mlp.forward_ms > 0 and rest.forward_ms > 0
    assert mlp.forward_ms + rest.forward_ms == pytest.approx(
        next(u for u in facts.units if u.name == "h.2").forward_ms)
    others = rest.saved | facts.held | facts.rest_saved
    for u in facts.units:
        others |= u.saved if u.name != "h.2" else frozenset()
    freed = sum(size[r] for r in mlp.saved - mlp.inputs - others)
    got = policy_stage_costs(graph, facts, base, {"h.2.mlp": "recompute"}, None).costs
    whole = policy_stage_costs(graph, facts, base, {"h.2": "recompute"}, None).costs
    assert freed > 0
    assert got.saved_bytes == base.saved_bytes - freed + base.checkpoint_bytes  # its RNG state
    assert got.backward_ms == pytest.approx(base.backward_ms + mlp.forward_ms)
    assert whole.backward_ms > got.backward_ms  # the block reruns its attention too


def test_the_mlp_alone_frees_more_per_rerun_ms_than_any_selective_checkpoint_of_the_block(
        stage: tuple[Graph, StageFacts, StageCosts]) -> None:
    """Against every subset of the block's calls a selective checkpoint could keep (exact,
    as tests/solvers/test_op_options.py): freeing as many bytes costs a longer rerun."""
    graph, facts, _ = stage
    m = _module(graph, facts, "h.2")
    mlp = region_options.region_option(graph, m, {"h.2.mlp": ()})
    assert mlp is not None
    size = MemoryLedger.of(graph).storage_bytes
    saved = sum(size[r] for r in m.unit.saved - m.unit.inputs)
    calls = op_options.calls_of(graph, m)
    budget = saved + mlp.delta_bytes  # what a checkpoint of the block may keep: as much freed
    best = {0: 0.0}
    for c in calls:
        for nbytes, gain in list(best.items()):
            total = nbytes + c.cost_bytes
            if total <= budget and best.get(total, -1.0) < gain + c.gain_ms:
                best[total] = gain + c.gain_ms
    selective_ms = m.unit.forward_ms - max(best.values())
    print(f"MLP alone: {-mlp.delta_bytes:,} B freed for {mlp.ms * 1e3:.2f} us; the best "
          f"selective checkpoint of the block freeing as much reruns {selective_ms * 1e3:.2f} us")
    assert mlp.ms < 0.75 * selective_ms


def _stage_of(graph: Graph, mods: list[list[str]], s: int) -> tuple[StageFacts, StageCosts]:
    part = Partition(stages=[PipelineStage(stage_index=i, rank=i, modules=m)
                             for i, m in enumerate(mods)])
    nodes = [v for v, i in stage_of_nodes(graph, part).items() if i == s]
    return stage_facts(graph, nodes, mods[s]), stage_costs(graph, part)[s]


# h.1 last in its stage (its output sent on: kept whatever the policies), then first (its
# input received), then last again: the options' cheap figures are memoised per module and
# what they read of the stage, and hold in each layout
LAYOUTS = [([["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]], 0),
           ([["tok", "pos", "h.0"], ["h.1", "h.2", "h.3", "ln_f", "head"]], 1),
           ([["tok", "pos", "h.0", "h.1"], ["h.2", "h.3", "ln_f", "head"]], 0)]


def test_region_options_are_bounds_of_the_rule_and_their_times_exact(
        stage: tuple[Graph, StageFacts, StageCosts]) -> None:
    graph = stage[0]
    for mods, s in LAYOUTS:
        facts, base = _stage_of(graph, mods, s)
        options = region_options.region_options(graph, _module(graph, facts, "h.1"))
        assert options and all(o.regions for o in options)
        assert any(len(o.regions) == 2 for o in options)  # attention and MLP apart
        for o in options:
            policies = {r: "recompute" for r, _ in o.regions}
            saved = {r: list(ops) for r, ops in o.regions if ops}
            got = policy_stage_costs(graph, facts, base, policies, None, saved).costs
            assert base.saved_bytes + o.delta_bytes >= got.saved_bytes, (s, o.regions)
            assert max(base.transient_bytes, o.transient_bytes) >= got.transient_bytes
            assert got.backward_ms - base.backward_ms == pytest.approx(o.ms), o.regions


def test_names_outside_the_stage_nested_or_without_ops_are_refused_in_one_line(
        stage: tuple[Graph, StageFacts, StageCosts]) -> None:
    graph, facts, base = stage
    with pytest.raises(ValidationError, match=r"'h\.0\.mlp' is not one of the stage's modules "
                                              r"nor inside one"):
        Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=MODS[1],
                                        unit_policies={"h.0.mlp": "recompute"})])
    with pytest.raises(ValidationError, match=r"'h\.2\.mlp' is inside 'h\.2', which has a "
                                              r"policy too"):
        Partition(stages=[PipelineStage(stage_index=0, rank=0, modules=MODS[1],
                                        unit_policies={"h.2": "recompute",
                                                       "h.2.mlp": "offload"})])
    with pytest.raises(PlanError) as info:
        policy_stage_costs(graph, facts, base, {"h.2.mlpx": "recompute"}, None)
    assert str(info.value) == ("unit_policies: 'h.2.mlpx' runs no op of the graph's forward "
                               "inside 'h.2'; name a submodule that does (or the module)")


# -- the runtime ------------------------------------------------------------------------------
class _Counted(nn.Module):
    def __init__(self, inner: nn.Module, runs: Counter[str], name: str) -> None:
        super().__init__()
        self.inner, self.runs, self.name = inner, runs, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs[self.name] += 1
        return self.inner(x)


class _Block(nn.Module):
    def __init__(self, runs: Counter[str]) -> None:
        super().__init__()
        self.ln = _Counted(nn.LayerNorm(8), runs, "ln")
        self.mlp = _Counted(nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)),
                            runs, "mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


def test_the_runtime_reruns_the_named_submodule_alone() -> None:
    from planner.runtime.pipeline_units import HostMemory, UnitCall, UnitPlan, UnitSwitch

    torch.manual_seed(0)
    runs: Counter[str] = Counter()
    block = _Block(runs)
    x = torch.randn(4, 8, requires_grad=True)
    expected = torch.autograd.grad(block(x).square().sum(), [x, *block.parameters()])
    for saved in ((), ("aten.addmm#0",)):
        runs.clear()
        call = UnitCall(block, "b", "keep", UnitSwitch(), HostMemory(),
                        inner=(("mlp", UnitPlan("recompute", saved_ops=saved)),))
        got = torch.autograd.grad(call(x).square().sum(), [x, *block.parameters()])
        assert runs == Counter({"ln": 1, "mlp": 2}), runs  # the MLP ran again, alone
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected, strict=True))
        assert "forward" not in block.mlp.__dict__  # the model is as it was


def test_the_runtime_refuses_a_submodule_the_model_lacks_in_one_line() -> None:
    from planner import zoo
    from planner.runtime.pipeline_split import split_model
    from planner.runtime.pipeline_units import (
        HostMemory,
        UnitSwitch,
        apply_unit_policies,
        check_unit_policies,
    )

    model, inputs = zoo.gpt(batch_size=2, context=16, dim=32, layers=4, vocab=64)
    spec = PipelineStage(stage_index=0, rank=0, modules=[*MODS[0], *MODS[1]],
                         unit_policies={"h.1.mlpx": "recompute"})
    split = split_model(model, Partition(stages=[spec]), inputs)
    with pytest.raises(InputError) as info:
        apply_unit_policies(split.stages[0].module, check_unit_policies(spec), UnitSwitch(),
                            HostMemory())
    assert str(info.value).startswith("partition: stage 0's unit_policies name 'h.1.mlpx', "
                                      "which the model's 'h.1' does not have; name one of its "
                                      "submodules (ln1, attn, ln2, mlp")
