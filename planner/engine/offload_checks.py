"""Bad offload requests, refused before any solver runs: one line naming the input and what to do
(InputError: exit 2 in the CLI, HTTP 422 in the service).

- an offload method (its spec says `needs_host_tier`) asked for on a machine with no host tier
  (no resources, `host_memory_bytes` 0 or unset, or no links);
- a graph on which nothing may be offloaded (every node `offloadable: false`, or only views),
  asked for with an offload method.
Links of zero or negative bandwidth, and resources files that name no device, are refused when
the resources are read (planner.core.resources); a host budget smaller than what a given plan parks
is refused by the simulator, naming the action where host memory overflows (simulate, validate,
planner.runtime.apply), and by `planner-cli solve` when an offload planner reports that its plan
needs
more host memory than given (`least_host_memory_bytes`).
"""

from __future__ import annotations

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.resources import Resources
from planner.sim.ledger import MemoryLedger


def is_offload_method(method: str) -> bool:
    """Whether `method` offloads to host memory: its spec needs a host tier (plugins have no
    spec: they are not checked)."""
    from planner.engine.registry import method_spec

    spec = method_spec(method)
    return spec is not None and spec.needs_host_tier


def offloadable_nodes(graph: Graph) -> list[int]:
    """Nodes whose output may be copied to the host: a storage of their own (not a view, bytes
    the ledger charges as the output's: a gradient held to the step's end has none to move),
    not marked offloadable: false. What the offload planners' windows consider."""
    ledger = MemoryLedger.of(graph)
    return [
        n.id for n in graph.nodes
        if not ledger.is_view(n.id) and ledger.storage_bytes[n.id] > 0 and n.offloadable
    ]


def check_offload_request(
    graph: Graph,
    method: str,
    resources: Resources | None,
    *,
    graph_where: str = "graph",
    resources_where: str = "resources",
) -> None:
    """Raise InputError (its field `resources_where` or `graph_where`) when `method` offloads
    and the graph or the machine leaves it nothing to do; a no-op for every other method."""
    if not is_offload_method(method):
        return
    if resources is None:
        raise InputError(
            f"missing; method {method} offloads to host memory: give a machine with a host "
            "tier, e.g. the preset h100-pcie-gen5 with host_memory_bytes in a resources.json",
            field=resources_where,
        )
    if not resources.has_host_tier:
        got = resources.host_memory_bytes
        what = "unset" if got is None else f"{got}"
        raise InputError(
            f"host_memory_bytes is {what}: method {method} offloads to host memory and needs a "
            "host budget > 0 (e.g. {\"preset\": \"h100-pcie-gen5\", \"host_memory_bytes\": "
            "68719476736})",
            field=resources_where,
        )
    if not offloadable_nodes(graph):
        marked = sum(1 for n in graph.nodes if not n.offloadable)
        why = (
            f"all {marked} nodes with an output are marked offloadable: false"
            if marked else "no node has an output of its own (only views)"
        )
        raise InputError(
            f"nothing can be offloaded ({why}): method {method} cannot help; use a remat "
            "method (e.g. auto) or mark nodes offloadable",
            field=graph_where,
        )
