"""What a checkpoint reruns (planner.sim.stage_facts.checkpoint_rerun) against what torch reruns.

Torch's non-reentrant checkpoint stops its rerun once every tensor the forward saved has been
saved again, and an op saves its inputs before it computes: a GPT block's MLP reruns its first
linear and the GELU, not its second linear (which saves only its input). With dropout after it,
the dropout's mask is saved last and the whole MLP reruns. The rule's rerun is checked here
against the calls torch makes during the backward, per unit, on a traced GPT with and without
dropout.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from planner.core.graph import Graph
from planner.sim.ledger import MemoryLedger
from planner.sim.stage_facts import StageFacts, region_facts, stage_facts

MODULES = ["tok", "pos", "h.0", "h.1", "h.2", "ln_f", "head"]
# forward-only operators: during the backward only a rerun calls them (eager dropout on the CPU
# is a bernoulli mask and a mul, not the traced native_dropout: not compared)
FORWARD_ONLY = ("addmm", "gelu", "_softmax", "native_layer_norm", "tril")
UNITS = ["h.1", "h.1.mlp", "h.1.attn"]


def _traced(dropout: float) -> tuple[Any, tuple[Any, ...], Graph, StageFacts]:
    from models import tiny_gpt

    from planner.tracing import trace

    model, inputs = tiny_gpt(context=16, dim=32, layers=3, vocab=64, dropout=dropout)
    graph = trace(model, inputs).graph
    facts = stage_facts(graph, [n.id for n in graph.nodes], MODULES)
    return model, inputs, graph, facts


def _rule_calls(graph: Graph, facts: StageFacts, unit: str) -> Counter[str]:
    facts = region_facts(graph, facts, [unit])
    u = next(x for x in facts.units if x.name == unit)
    index = graph.index
    return Counter(op for v in u.rerun
                   if (op := index.node(v).op.removeprefix("aten.")) in FORWARD_ONLY)


def _torch_calls(model: Any, inputs: tuple[Any, ...], unit: str) -> Counter[str]:
    """The forward-only calls torch makes during the backward with `unit` checkpointed."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    calls: Counter[str] = Counter()

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if name in FORWARD_ONLY:
                calls[name] += 1
            return func(*args, **(kwargs or {}))

    module = model.get_submodule(unit)
    plain = module.forward
    module.forward = lambda *a: checkpoint(plain, *a, use_reentrant=False)
    try:
        torch.manual_seed(0)
        loss = model(*inputs)
        loss = loss if loss.dim() == 0 else loss.sum()
        with Log():
            loss.backward()
    finally:
        del module.forward
    return calls


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_rule_reruns_what_torch_reruns(dropout: float) -> None:
    model, inputs, graph, facts = _traced(dropout)
    for unit in UNITS:
        rule, torch_calls = _rule_calls(graph, facts, unit), _torch_calls(model, inputs, unit)
        assert rule == torch_calls, (unit, rule, torch_calls)


def test_the_mlp_rerun_stops_before_its_second_linear_without_dropout() -> None:
    _, _, graph, facts = _traced(0.0)
    facts = region_facts(graph, facts, ["h.1.mlp"])
    u = next(x for x in facts.units if x.name == "h.1.mlp")
    forward = [v for v, n in facts.forward if n == "h.1.mlp"]
    ops = [graph.index.node(v).op for v in forward]
    assert ops == ["aten.addmm", "aten.gelu", "aten.addmm"], ops
    assert u.rerun == frozenset(forward[:2])
    ms = MemoryLedger.of(graph).compute_ms
    assert u.rerun_ms == pytest.approx(ms[forward[0]] + ms[forward[1]])
    assert u.rerun_ms < u.forward_ms
