"""Model state in graph.json: ZeRO / precision arithmetic, step memory, validation, and
version-1 graph files that load unchanged with the same content hash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from planner.core.errors import InputError
from planner.core.graph import FixedMemory, Graph, ModelState, ParameterState
from planner.core.io import graph_from_dict, load_graph, write_json
from planner.core.synthetic import training_graph
from planner.sim.step_memory import StepMemory, model_state_breakdown, step_memory

M = 10**6
# (optimizer, precision) -> ZeRO stage -> (parameters, gradients, optimizer) MB per device for
# one parameter of 10**6 elements (4 MB in fp32, 2 MB in 16-bit) over 4 data-parallel ranks,
# worked by hand: fp32 states are 4 bytes an element, mixed precision adds a 4-byte master copy.
HAND: dict[tuple[str, str], dict[int, tuple[float, float, float]]] = {
    ("sgd", "fp32"): {0: (4, 4, 0), 1: (4, 4, 0), 2: (4, 1, 0), 3: (1, 1, 0)},
    ("sgd-momentum", "fp32"): {0: (4, 4, 4), 1: (4, 4, 1), 2: (4, 1, 1), 3: (1, 1, 1)},
    ("adam", "fp32"): {0: (4, 4, 8), 1: (4, 4, 2), 2: (4, 1, 2), 3: (1, 1, 2)},
    ("adamw", "fp32"): {0: (4, 4, 8), 1: (4, 4, 2), 2: (4, 1, 2), 3: (1, 1, 2)},
    ("sgd", "bf16-mixed"): {0: (2, 2, 4), 1: (2, 2, 1), 2: (2, 0.5, 1), 3: (0.5, 0.5, 1)},
    ("sgd-momentum", "bf16-mixed"): {
        0: (2, 2, 8), 1: (2, 2, 2), 2: (2, 0.5, 2), 3: (0.5, 0.5, 2)
    },
    ("adam", "bf16-mixed"): {0: (2, 2, 12), 1: (2, 2, 3), 2: (2, 0.5, 3), 3: (0.5, 0.5, 3)},
    ("adamw", "fp16-mixed"): {0: (2, 2, 12), 1: (2, 2, 3), 2: (2, 0.5, 3), 3: (0.5, 0.5, 3)},
    ("sgd", "fp16-mixed"): {0: (2, 2, 4), 1: (2, 2, 1), 2: (2, 0.5, 1), 3: (0.5, 0.5, 1)},
}


def one_param_state(optimizer: str, precision: str, stage: int, dp: int = 4) -> ModelState:
    nbytes = 4 * M if precision == "fp32" else 2 * M
    return ModelState.model_validate(
        {
            "parameters": [{"name": "w", "bytes": nbytes}],
            "optimizer": optimizer,
            "precision": precision,
            "zero_stage": stage,
            "data_parallel_degree": dp,
        }
    )


@pytest.mark.parametrize(("optimizer", "precision"), list(HAND))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_arithmetic_matches_hand_numbers(optimizer: str, precision: str, stage: int) -> None:
    total = one_param_state(optimizer, precision, stage).total()
    want = tuple(int(x * M) for x in HAND[optimizer, precision][stage])
    assert (total.parameters_bytes, total.gradients_bytes, total.optimizer_bytes) == want


def test_sixteen_bytes_per_element_for_adam() -> None:
    # DESIGN.md: Adam with bf16 weights and grads = 2 + 2 + 4 (master) + 8 = 16 bytes an element;
    # fp32 Adam = 4 + 4 + 8.
    for precision in ("fp32", "bf16-mixed"):
        assert one_param_state("adam", precision, 0).total().total_bytes == 16 * M
    assert one_param_state("adam", "bf16-mixed", 0).total().master_weights_bytes == 4 * M
    assert one_param_state("adam", "bf16-mixed", 3).total().total_bytes == 4 * M  # 16 / 4


def test_dp_one_shards_nothing_and_rounding_is_per_parameter() -> None:
    assert one_param_state("adam", "fp32", 3, dp=1).total().total_bytes == 16 * M
    ms = ModelState(
        parameters=[ParameterState(name="a", bytes=10), ParameterState(name="b", bytes=10)],
        zero_stage=3,
        data_parallel_degree=4,
    )
    assert ms.total().parameters_bytes == 3 + 3  # ceil(10 / 4) each


def test_frozen_parameters_hold_weights_only() -> None:
    ms = ModelState(
        parameters=[ParameterState(name="emb", bytes=2 * M, trainable=False)],
        optimizer="adam",
        precision="bf16-mixed",
    )
    t = ms.total()
    assert (t.parameters_bytes, t.gradients_bytes, t.optimizer_bytes) == (2 * M, 0, 0)


def state_graph(lifetime: str = "step") -> Graph:
    """training_graph(3): forward 0-2, loss 3, backward 4 (layer 2), 5 (layer 1), 6 (layer 0)."""
    doc = training_graph(3, seed=1).model_dump(mode="json")
    doc["fixed"] = {"inputs_bytes": 50}
    doc["model_state"] = {
        "parameters": [
            {"name": "layers.0.w", "module_path": "layers.0", "bytes": 400, "gradient_node": 6},
            {"name": "layers.1.w", "module_path": "layers.1", "bytes": 200, "gradient_node": 5},
            {"name": "layers.1.b", "module_path": "layers.1", "bytes": 8, "gradient_node": 5},
            {"name": "layers.2.w", "module_path": "layers.2", "bytes": 100},  # no node given
            {"name": "frozen", "bytes": 1000, "trainable": False},
        ],
        "optimizer": "adam",
        "gradient_lifetime": lifetime,
    }
    return graph_from_dict(doc)


def test_step_memory_gradients_held_all_step() -> None:
    g = state_graph("step")
    trainable = 400 + 200 + 8 + 100
    # inputs + every weight + gradients + 2 Adam states of the trainable ones
    assert g.fixed_bytes == 50 + 1708 + trainable + 2 * trainable
    assert step_memory(g) == StepMemory(start_bytes=g.fixed_bytes, held_from_node={})


def test_step_memory_gradients_from_backward() -> None:
    g = state_graph("backward")
    sm = step_memory(g)
    # layers.2.w names no gradient node: charged from the start (the safe side)
    assert sm.start_bytes == 50 + 1708 + 2 * 708 + 100 == g.fixed_bytes
    assert dict(sm.held_from_node) == {6: 400, 5: 208}
    assert sm.end_bytes == state_graph("step").fixed_bytes
    assert "held from 2 nodes" in str(sm)


def test_graph_without_model_state_is_todays_fixed_memory() -> None:
    g = training_graph(4, fixed_bytes=777)
    assert g.model_state is None
    assert step_memory(g) == StepMemory(start_bytes=777, held_from_node={})
    b = model_state_breakdown(g)
    assert not b.derived and b.parameters_bytes == 777 and b.per_module == {}
    with pytest.raises(InputError, match="no model_state"):
        model_state_breakdown(g, zero_stage=1)


def test_breakdown_per_module_and_what_if() -> None:
    g = state_graph()
    b = model_state_breakdown(g)
    assert b.derived and b.optimizer == "adam"
    assert b.per_module["layers.1"].parameters_bytes == 208
    assert b.per_module["layers.1"].optimizer_bytes == 416
    assert b.per_module[""].parameters_bytes == 1000  # the frozen one
    assert sum(m.total_bytes for m in b.per_module.values()) == b.total_bytes
    assert b.total_bytes == g.fixed_bytes - 50
    z3 = model_state_breakdown(g, zero_stage=3, dp=2)
    assert z3.parameters_bytes == 200 + 100 + 4 + 50 + 500 and z3.zero_stage == 3
    assert g.model_state is not None and g.model_state.zero_stage == 0  # unchanged
    with pytest.raises(InputError, match="zero stage 5"):
        model_state_breakdown(g, zero_stage=5)
    with pytest.raises(InputError, match="data-parallel degree 0"):
        model_state_breakdown(g, dp=0)
    text = str(b)
    assert "adam, fp32, ZeRO-0" in text and "layers.1:" in text and "(root)" in text


@pytest.mark.parametrize(
    ("mutate", "fragments"),
    [
        (
            lambda d: d["fixed"].update(parameters_bytes=8),
            ("fixed.parameters_bytes", "must be 0 when model_state is given"),
        ),
        (lambda d: d["fixed"].update(optimizer_bytes=8), ("fixed.optimizer_bytes",)),
        (
            lambda d: d["model_state"]["parameters"][0].update(gradient_node=99),
            ("model_state.parameters[0] (layers.0.w).gradient_node", "missing node 99"),
        ),
        (
            lambda d: d["model_state"]["parameters"][4].update(gradient_node=6),
            ("parameters[4] (frozen).gradient_node", "frozen"),
        ),
        (
            lambda d: d["model_state"]["parameters"].append({"name": "layers.0.w", "bytes": 1}),
            ("model_state.parameters", "duplicate parameter name 'layers.0.w'"),
        ),
        (
            lambda d: d["model_state"].update(data_parallel_degree=0),
            ("model_state.data_parallel_degree", "greater than or equal to 1"),
        ),
        (lambda d: d["model_state"].update(zero_stage=4), ("model_state.zero_stage",)),
        (lambda d: d["model_state"].update(optimizer="lion"), ("model_state.optimizer",)),
        (lambda d: d["model_state"].update(precision="fp8"), ("model_state.precision",)),
        (
            lambda d: d["model_state"].update(gradient_lifetime="forever"),
            ("model_state.gradient_lifetime",),
        ),
        (
            lambda d: d["model_state"]["parameters"][1].update(bytes=-1),
            ("model_state.parameters[1].bytes",),
        ),
    ],
)
def test_bad_model_state_one_line(mutate: Any, fragments: tuple[str, ...]) -> None:
    doc = json.loads(state_graph().model_dump_json())
    mutate(doc)
    with pytest.raises(InputError) as err:
        graph_from_dict(doc, where="g.json")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("g.json: ")
    for f in fragments:
        assert f in msg, msg


def test_model_state_round_trips_and_changes_the_hash(tmp_path: Path) -> None:
    g = state_graph("backward")
    path = tmp_path / "g.json"
    write_json(path, g)
    back = load_graph(path)
    assert back == g and back.content_hash() == g.content_hash()
    assert back.model_state is not None and back.model_state.gradient_lifetime == "backward"
    plain = g.model_copy(update={"model_state": None, "fixed": FixedMemory(inputs_bytes=50)})
    assert plain.content_hash() != g.content_hash()
    via_nx = Graph.from_networkx(g.to_networkx())
    assert via_nx == g and via_nx.content_hash() == g.content_hash()
    assert "model_state" not in plain.to_networkx().graph


def test_graph_schema_documents_model_state() -> None:
    schema = Graph.model_json_schema()
    assert "model_state" in schema["properties"]
    ms = schema["$defs"]["ModelState"]["properties"]
    assert all(ms[f].get("description") for f in ms)
    assert schema["$defs"]["ParameterState"]["properties"]["gradient_node"]["description"]
    json.dumps(schema)


# Written by the code before model_state existed (Graph.model_dump_json at commit 7d9daa9).
OLD_GRAPH_JSON = (
    '{"schema_version":"1","nodes":[{"id":0,"name":"x","op":"aten.mm","phase":"forward","comp'
    'ute_ms":1.25,"cost_source":"measured","output_bytes":4096,"workspace_bytes":0,"module_pa'
    'th":"fc1","recomputable":true,"random":false,"alias_of":null},{"id":1,"name":"relu","op"'
    ':"aten.relu","phase":"forward","compute_ms":0.5,"cost_source":"unknown","output_bytes":4'
    '096,"workspace_bytes":0,"module_path":"act","recomputable":true,"random":false,"alias_of'
    '":null},{"id":2,"name":"loss","op":"aten.sum","phase":"loss","compute_ms":0.1,"cost_sour'
    'ce":"unknown","output_bytes":4,"workspace_bytes":0,"module_path":"","recomputable":true,'
    '"random":false,"alias_of":null},{"id":3,"name":"t","op":"aten.t","phase":"backward","com'
    'pute_ms":0.0,"cost_source":"unknown","output_bytes":1024,"workspace_bytes":0,"module_pat'
    'h":"fc1","recomputable":true,"random":false,"alias_of":null},{"id":4,"name":"grad_relu",'
    '"op":"aten.threshold_backward","phase":"backward","compute_ms":0.5,"cost_source":"unknow'
    'n","output_bytes":4096,"workspace_bytes":0,"module_path":"","recomputable":true,"random"'
    ':false,"alias_of":null},{"id":5,"name":"grad_w","op":"aten.mm","phase":"backward","compu'
    'te_ms":1.0,"cost_source":"unknown","output_bytes":1024,"workspace_bytes":64,"module_path'
    '":"","recomputable":true,"random":false,"alias_of":null}],"edges":[{"source":0,"target":'
    '1},{"source":1,"target":2},{"source":1,"target":4},{"source":2,"target":4},{"source":4,"'
    'target":5},{"source":3,"target":5}],"fixed":{"parameters_bytes":1024,"gradients_bytes":1'
    '024,"optimizer_bytes":2048,"inputs_bytes":512,"other_bytes":8},"order":null,"outputs":[2'
    ',5],"metadata":{"model_name":"old","batch_size":4,"dtype":"float32","device_profile":"",'
    '"source":"test","extra":{}}}'
)
OLD_HASH = "sha256:d39b3016d8e1b7508b9c759112b35a21896af925c21e6bfdfe546cd146aa5cc8"


def test_version_1_graph_loads_unchanged_with_the_same_hash(tmp_path: Path) -> None:
    doc = json.loads(OLD_GRAPH_JSON)
    assert "model_state" not in doc
    g = graph_from_dict(doc, where="old.json")
    assert g.model_state is None
    assert g.content_hash() == OLD_HASH
    assert g.fixed_bytes == 1024 + 1024 + 2048 + 512 + 8
    assert step_memory(g) == StepMemory(start_bytes=g.fixed_bytes, held_from_node={})
    path = tmp_path / "again.json"
    write_json(path, g)  # today's writer adds "model_state": null
    again = load_graph(path)
    assert again == g and again.content_hash() == OLD_HASH
    assert Graph.from_networkx(nx.DiGraph(g.to_networkx())).content_hash() == OLD_HASH


def test_traced_model_fills_model_state() -> None:
    pytest.importorskip("torch")
    from planner import zoo
    from planner.tracing import trace

    model, inputs = zoo.tiny("gpt")
    g = trace(model, inputs, optimizer="adam", gradient_lifetime="step").graph
    ms = g.model_state
    assert ms is not None and ms.optimizer == "adam" and ms.gradient_lifetime == "step"
    params = dict(model.named_parameters())
    assert [p.name for p in ms.parameters] == list(params)
    for p in ms.parameters:
        assert p.trainable and p.gradient_node is not None, p.name
        assert g.node(p.gradient_node).output_bytes == p.bytes
        assert p.module_path == p.name.rpartition(".")[0]
    assert g.fixed.parameters_bytes == g.fixed.gradients_bytes == g.fixed.optimizer_bytes == 0
    weights = sum(t.numel() * t.element_size() for t in params.values())
    # today's figure: weights + gradients + 2 Adam states, inputs, buffers
    assert g.fixed_bytes == 4 * weights + g.fixed.inputs_bytes + g.fixed.other_bytes
    backward = g.model_copy(
        update={"model_state": ms.model_copy(update={"gradient_lifetime": "backward"})}
    )
    sm = step_memory(backward)
    assert sm.start_bytes == g.fixed_bytes - weights and sm.end_bytes == g.fixed_bytes


def test_unsharded_gradient_output_is_the_held_buffer_not_counted_twice() -> None:
    """Under gradient_lifetime 'backward' the gradient node's output is the .grad buffer: the
    simulator charges it once, from its computation to the end of the step."""
    from planner.core.graph import Edge, Graph, Node, Phase
    from planner.core.plan import compute, free
    from planner.sim.simulator import simulate

    nodes = [
        Node(id=0, name="x", phase=Phase.forward, output_bytes=1000),
        Node(id=1, name="loss", phase=Phase.loss, output_bytes=10),
        Node(id=2, name="w.grad", phase=Phase.backward, output_bytes=100),
    ]
    edges = [Edge(source=0, target=1), Edge(source=1, target=2), Edge(source=0, target=2)]

    def graph(lifetime: str, zero: int = 0, dp: int = 1) -> Graph:
        state = ModelState(
            parameters=[ParameterState(name="w", bytes=100, gradient_node=2)],
            gradient_lifetime=lifetime, zero_stage=zero, data_parallel_degree=dp,
        )
        return Graph(nodes=nodes, edges=edges, model_state=state)

    actions = [compute(0), compute(1), compute(2), free(1), free(0), free(2)]
    step = simulate(graph("step"), actions)
    backward = simulate(graph("backward"), actions)
    # step: 200 (weight + grad) all along; at w.grad 200 + 1000 + 10 + 100 (transient output)
    assert step.peak_bytes == 100 + 100 + 1000 + 10 + 100
    # backward: 100 (weight) all along; the gradient is charged once when w.grad runs
    assert backward.peak_bytes == 100 + 1000 + 10 + 100
    assert backward.timeline[-1].live_bytes == 100 + 100  # weight and gradient at the end
    # ZeRO-2 over 4 ranks: the full gradient is a transient, a quarter of it is held
    sharded = simulate(graph("backward", zero=2, dp=4), actions)
    assert sharded.peak_bytes == 100 + 1000 + 10 + 100 + 25
    assert sharded.timeline[-1].live_bytes == 100 + 25
