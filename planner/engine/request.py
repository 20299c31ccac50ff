"""One request resolution: what a user gives, resolved once into what the engine solves.

A user gives a graph (or a stored graph's id), a budget in the budget grammar
(`planner.core.budget`), the machine (a preset name, a resources document or file, or
Resources), host memory, a method with its options, a time limit, threads and a seed. Every
entry point (the CLI, the REST service, the runtime agent) hands them to `resolve_request`
and gets one frozen `ResolvedRequest`, whose `solve()` calls `planner.engine.solve.solve`.

Errors are `InputError`s naming the request field at fault (`REQUEST_FIELDS`: `budget`,
`resources`, `host_memory`, `method`, `options.<key>`, `time_limit`, `graph`); each entry point
says the field in its own words with `err.renamed(...)`: the CLI `--budget`, JSON `budget`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.budget import MAX_BUDGET_BYTES, parse_budget_spec
from planner.core.errors import InputError
from planner.core.limits import (
    DEFAULT_PIPELINE_TIME_LIMIT_S,
    DEFAULT_TIME_LIMIT_S,
    check_time_limit,
)
from planner.core.resources import Resources, load_resources, resources_from_dict

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.core.plan import Action, Plan
    from planner.engine.progress import ProgressFn

__all__ = [
    "DEFAULT_PIPELINE_TIME_LIMIT_S", "DEFAULT_TIME_LIMIT_S", "REQUEST_FIELDS", "RequestGraph",
    "ResolvedRequest", "ResourcesInput", "check_method", "default_time_limit_s", "request_graph",
    "resolve_budget", "resolve_request", "resolve_resources", "stored_request",
    "with_host_memory",
]

# The fields a request has, in the request's own words; errors name one of them.
REQUEST_FIELDS = ("graph", "budget", "resources", "host_memory", "method", "options",
                  "time_limit", "threads", "seed")
# A preset name, a resources.json document, a resources.json file, or Resources.
ResourcesInput = Resources | Mapping[str, Any] | str | Path | None


@dataclass(frozen=True)
class RequestGraph:
    """The request's graph: given, or loaded once when first needed. A stored graph is named by
    its content hash; only a relative budget or an offload check must read it."""

    content_hash: str
    load: Callable[[], Graph] = field(repr=False, compare=False)

    @classmethod
    def given(cls, graph: Graph) -> RequestGraph:
        return cls(graph.content_hash(), lambda: graph)

    @cached_property
    def graph(self) -> Graph:
        return self.load()


@dataclass(frozen=True)
class ResolvedRequest:
    """A request every part of which has been checked: what `solve()` is called with."""

    source: RequestGraph
    budget_bytes: int
    method: str = "auto"
    options: Mapping[str, Any] = field(default_factory=dict)
    resources: Resources | None = None
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    threads: int = 2
    seed: int = 0

    @property
    def graph(self) -> Graph:
        return self.source.graph

    @property
    def graph_hash(self) -> str:
        return self.source.content_hash

    def resources_document(self) -> dict[str, Any] | None:
        """The machine as normalised JSON: what a store keeps and a request key hashes."""
        return None if self.resources is None else self.resources.model_dump(mode="json")

    def solve(
        self,
        *,
        progress: ProgressFn | None = None,
        known_plans: Iterable[tuple[str, Sequence[Action]]] = (),
        stop: threading.Event | None = None,
    ) -> Plan:
        """`planner.engine.solve.solve` for this request (`stop`: end it early with the best
        plan so far)."""
        from planner.engine.solve import solve

        return solve(
            self.graph, self.budget_bytes, self.method,
            time_limit_s=self.time_limit_s,
            threads=self.threads, seed=self.seed, options=dict(self.options),
            progress=progress, resources=self.resources, known_plans=known_plans, stop=stop,
        )


def resolve_request(
    graph: Graph | RequestGraph | Mapping[str, Any],
    budget: str | int | float | None = None,
    *,
    resources: ResourcesInput = None,
    host_memory: str | int | None = None,
    method: str = "auto",
    options: Mapping[str, Any] | None = None,
    time_limit: object = None,
    threads: int = 2,
    seed: int = 0,
    graph_where: str = "graph",
    method_here: bool = True,
) -> ResolvedRequest:
    """Resolve every field of a request once, in a fixed order (method and options, machine,
    budget, the offload pre-check, time limit): InputError naming the first field at fault.
    Without a budget the machine's device memory is the budget; without a time limit, the
    default of the method's plan kind (`default_time_limit_s`). `graph_where` names the graph in
    errors about it (a path for the CLI); `method_here=False`: the method runs elsewhere (a
    service, which may have plugins) and is checked there."""
    source = request_graph(graph, graph_where)
    options = dict(options or {})
    if method_here:
        check_method(method, options)
    machine = with_host_memory(resolve_resources(resources), host_memory)
    budget_bytes = resolve_budget(budget, source, machine, method=method, options=options)
    if method_here:
        check_offload(source, method, machine, graph_where)
        check_pipeline(source, budget_bytes, method, options, machine)
        check_fsdp(source, method, options)
    return ResolvedRequest(
        source=source,
        budget_bytes=budget_bytes,
        method=method,
        options=options,
        resources=machine,
        time_limit_s=default_time_limit_s(method) if time_limit is None
        else check_time_limit(time_limit, "time_limit"),
        threads=threads,
        seed=seed,
    )


def default_time_limit_s(method: str) -> float:
    """The time limit of a request that gives none (planner.core.limits says why two): a
    pipeline method's `DEFAULT_PIPELINE_TIME_LIMIT_S`, any other's (a plugin's too)
    `DEFAULT_TIME_LIMIT_S`."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    return DEFAULT_PIPELINE_TIME_LIMIT_S if spec is not None and spec.pipeline \
        else DEFAULT_TIME_LIMIT_S


def request_graph(
    graph: Graph | RequestGraph | Mapping[str, Any], where: str = "graph"
) -> RequestGraph:
    """A Graph, a graph document (graph.json, a Checkmate/Moccasin file or a chain.json;
    errors name `where`), or a RequestGraph as it is."""
    if isinstance(graph, RequestGraph):
        return graph
    if isinstance(graph, Mapping):
        from planner.engine.inputs import graph_from_dict

        return RequestGraph.given(graph_from_dict(dict(graph), where))
    return RequestGraph.given(graph)


def stored_request(graph: Graph, values: Mapping[str, Any]) -> ResolvedRequest:
    """A request resolved before (at a service's submission), from the values its job keeps:
    `budget_bytes`, `method`, `options`, `resources` (the normalised document of
    `ResolvedRequest.resources_document`), `time_limit_s`, `threads`, `seed`. Nothing is parsed
    or checked again; the machine is rebuilt from its document."""
    document = values.get("resources")
    return ResolvedRequest(
        source=RequestGraph.given(graph),
        budget_bytes=int(values["budget_bytes"]),
        method=str(values["method"]),
        options=dict(values.get("options") or {}),
        resources=None if document is None else Resources.model_validate(document),
        time_limit_s=float(values["time_limit_s"]),
        threads=int(values.get("threads", 2)),
        seed=int(values.get("seed", 0)),
    )


def check_method(method: str, options: Mapping[str, Any] | None = None) -> None:
    """InputError for a method that does not exist or cannot be loaded here (field `method`),
    or options it does not take (`options.<key>`, planner.engine.options)."""
    from planner.engine.options import check_options
    from planner.engine.registry import load_method

    try:
        load_method(method)
    except ImportError as e:
        raise InputError(f"{method!r} is not available here: {e}", field="method") from None
    except InputError as e:  # "unknown method 'x'; choose one of: ..."
        raise (e if e.field else InputError(str(e), field="method")) from None
    check_options(method, options or {}, "options")  # errors name options.<key>


def resolve_resources(value: ResourcesInput) -> Resources | None:
    """The machine: a preset name (str), a resources.json document (a mapping), a resources.json
    file (a Path: the CLI's; a service never reads files) or Resources; errors name
    `resources` (a file's errors name the file)."""
    if value is None or isinstance(value, Resources):
        return value
    if isinstance(value, Path):
        return load_resources(value)
    if isinstance(value, Mapping):
        value = dict(value)
    return resources_from_dict(value, where="resources")


def with_host_memory(
    resources: Resources | None, host_memory: str | int | None
) -> Resources | None:
    """`resources` with host_memory_bytes set (bytes, with a unit when written; > 0); field
    `host_memory`."""
    if host_memory is None:
        return resources
    spec = parse_budget_spec(host_memory, "host_memory")
    if spec.bytes is None:
        raise InputError(
            f"{host_memory!r}: give bytes with a unit (e.g. 256GiB), not a fraction of the "
            "store-all peak", field="host_memory",
        )
    if resources is None:
        raise InputError(
            "needs resources naming the machine and its host links (e.g. h100-pcie-gen5)",
            field="host_memory",
        )
    doc = {**resources.model_dump(mode="json"), "host_memory_bytes": spec.bytes}
    return resources_from_dict(doc, where="host_memory")


def resolve_budget(
    budget: str | int | float | None,
    graph: Graph | RequestGraph | None,
    resources: Resources | None = None,
    *,
    method: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> int:
    """Bytes of device memory (field `budget`): the budget grammar, a relative budget taken of
    the graph's store-all peak (read only then) — for an FSDP method, of one rank's peak with
    every block kept (FSDP2's defaults: `fsdp_reference_peak_bytes`), since a rank holds
    neither the whole model nor one device's activations; without a budget, the machine's
    device memory (field `resources` when it names none)."""
    if budget is None:
        if resources is None:
            raise InputError(
                "missing; give a budget (80%, 0.8, 11GiB) or resources that name a device "
                "(e.g. h100-pcie-gen5)", field="budget",
            )
        memory = resources.require_device_memory_bytes("resources")
        if memory > MAX_BUDGET_BYTES:
            raise InputError(
                f"device_memory_bytes {memory}: over the largest budget of {MAX_BUDGET_BYTES} "
                "bytes (1 EiB)", field="resources",
            )
        return memory
    spec = parse_budget_spec(budget, "budget")
    if not spec.needs_reference:
        return spec.resolve(None, "budget")
    from planner.solvers.baselines import store_all_peak_bytes

    reference = None
    if graph is not None:
        g = graph.graph if isinstance(graph, RequestGraph) else graph
        reference = (fsdp_reference(g, method, options, resources) if method is not None
                     else None) or store_all_peak_bytes(g)
    return spec.resolve(reference, "budget")


def fsdp_reference(graph: Graph, method: str, options: Mapping[str, Any] | None,
                   resources: Resources | None) -> int | None:
    """An FSDP method's reference for a relative budget (one rank, every block kept); None
    for any other method."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    if spec is None or not spec.fsdp:
        return None
    from planner.engine.fsdp_solve import check_fsdp_request, fsdp_reference_peak_bytes

    check_fsdp_request(graph, options)  # the profile first: its error names the graph
    return fsdp_reference_peak_bytes(graph, options, resources)


# A pipeline problem's fields as a plan request says them (the machine is its resources).
PIPELINE_FIELDS = {"devices": "resources.device_count", "microbatches": "resources.microbatches",
                   "schedule": "resources.pipeline_schedule", "device_memory": "budget",
                   "split": "options.split", "chunks": "options.chunks"}


def check_pipeline(source: RequestGraph, budget_bytes: int, method: str,
                   options: Mapping[str, Any], resources: Resources | None) -> None:
    """For a pipeline method, what its solve would refuse before searching (the machine, more
    stages than layers, a given split; planner.engine.partition), named as request fields; the
    graph is read only for a pipeline method."""
    from planner.engine.pipeline_solve import check_pipeline_request
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    if spec is None or not spec.pipeline:
        return
    try:
        check_pipeline_request(source.graph, budget_bytes, method, options, resources)
    except InputError as e:
        raise InputError(e.detail, field=PIPELINE_FIELDS.get(e.field or "", e.field)) from None


def check_fsdp(source: RequestGraph, method: str, options: Mapping[str, Any]) -> None:
    """For an FSDP method, what its solve would refuse before searching: a graph without an
    FSDP block profile for the ranks asked (field `graph`), depths that do not read
    (`options.depths`); the graph is read only for an FSDP method."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    if spec is None or not spec.fsdp:
        return
    from planner.engine.fsdp_solve import check_fsdp_request

    check_fsdp_request(source.graph, options)


def check_offload(
    source: RequestGraph, method: str, resources: Resources | None, graph_where: str = "graph"
) -> None:
    """The offload pre-check (planner.engine.offload_checks); the graph is read only for an
    offload method."""
    from planner.engine.offload_checks import check_offload_request, is_offload_method

    if not is_offload_method(method):
        return
    check_offload_request(source.graph, method, resources, graph_where=graph_where,
                          resources_where="resources")
