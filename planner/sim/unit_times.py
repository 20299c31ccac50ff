"""The time rule of per-unit policies inside a pipeline stage (planner.sim.stage_policies): an
offloaded unit's copies and the backward's recomputed forwards, as the runtime issues them
(planner.runtime.pipeline_units): every host copy is made on the stage's own stream when
autograd saves the tensor, and every reload when a backward node unpacks it, so a copy holds
the stage's compute for its whole transfer (on a GPU a non-blocking copy on the compute stream
is ordered with its kernels; on CPU it is a memcpy on the same thread). Each copy pays the
link's latency once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from planner.core.pipeline_actions import UnitPolicy
from planner.core.resources import Link

if TYPE_CHECKING:
    from planner.sim.stage_policies import StageFacts


def copies_ms(link: Link, nbytes: int, copies: int) -> float:
    """`copies` transfers of `nbytes` in all over `link`, one after another (none: 0)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / link.bandwidth_bytes_per_s * 1e3 + max(1, copies) * link.latency_s * 1e3


def forward_with_copies(facts: StageFacts, host: Mapping[str, int], copies: Mapping[str, int],
                        d2h: Link | None) -> float:
    """F's time: compute in order, each offloaded unit's device-to-host copies (`host`: its
    bytes, `copies`: how many) in the stage's stream."""
    clock = facts.rest_forward_ms + sum(u.forward_ms for u in facts.units)
    if d2h is None:
        return clock
    return clock + sum(copies_ms(d2h, nbytes, copies.get(name, 1))
                       for name, nbytes in host.items())


def backward_with_reloads(facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                          h2d: Link | None, reruns: Mapping[str, float],
                          host: Mapping[str, int], copies: Mapping[str, int]) -> float:
    """B's (or I's) time: each unit's backward, its recomputed forward first (`reruns`: a
    selective unit's) and an offloaded unit's reloads in the stage's stream."""
    clock = facts.rest_backward_ms
    for u in facts.units:
        policy = chosen[u.name]
        if policy == "offload" and h2d is not None:
            clock += copies_ms(h2d, host[u.name], copies.get(u.name, 1))
        if policy == "recompute":
            clock += reruns.get(u.name, u.rerun_ms)
        clock += u.backward_ms
    return clock
