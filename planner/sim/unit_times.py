"""The time rule of per-unit policies inside a pipeline stage (planner.sim.stage_policies): an
offloaded unit's copies on the rank's host links, FIFO, and the backward's recomputed forwards
and reload waits, in module order (the rule is stated in stage_policies' module doc)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from planner.core.pipeline_actions import UnitPolicy
from planner.core.resources import Link

if TYPE_CHECKING:
    from planner.sim.stage_policies import StageFacts


def forward_with_copies(facts: StageFacts, host: Mapping[str, int], d2h: Link | None) -> float:
    """F's end: compute in order, each offloaded unit's d2h copy (`host`: its bytes) FIFO after
    its forward."""
    clock = facts.rest_forward_ms
    link = 0.0
    for u in facts.units:
        clock += u.forward_ms
        if u.name in host and d2h is not None:
            link = max(link, clock) + d2h.transfer_ms(host[u.name])
    return max(clock, link)


def backward_with_reloads(facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                           h2d: Link | None, reruns: Mapping[str, float],
                           host: Mapping[str, int]) -> float:
    """B's compute with recomputed forwards (`reruns`: a selective unit's) and reload waits
    (reverse module order)."""
    clock = 0.0
    release = 0.0  # when the previous offloaded unit's backward ended (its reload freed)
    for u in reversed(facts.units):
        policy = chosen[u.name]
        if policy == "offload" and h2d is not None:
            clock = max(clock, release + h2d.transfer_ms(host[u.name]))
        if policy == "recompute":
            clock += reruns.get(u.name, u.forward_ms)
        clock += u.backward_ms
        if policy == "offload":
            release = clock
    return clock + facts.rest_backward_ms
