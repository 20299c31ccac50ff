"""The agent's plan cache: plan.json files keyed by graph hash, method and budget."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from planner.core.errors import InputError
from planner.core.graph import Graph
from planner.core.io import plan_from_dict, write_json
from planner.core.plan import Plan, PlanStatus

log = logging.getLogger("planner.runtime.agent")

USABLE = (PlanStatus.optimal, PlanStatus.feasible)


def default_cache_dir() -> Path:
    env = os.environ.get("PLANNER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "planner" / "plans"


class PlanCache:
    """plan.json files under `root/<graph hash>/<method>-<budget>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, graph: Graph, budget_bytes: int, method: str) -> Path:
        digest = graph.content_hash().split(":")[-1][:40]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in method)
        return self.root / digest / f"{safe}-{budget_bytes}.json"

    def get(self, graph: Graph, budget_bytes: int, method: str) -> Plan | None:
        path = self.path_of(graph, budget_bytes, method)
        if not path.is_file():
            return None
        try:
            import json

            plan = plan_from_dict(json.loads(path.read_text()), where=str(path))
        except (InputError, ValueError, OSError) as e:
            log.warning("ignoring unreadable cached plan %s: %s", path, e)
            return None
        if plan.graph_hash != graph.content_hash() or plan.status not in USABLE:
            return None
        return plan

    def put(self, graph: Graph, budget_bytes: int, method: str, plan: Plan) -> None:
        path = self.path_of(graph, budget_bytes, method)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, plan)
        except (InputError, OSError) as e:  # a cache that cannot be written is not fatal
            log.warning("cannot cache the plan at %s: %s", path, e)
