"""A request resolved by the upload pool (planner.api.uploads), handed to its route.

A large body is parsed, validated, hashed and resolved in a pool process; the API process
stores the graph and runs the route on a small body that names the graph by its id. The route's
`PlanService.resolve_plan` / `resolve_sweep` then take the pool's resolution from `PREPARED`
(a context variable: set for this request's task only, copied into its handler thread) instead
of loading the graph again.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.engine.request import ResolvedRequest


@dataclass(frozen=True)
class Prepared:
    """What a pool process made of a large body: the graph (canonical JSON, hash, size), the
    resolved requests' values (as a job keeps them: planner.engine.request.stored_request),
    and the small body the route reads instead (None: the middleware answers itself)."""

    graph_hash: str
    document: str = field(repr=False)
    nodes: int
    edges: int
    values: list[dict[str, Any]]
    body: bytes | None = None
    path: str | None = None  # the route that reads `body` (a partition is a plan request)
    tenant: str = ""

    def requests(self, load: Callable[[], Graph]) -> list[ResolvedRequest]:
        """The resolved requests; their graph is read (`load`) only if something needs it."""
        from planner.core.resources import Resources
        from planner.engine.request import RequestGraph, ResolvedRequest

        source = RequestGraph(self.graph_hash, load)
        return [
            ResolvedRequest(
                source=source,
                budget_bytes=int(v["budget_bytes"]),
                method=str(v["method"]),
                options=dict(v.get("options") or {}),
                resources=None if v.get("resources") is None
                else Resources.model_validate(v["resources"]),
                time_limit_s=float(v["time_limit_s"]),
                threads=int(v.get("threads", 2)),
                seed=int(v.get("seed", 0)),
            )
            for v in self.values
        ]


def request_values(request: ResolvedRequest) -> dict[str, Any]:
    """A resolved request's values, as `Prepared.requests` reads them back."""
    return {"budget_bytes": request.budget_bytes, "method": request.method,
            "options": dict(request.options), "resources": request.resources_document(),
            "time_limit_s": request.time_limit_s, "threads": request.threads,
            "seed": request.seed}


PREPARED: ContextVar[Prepared | None] = ContextVar("planner_prepared", default=None)
