"""Choose an FSDP plan: per block a policy (keep / selective / full) and a reshard flag, and a
prefetch depth, for the fastest step `planner.sim.fsdp.simulate_fsdp` predicts within a per-rank
budget (the rank's whole peak: sharded state plus the step's peak).

- Exact (`status` "optimal"): every plan of the space when it has at most `exact_limit` plans
  (6^blocks x depths: four blocks and the depths 0, 1, 2 are 3,888 simulations).
- Otherwise a local search ("heuristic"): from each hand setting (planner.sim.fsdp.hand_plans)
  and the all-keep plan at every depth, first the change that saves the most bytes per
  millisecond lost until the plan fits, then single-block changes that make it faster while it
  fits, until none does.
- Nothing fits: status "infeasible" with the least-memory plan found and its peak
  (`least_peak_bytes`): the smallest budget this search knows to work.

`lower_bound_ms` is a bound on any plan's step: the head, tail and every block's fastest
measured forward and backward, summed (a step is never shorter than its compute).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.sim.fsdp import (
    POLICIES,
    FsdpModel,
    FsdpPlan,
    FsdpResult,
    LinkSpec,
    hand_plans,
    simulate_fsdp,
)

CHOICES = tuple((p, r) for p in POLICIES for r in (True, False))


@dataclass(frozen=True)
class FsdpSolution:
    plan: FsdpPlan
    result: FsdpResult
    status: str  # optimal | heuristic | infeasible
    budget_bytes: int
    lower_bound_ms: float
    evaluated: int  # plans simulated
    least_peak_bytes: int  # the least peak among the plans simulated

    @property
    def fits(self) -> bool:
        return self.result.peak_bytes <= self.budget_bytes

    def text(self) -> str:
        r = self.result
        return (f"{self.status}: {self.plan.text()}; peak {r.peak_bytes:,} B per rank "
                f"(budget {self.budget_bytes:,}), step {r.step_ms:.3f} ms "
                f"(bound {self.lower_bound_ms:.3f}), {self.evaluated} plans simulated")


def lower_bound_ms(model: FsdpModel) -> float:
    head_tail = (model.head_forward.ms + model.tail_forward.ms + model.tail_backward.ms
                 + model.head_backward.ms)
    return head_tail + sum(min(b.forward[p].ms + b.backward[p].ms for p in b.forward)
                           for b in model.blocks)


def solve_fsdp(model: FsdpModel, budget_bytes: int, world: int, link: LinkSpec,
               backend: str = "nccl", depths: Sequence[int] = (0, 1, 2),
               exact_limit: int = 20_000) -> FsdpSolution:
    """The fastest simulated plan within `budget_bytes` per rank (see the module docstring)."""
    nb = len(model.blocks)
    if nb == 0:
        raise ValueError("the model has no blocks to plan")
    depths = tuple(sorted({d for d in depths if d >= 0})) or (1,)
    policies = tuple(p for p in POLICIES if all(p in b.forward for b in model.blocks))
    choices = tuple((p, r) for p, r in CHOICES if p in policies)
    evaluated = 0
    best: tuple[float, int, FsdpPlan, FsdpResult] | None = None
    least: tuple[int, float, FsdpPlan, FsdpResult] | None = None

    def judge(plan: FsdpPlan) -> FsdpResult:
        nonlocal evaluated, best, least
        evaluated += 1
        res = simulate_fsdp(model, plan, world, link, backend)
        key_least = (res.peak_bytes, res.step_ms)
        if least is None or key_least < (least[0], least[1]):
            least = (res.peak_bytes, res.step_ms, plan, res)
        if res.peak_bytes <= budget_bytes:
            key = (res.step_ms, res.peak_bytes)
            if best is None or key < (best[0], best[1]):
                best = (res.step_ms, res.peak_bytes, plan, res)
        return res

    space = len(choices) ** nb * len(depths)
    if space <= exact_limit:
        for d in depths:
            for combo in itertools.product(choices, repeat=nb):
                judge(FsdpPlan(tuple(c[0] for c in combo), tuple(c[1] for c in combo), d))
        status = "optimal"
    else:
        starts = [FsdpPlan.uniform(nb, "keep", reshard=False, prefetch=d) for d in depths]
        starts += [p for d in depths for p in hand_plans(nb, d).values()
                   if set(p.policies) <= set(policies)]
        for start in starts:
            _local_search(start, choices, judge, budget_bytes)
        status = "heuristic"
    bound = lower_bound_ms(model)
    assert least is not None
    if best is None:
        return FsdpSolution(least[2], least[3], "infeasible", budget_bytes, bound, evaluated,
                            least[0])
    return FsdpSolution(best[2], best[3], status, budget_bytes, bound, evaluated, least[0])


def _neighbours(plan: FsdpPlan, choices: Sequence[tuple[str, bool]]) -> list[FsdpPlan]:
    out = []
    for i in range(len(plan.policies)):
        for p, r in choices:
            if (p, r) != (plan.policies[i], plan.reshard[i]):
                pol = list(plan.policies)
                res = list(plan.reshard)
                pol[i], res[i] = p, r
                out.append(FsdpPlan(tuple(pol), tuple(res), plan.prefetch))
    return out


def _local_search(start: FsdpPlan, choices: Sequence[tuple[str, bool]],
                  run: Callable[[FsdpPlan], FsdpResult], budget: int) -> None:
    plan, res = start, run(start)
    # 1. until it fits: the change saving the most bytes per millisecond lost
    while res.peak_bytes > budget:
        best_score, best_step = None, None
        for cand in _neighbours(plan, choices):
            r = run(cand)
            saved = res.peak_bytes - r.peak_bytes
            if saved <= 0:
                continue
            score = saved / max(r.step_ms - res.step_ms, 1e-9)
            if best_score is None or score > best_score:
                best_score, best_step = score, (cand, r)
        if best_step is None:
            return
        plan, res = best_step
    # 2. while it fits: the single change that makes it fastest and still fits
    while True:
        improved = None
        for cand in _neighbours(plan, choices):
            r = run(cand)
            if r.peak_bytes <= budget and r.step_ms < res.step_ms - 1e-12 and (
                    improved is None or r.step_ms < improved[1].step_ms):
                improved = (cand, r)
        if improved is None:
            return
        plan, res = improved
