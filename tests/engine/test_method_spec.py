"""Method specs (planner.solvers.spec): every built-in method declares one, and the registry,
the option checks, the offload pre-check and solve() for pipeline methods derive from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from planner.core.errors import InputError
from planner.core.plan import PlanKind, PlanStatus
from planner.core.resources import Resources
from planner.core.synthetic import training_graph
from planner.engine import registry
from planner.engine.offload_checks import check_offload_request, is_offload_method
from planner.engine.options import METHOD_OPTIONS, check_options, describe_options
from planner.solvers.pipeline.baselines import BASELINES
from planner.solvers.pipeline.chains import chain_graph, transformer_layers
from planner.solvers.request import MethodResult, SolveRequest
from planner.solvers.spec import MethodSpec, NoOptions, option, option_specs

GiB = 2**30
PIPE_GRAPH = chain_graph(transformer_layers(6, 512, 8, 32000, 512, 2))  # tok, h.0..h.5, head
MACHINE = Resources(device_count=2, microbatches=4, pipeline_schedule="1f1b")


def test_every_builtin_method_has_a_spec() -> None:
    specs = registry.method_specs()
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    assert set(registry.BUILTIN_METHODS) == set(names)
    expected = {"store-all", "recompute-all", "chen-sqrt", "chen-greedy", "best-baseline",
                "milp", "lp-rounding", "cpsat-intervals", "auto", "rotor", "revolve",
                "chain-chen-sqrt", "offload-all", "offload-greedy", "offload-beaumont",
                "offload-remat", "offload-milp", "pofo", "pipeline-dp", "pipeline-ilp",
                *(f"pipeline-{b}" for b in BASELINES)}
    assert expected <= set(names)
    for spec in specs:
        assert registry.method_spec(spec.name) is spec
        assert registry.load_method(spec.name) is spec.run
        assert registry.method_target(spec.name) == spec.target
        module, _, function = spec.target.partition(":")
        assert module.startswith("planner.solvers.") and function
        assert spec.summary and "\n" not in spec.summary
        assert all(k in {p.value for p in PlanKind} for k in spec.plan_kinds)
        assert dataclasses.is_dataclass(spec.options)
    assert registry.method_spec("no-such-method") is None


def test_option_check_and_describe() -> None:
    rotor = registry.method_spec("rotor")
    assert rotor is not None
    with pytest.raises(InputError) as bad:
        rotor.check_options({"slots": 0})
    assert bad.value.field == "options.slots"
    assert str(bad.value) == "options.slots: 0 is below 1; expected an integer ≥ 1"
    with pytest.raises(InputError, match=r"options.nope: method 'rotor' has no option 'nope' "
                                         r"\(its options: slots, refine, segments, saving"):
        rotor.check_options({"nope": 1})
    with pytest.raises(InputError, match="options.saving: 'yes' is not a boolean"):
        rotor.check_options({"saving": "yes"})
    with pytest.raises(InputError, match="options.saving_levels: 101 is above 100"):
        rotor.check_options({"saving_levels": 101})
    with pytest.raises(InputError, match="options.refine: True is not an integer"):
        check_options("rotor", {"refine": True})
    with pytest.raises(InputError, match="options.backend: 'bogus' is not one of cpsat"):
        check_options("milp", {"backend": "bogus"})
    with pytest.raises(InputError, match="method 'store-all' has no option 'backend' \\(it "
                                         "takes none\\)"):
        check_options("store-all", {"backend": "cpsat"})
    with pytest.raises(InputError, match="method 'auto' has no option 'backend' \\(its "
                                         "options: space\\)"):
        check_options("auto", {"backend": "cpsat"})
    check_options("cpsat-intervals", {"max_computations": None, "hint": False})
    check_options("a-plugin", {"anything": object()})  # plugins take what they take
    parsed = rotor.parse_options({"slots": 100})
    assert (parsed.slots, parsed.refine, parsed.saving) == (100, 2, False)
    assert rotor.read_options({"slots": 7, "unknown": 1}).slots == 7

    described = rotor.describe()
    assert described["name"] == "rotor" and described["plan_kinds"] == ["remat"]
    assert described["needs_host_tier"] is False and described["claims_bounds"] is False
    slots = next(o for o in described["options"] if o["name"] == "slots")
    assert slots == {"name": "slots", "type": "int", "default": 500, "minimum": 1,
                     "maximum": None, "nullable": False, "choices": [],
                     "help": "memory discretisation"}
    cap = registry.method_spec("cpsat-intervals").describe()["options"][0]  # type: ignore[union-attr]
    assert cap["nullable"] and cap["default"] is None
    milp = registry.method_spec("milp").describe()  # type: ignore[union-attr]
    assert milp["claims_bounds"] and milp["options"][0]["choices"][0] == "cpsat"
    assert describe_options("milp")["hint"] == ("true or false; start from the best baseline's "
                                                "plan (default true)")
    assert describe_options("store-all") == {} and "store-all" not in METHOD_OPTIONS
    assert [o.name for o in METHOD_OPTIONS["auto"]] == ["space"]  # compiled: the sac method
    assert [o.name for o in METHOD_OPTIONS["milp"]] == ["backend", "hint"]


def test_spec_defaults_are_the_solvers_own() -> None:
    from planner.solvers.chain.linearize import MAX_SEGMENTS
    from planner.solvers.chain.methods import RotorOptions
    from planner.solvers.chain.rotor import DEFAULT_SLOTS
    from planner.solvers.offload.methods import OffloadMilpOptions
    from planner.solvers.offload.milp import BACKENDS, MAX_NODES

    assert RotorOptions().slots == DEFAULT_SLOTS and RotorOptions().segments == MAX_SEGMENTS
    assert OffloadMilpOptions().max_nodes == MAX_NODES
    backend = next(o for o in option_specs(OffloadMilpOptions) if o.name == "backend")
    assert backend.choices == BACKENDS


def test_options_dataclass_declares_only_option_types() -> None:
    @dataclass(frozen=True)
    class Bad:
        ratio: float = option(0.5, "a float is no option type")

    def run(request: SolveRequest) -> MethodResult:
        raise AssertionError

    with pytest.raises(TypeError, match="ratio"):
        MethodSpec(name="bad", run=run, options=Bad, summary="x")
    with pytest.raises(TypeError, match="plan kinds"):
        MethodSpec(name="bad", run=run, options=NoOptions, plan_kinds=("tape",), summary="x")


def test_offload_precheck_follows_the_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    for spec in registry.method_specs():
        assert is_offload_method(spec.name) == spec.needs_host_tier, spec.name
    assert is_offload_method("pofo") and not is_offload_method("auto")
    graph = training_graph(4)
    with pytest.raises(InputError, match="offloads to host memory"):
        check_offload_request(graph, "offload-greedy", None)
    # A method anywhere that says it needs a host tier is checked as one; one that does not
    # declare it is not, wherever it lives.
    store_all = registry.method_spec("store-all")
    assert store_all is not None
    hosted = dataclasses.replace(store_all, name="hosted", needs_host_tier=True)
    monkeypatch.setitem(registry._SPECS, "hosted", hosted)
    with pytest.raises(InputError, match="method hosted offloads"):
        check_offload_request(graph, "hosted", Resources(device_memory_bytes=GiB))
    greedy = registry.method_spec("offload-greedy")
    assert greedy is not None
    monkeypatch.setitem(registry._SPECS, "offload-greedy",
                        dataclasses.replace(greedy, needs_host_tier=False))
    check_offload_request(graph, "offload-greedy", None)


def test_solve_serves_pipeline_methods_with_the_partition_plan() -> None:
    from planner.engine.partition import METHODS, partition_plan
    from planner.engine.solve import solve

    assert METHODS == ("dp", "ilp", "whole", *BASELINES)
    memory = 4 * GiB
    report = partition_plan(PIPE_GRAPH, device_memory_bytes=memory, method="dp",
                            resources=MACHINE)
    plan = solve(PIPE_GRAPH, memory, "pipeline-dp", resources=MACHINE)
    # a small chain: every contiguous split simulated, so the DP's answer is proven fastest
    assert plan.kind is PlanKind.pipeline and plan.status is PlanStatus.optimal
    ignore = {"wall_seconds"}
    assert plan.model_dump(exclude=ignore) == report.plan.model_dump(exclude=ignore)
    balanced = solve(PIPE_GRAPH, memory, "pipeline-layer-balanced", resources=MACHINE)
    same = partition_plan(PIPE_GRAPH, device_memory_bytes=memory, method="layer-balanced",
                          resources=MACHINE).plan
    assert balanced.model_dump(exclude=ignore) == same.model_dump(exclude=ignore)
    # Nothing fits: infeasible, with the least device memory that works.
    tight = 700 * 2**20
    none = solve(PIPE_GRAPH, tight, "pipeline-dp", resources=MACHINE)
    assert none.status is PlanStatus.infeasible and not none.actions
    assert none.details["smallest_feasible_bytes"] > tight
    assert "least device memory" in none.notes[0]
    with pytest.raises(InputError, match="options.chunks"):
        solve(PIPE_GRAPH, memory, "pipeline-dp", resources=MACHINE, options={"chunks": 1})
    with pytest.raises(InputError) as missing:
        solve(PIPE_GRAPH, memory, "pipeline-dp")
    assert missing.value.field == "devices"


def test_partition_errors_name_fields_and_entry_points_rename_them() -> None:
    from planner.engine.partition import partition_plan

    cases = [
        (dict(microbatches=4), "devices", "how many devices (pipeline ranks)? e.g. 4"),
        (dict(devices=2), "microbatches", "how many micro-batches a step?"),
        (dict(devices=2, microbatches=4, method="magic"), "method", "no partitioner 'magic'"),
        (dict(devices=2, microbatches=4, schedule="zz"), "schedule", "no schedule 'zz'"),
        (dict(devices=2, microbatches=4, split=["h.9"]), "split", "no such layer"),
    ]
    for kwargs, field, text in cases:
        with pytest.raises(InputError) as err:
            partition_plan(PIPE_GRAPH, **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field and text in err.value.detail, str(err.value)
        flag = "--" + field.replace("_", "-")
        assert str(err.value.renamed({field: flag})).startswith(f"{flag}: ")
