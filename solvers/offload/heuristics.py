"""Offloading heuristics on a fixed compute order (store-all unless a base plan is given).

- `offload_all`: what torchtune's OffloadActivations and `torch.autograd.graph.save_on_cpu` do:
  every saved activation of at least `min_bytes` goes to the host as soon as it is produced,
  its device copy is freed after its last forward use, and it comes back one operation before
  its first backward use. Not budget-aware: its peak is what it is.
- `offload_greedy`: DeepSpeed DeepCompile's pass: offload everything, bring back the largest
  tensors while the plan still fits, and start each reload just early enough that the compute
  in between covers its copy (the serial h2d stream included).
- `beaumont`: two heuristics after Beaumont, Eyraud-Dubois and Shilova (Euro-Par 2020), who
  show the problem NP-hard in the strong sense and derive heuristics from relaxations. Our
  reading, our code:
  * divisible relaxation: when activations may be split, sending data in production order as
    early as the d2h link allows and bringing it back in reverse order as late as possible is
    optimal (an exchange argument on the two serial links). Rounded: offload whole windows in
    production order, the shortest prefix that fits, reloads scheduled backwards on the h2d
    link (`jit_positions`).
  * bandwidth relaxation: bytes offloadable are capped by bandwidth × overlappable compute, so
    windows are ranked by how well their copies hide (idle compute / copy time, round trip),
    largest first among equals; the shortest fitting prefix again.
  Both then bring back windows whose copies do not pay for themselves and stretch prefetch
  leads where memory allows; the faster plan by the simulator wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.plan import Action
from planner.solvers.offload.schedule import (
    Window,
    find_windows,
    fixed_lead_positions,
    with_offloads,
)
from planner.solvers.offload.search import Judge, Judged, better, fit_with_offloads, plan_for

DEFAULT_MIN_BYTES = 1024  # torchtune's min_offload_size


@dataclass(frozen=True)
class HeuristicResult:
    best: Judged | None  # the plan (fitting or, failing that, the closest to fitting)
    source: str
    windows: int  # offloadable windows of the base plan


def offload_all(judge: Judge, base: Sequence[Action],
                min_bytes: int = DEFAULT_MIN_BYTES) -> HeuristicResult:
    # one window per tensor: reloaded at its first backward use, kept until its last
    windows = find_windows(judge.graph, base, min_bytes=min_bytes, per_interval=1)
    positions = fixed_lead_positions(base, windows, computes_ahead=1)
    return HeuristicResult(judge(with_offloads(base, windows, positions)), "offload-all",
                           len(windows))


def offload_greedy(judge: Judge, base: Sequence[Action], deadline: float) -> HeuristicResult:
    import time

    windows = find_windows(judge.graph, base, per_interval=1)
    current = plan_for(judge, base, windows)
    if current is None or not current.fits:
        return HeuristicResult(current, "offload-greedy", len(windows))
    chosen = list(windows)
    for w in sorted(windows, key=lambda w: -w.nbytes):  # bring back the largest that fit
        if time.perf_counter() >= deadline:
            break
        trial = [c for c in chosen if c is not w]
        got = plan_for(judge, base, trial)
        if got is not None and got.fits:
            chosen, current = trial, got
    return HeuristicResult(current, "offload-greedy", len(windows))


def _round_trip_ms(judge: Judge, w: Window) -> float:
    r = judge.resources
    assert r.d2h is not None and r.h2d is not None
    return r.d2h.transfer_ms(w.nbytes) + r.h2d.transfer_ms(w.nbytes)


def hide_ratio(judge: Judge, w: Window) -> float:
    """Idle compute in the window over the copies' round trip: ≥ 1 hides completely."""
    trip = _round_trip_ms(judge, w)
    return w.idle_ms / trip if trip > 0 else float("inf")


def bandwidth_first(judge: Judge, base: Sequence[Action], deadline: float) -> Judged | None:
    """The bandwidth-relaxation heuristic alone (the cheaper half of `beaumont`)."""
    return fit_with_offloads(
        judge, base, lambda w: (-min(hide_ratio(judge, w), 1.0), -w.nbytes, w.produced_ms),
        deadline, bring_back=lambda w: (hide_ratio(judge, w), w.nbytes))


def beaumont(judge: Judge, base: Sequence[Action], deadline: float) -> HeuristicResult:
    import time

    windows = find_windows(judge.graph, base)
    if not windows:
        return HeuristicResult(judge(list(base)), "beaumont", 0)
    now = time.perf_counter()
    half = now + (deadline - now) / 2

    def poor_first(w: Window) -> tuple[float, int]:  # bring back the worst-hidden copies first
        return (hide_ratio(judge, w), w.nbytes)

    divisible = fit_with_offloads(judge, base, lambda w: (w.produced_ms, w.node), half,
                                  windows=windows, bring_back=poor_first)
    bandwidth = None
    if time.perf_counter() < deadline:
        bandwidth = fit_with_offloads(
            judge, base, lambda w: (-min(hide_ratio(judge, w), 1.0), -w.nbytes, w.produced_ms),
            deadline, windows=windows, bring_back=poor_first)
    best = better(divisible, bandwidth)
    source = "beaumont:divisible" if best is divisible else "beaumont:bandwidth"
    return HeuristicResult(best, source, len(windows))
