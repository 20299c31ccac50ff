"""One stage's remat/offload choice: the small knapsack of the whole-job planner.

For stage s = units [i, j) of the chain with k micro-batches in flight, choose per module
(planner.sim.stage_policies: keep, recompute, offload) the least added time such that the
stage's peak fits `cap` bytes and its host bytes fit `host_cap` (k in-flight copies).

Exact over the additive model, then checked by the simulator's rule: each module's effect is
bounded by additive figures (`Item`, planner.solvers.pipeline.stage_items): a non-keep module
frees at least its `exclusive` saved bytes (roots no other part of the stage keeps) per
micro-batch; recompute adds at most its inputs' bytes; offload puts its host copies on the
host; the transient is at most the largest of the all-keep stage's, the F's working bytes with
nothing kept but what the stage must keep (`forward_bytes`), and each non-keep module's
backward working bytes under its policy with nothing else kept (the simulator's rules,
planner.sim.stage_policies, only fall when more is kept). A dynamic programme over the modules
keeps the Pareto frontier of (bytes per micro-batch, offloaded bytes, largest non-keep
transient, estimated ms, and under zero-bubble I/W the recompute modules' W reruns, summed):
every peak it accepts is an upper bound of the simulator's, so the answer fits. Besides the
three whole-module policies, each module offers op-level options
(planner.solvers.pipeline.op_options: selective checkpoints and partial offloads). Each
module's time is the simulator's (planner.sim.unit_times: a rerun, or the copies out and back,
add to the stage's stream), so the fastest fitting frontier points are the fastest plans of the
additive model; the fastest few are checked with `policy_stage_costs`. The frontier
(planner.solvers.pipeline.frontier: its Pareto filter, its cut, and a screen dropping states no
completion can fit) stays near linear in its size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.core.pipeline_actions import UnitPolicy
from planner.sim.rank_memory import mixed_stage_peak_bytes
from planner.sim.stage_costs import StageCosts, one_stage_peak_bytes
from planner.sim.stage_policies import StageFacts, policy_stage_costs
from planner.solvers.pipeline.frontier import ZERO, FitScreen, State, cut, pareto
from planner.solvers.pipeline.op_options import (
    OpOption,
)
from planner.solvers.pipeline.problem import PipelineProblem
from planner.solvers.pipeline.stage_items import Item, TimeUp, forward_bytes, items

FRONTIER_WORK = 24000  # states kept per module times modules (beyond: not proven least)
FRONTIER_LIMITS = (300, 3000)  # the least and most states kept per module
# with a host tier (three policies and partial offloads a module: far larger frontiers, each
# knapsack several times slower) the limits that let a GPT-48 search judge as many splits in
# its time limit as without one
HOST_FRONTIER_WORK, HOST_FRONTIER_MOST = 6000, 1000
EXACT_CHECKS = 6  # frontier points, fastest first, whose bytes the simulator's rule checks
QUICK_CHECKS = 2  # the same for whole-module knapsacks (a first estimate: the quick pass, DP costs)
OP = "op"  # a choice "op<k>": the module's k-th op-level option (op_options.OpOption)


@dataclass(frozen=True)
class StageChoice:
    """The chosen policies (non-keep modules only), the stage's effective costs and figures."""

    policies: tuple[tuple[str, UnitPolicy], ...]
    costs: StageCosts
    host_bytes: int
    added_ms: float  # forward + backward over the all-keep stage
    peak_bytes: int  # one_stage_peak_bytes of the effective costs
    exact: bool  # the frontier was never cut
    saved_ops: tuple[tuple[str, tuple[str, ...]], ...] = ()  # selective recompute modules
    offload_ops: tuple[tuple[str, tuple[str, ...]], ...] = ()  # partially offloaded modules
    whole_stage: bool = False  # no policies: the stage reruns its whole forward in every
    # micro-batch's backward, keeping only its input (PipelineStage.recompute_microbatches)
    mix: StageMix | None = None  # faster: this plan in some micro-batches, another in the rest

    @property
    def mean_added_ms(self) -> float:
        """The added time per micro-batch, with the mix where there is one."""
        return self.added_ms if self.mix is None else self.mix.added_ms


@dataclass(frozen=True)
class StageMix:
    """The light plan in most micro-batches, the heavy one (a StageVariant) in `slots` of
    every `inflight` consecutive ones."""

    light: StageChoice
    heavy: StageChoice
    slots: int
    inflight: int
    added_ms: float  # the mean over the step's micro-batches
    peak_bytes: int

    @property
    def window_host_bytes(self) -> int:
        """Host bytes of the micro-batches in flight: (inflight - slots) light, slots heavy."""
        return ((self.inflight - self.slots) * self.light.host_bytes
                + self.slots * self.heavy.host_bytes)

    def heavy_microbatches(self, microbatches: int) -> list[int]:
        """The micro-batches running the heavy plan: the first `slots` of every `inflight`."""
        return variant_microbatches(microbatches, self.inflight, self.slots)


def variant_microbatches(microbatches: int, inflight: int, slots: int) -> list[int]:
    """Micro-batch j runs the variant when j mod `inflight` < `slots`."""
    return [j for j in range(microbatches) if j % inflight < slots]


Mixer = Callable[["PipelineProblem", int, float, int, StageChoice,
                  "list[tuple[State, StageCosts]]", "Callable[[State], StageChoice]"],
                 "StageMix | None"]  # planner.solvers.pipeline.stage_mix.best_mix


def choose(
    problem: PipelineProblem,
    facts: StageFacts | None,
    base: StageCosts,
    inflight: int,
    cap: float,
    host_cap: int,
    op_level: bool = True,
    deadline: float | None = None,
    mixer: Mixer | None = None,
    figures: list[Item] | None = None,
) -> StageChoice | None:
    """The fastest policies whose stage peak fits `cap` (None: none does; facts None: only
    the all-keep stage is tried; `op_level` False: whole-module policies only, faster).
    `mixer` (planner.solvers.pipeline.stage_mix.best_mix): also the fastest mix of two
    frontier plans over the micro-batches in flight (StageChoice.mix) where it beats the one
    plan. `figures`: `items` for these facts, flags and host tier, when already made.
    TimeUp past `deadline` (perf_counter)."""
    m = problem.microbatches
    split = problem.plan_schedule.split_backward  # I/W: the rank's zero-bubble rules
    keep_peak = one_stage_peak_bytes(base, inflight, microbatches=m, split_backward=split)
    if keep_peak <= cap:
        return StageChoice((), base, 0, 0.0, keep_peak, True)
    if facts is None:
        return None
    res = problem.resources
    host = res is not None and res.has_host_tier and host_cap > 0
    options: tuple[str, ...] = ("keep", "recompute", "offload") if host else (
        "keep", "recompute")
    frontier = [ZERO]
    exact = True
    if figures is None:
        figures = items(problem, facts, split and not base.first_stage, op_level, host)
    steps = [undominated([_grow(ZERO, it, p) for p in options + tuple(
        f"{OP}{k}" for k, o in enumerate(it.ops) if host or o.policy != "offload")])
        for it in figures]
    # where every copy is dominated (recomputing frees as much for less), the knapsack is the
    # one without a host tier: its limits too
    copies = any(st.offload_bytes for mine in steps for st in mine)
    work, most = (HOST_FRONTIER_WORK, HOST_FRONTIER_MOST) if copies else (
        FRONTIER_WORK, FRONTIER_LIMITS[1])
    limit = min(max(work // max(1, len(figures)), FRONTIER_LIMITS[0]), most)
    forward = forward_bytes(problem, facts)
    mixes = mixer is not None and inflight >= 2 and m >= 2  # as stage_mix.best_mix
    screen = _fit_screen(problem, base, forward, inflight, cap, host_cap, figures, host, mixes)
    for n, mine in enumerate(steps):
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeUp
        frontier = pareto(_grown(frontier, mine, screen, n + 1))
        if len(frontier) > limit:
            exact = False
            frontier = cut(frontier, inflight, limit)
    fitting = [st for st in frontier if inflight * st.offload_bytes <= host_cap
               and one_stage_peak_bytes(bound_costs(base, forward, st), inflight,
                                        microbatches=m, split_backward=split) <= cap]
    def exact_of(st: State) -> StageChoice:
        """The state's policies under the simulator's rule (peak: all in flight run it)."""
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeUp  # the rule's costs take a while: not begun past the limit
        policies, saved_ops, offload_ops = _policies(figures, st.choice)
        got = policy_stage_costs(problem.graph, facts, base, dict(policies), res,
                                 dict(saved_ops), dict(offload_ops))
        c = got.costs
        peak = one_stage_peak_bytes(c, inflight, microbatches=m, split_backward=split)
        added = (c.forward_ms - base.forward_ms) + (c.backward_ms - base.backward_ms) + (
            c.backward_weight_ms - base.backward_weight_ms if split else 0.0)  # W's reruns
        return StageChoice(policies, c, got.host_bytes, added, peak, exact, saved_ops,
                           offload_ops)

    best: StageChoice | None = None
    for st in _to_check(fitting)[:EXACT_CHECKS if op_level else QUICK_CHECKS]:
        got = exact_of(st)
        if got.peak_bytes > cap or inflight * got.host_bytes > host_cap:  # pragma: no cover
            continue  # the bounds hold
        if best is None or (got.added_ms, got.peak_bytes) < (best.added_ms, best.peak_bytes):
            best = got
    if best is not None and mixer is not None:
        found = mixer(problem, inflight, cap, host_cap, best,
                      [(st, bound_costs(base, forward, st)) for st in frontier], exact_of)
        if found is not None:
            best = replace(best, mix=found)
    return best


def _fit_screen(problem: PipelineProblem, base: StageCosts, forward: int, inflight: int,
                cap: float, host_cap: int, figures: list[Item], host: bool,
                mixes: bool) -> FitScreen:
    """The knapsack's screen: a state's peak bound with the least saved bytes the modules
    left can reach, alone or (`mixes`) in one of k in-flight micro-batches beside the
    lightest plan there could be in the others, which bounds every mix it can join
    (stage_mix: either plan of a mix runs in 1 to k - 1 of every k)."""
    m = problem.microbatches
    split = problem.plan_schedule.split_backward
    least = [0] * (len(figures) + 1)  # least[n]: the least delta modules n.. add
    for n in range(len(figures) - 1, -1, -1):
        it = figures[n]
        deltas = [0, it.inputs_bytes - it.exclusive_bytes]
        deltas += [-it.exclusive_bytes] if host else []
        deltas += [o.delta_bytes for o in it.ops if host or o.policy != "offload"]
        least[n] = least[n + 1] + min(deltas)
    lightest = bound_costs(base, forward, State(least[0], 0, 0, 0.0, ()))

    def peak_of(delta: int, largest: int, reruns: int) -> int:
        costs = bound_costs(base, forward, State(delta, 0, largest, 0.0, (), reruns))
        if mixes:
            return mixed_stage_peak_bytes(costs, lightest, inflight, inflight - 1, m, split)
        return one_stage_peak_bytes(costs, inflight, microbatches=m, split_backward=split)

    return FitScreen(peak_of, cap, least, host_cap if mixes else host_cap / inflight)


def whole_stage(problem: PipelineProblem, base: StageCosts, inflight: int,
                cap: float) -> StageChoice | None:
    """The stage recomputed as one checkpoint in every micro-batch (the ILP's recomputation):
    it keeps only its input and held bytes, where per-module recomputation keeps every
    module's input, for the same rerun (its forward; a split W reruns it again, as it does a
    module's); None where even that does not fit."""
    split = problem.plan_schedule.split_backward
    peak = one_stage_peak_bytes(base, inflight, stored=0, microbatches=problem.microbatches,
                                split_backward=split)
    if peak > cap:
        return None
    reruns = 2 if split and not base.first_stage else 1
    return StageChoice((), base, 0, reruns * base.forward_ms, peak, True, whole_stage=True)


def _to_check(fitting: list[State]) -> list[State]:
    """The frontier points whose bytes the simulator's rule checks: the fastest. Their times
    are the simulator's (planner.sim.unit_times: reruns and copies add to the stage's stream,
    one module at a time)."""
    return sorted(fitting, key=lambda st: st.ms)[:EXACT_CHECKS]


Named = tuple[tuple[str, tuple[str, ...]], ...]  # module -> its named calls


def _policies(figures: list[Item], choice: tuple[str, ...]) -> tuple[
        tuple[tuple[str, UnitPolicy], ...], Named, Named]:
    """The non-keep modules' policies, the selective ones' kept calls and the partially
    offloaded ones' moved calls."""
    policies: list[tuple[str, UnitPolicy]] = []
    saved: list[tuple[str, tuple[str, ...]]] = []
    moved: list[tuple[str, tuple[str, ...]]] = []
    for it, p in zip(figures, choice, strict=True):
        policy, o = _picked(it, p)
        if policy == "keep":
            continue
        if o is not None and o.regions:  # submodules recomputed, the rest kept
            for region, ops in o.regions:
                policies.append((region, "recompute"))
                if ops:
                    saved.append((region, ops))
            continue
        policies.append((it.name, policy))
        if o is not None:
            (saved if policy == "recompute" else moved).append((it.name, o.ops))
    return tuple(policies), tuple(saved), tuple(moved)


def _picked(it: Item, p: str) -> tuple[UnitPolicy, OpOption | None]:
    """A module's policy under the choice `p`, and its op-level option (None: whole module)."""
    if p.startswith(OP):
        o = it.ops[int(p[len(OP):])]
        return o.policy, o
    return ("recompute" if p == "recompute" else "offload" if p == "offload" else "keep"), None


def bound_costs(base: StageCosts, forward: int, st: State) -> StageCosts:
    """The stage's costs by the additive figures: saved and transient bytes at least the
    simulator's under the state's policies (`forward`: `forward_bytes`)."""
    if st == ZERO:  # the all-keep stage: its backward frees as it runs (sim.backward_release)
        return base
    # the simulator's policy stage (sim.stage_policies): the all-keep transient, the working
    # bytes of F and of each non-keep module; W's on every node's transient
    weight = base.recompute_transient_bytes + st.weight_rerun_bytes
    transient = max(base.transient_bytes, forward, st.largest_bytes)
    return replace(base, saved_bytes=base.saved_bytes + st.delta_bytes,
                   transient_bytes=transient, input_transient_bytes=transient,
                   recompute_transient_bytes=transient, weight_transient_bytes=weight,
                   weight_rerun_bytes=max(base.weight_rerun_bytes, weight))


def additive_state(modules: list[Item], choice: tuple[str, ...]) -> State:
    """The additive figures of `choice` (one policy per module, in module order)."""
    st = ZERO
    for it, policy in zip(modules, choice, strict=True):
        st = _grow(st, it, policy)
    return st


def undominated(steps: list[State]) -> list[State]:
    """A module's options (each grown from ZERO) less those another is at least as good as in
    every figure the knapsack adds (bytes, host bytes, transient, ms, W-rerun bytes): the
    other can replace it in any plan, no figure worse, so the knapsack's answer stays the
    same. Of equal ones the first stays."""
    def key(st: State) -> tuple[float, ...]:
        return (st.delta_bytes, st.offload_bytes, st.largest_bytes, st.ms,
                st.weight_rerun_bytes)
    keys = [key(st) for st in steps]
    return [st for n, (st, mine) in enumerate(zip(steps, keys, strict=True))
            if not any(all(a <= b for a, b in zip(other, mine, strict=True))
                       and (other != mine or m < n) for m, other in enumerate(keys) if m != n)]


def _grown(frontier: list[State], steps: list[State], screen: FitScreen,
           decided: int) -> list[State]:
    """Every state grown by every option (`steps`: each option's figures, grown from ZERO)
    that the screen keeps: _grow inlined, as this runs ~10^5 times a stage."""
    out = []
    keeps = screen.keeps
    for d, o, largest, ms, choice, reruns in frontier:
        for sd, so, sl, sms, (name,), sr in steps:
            g = State(d + sd, o + so, largest if largest >= sl else sl, ms + sms,
                      choice + (name,), reruns + sr)
            if keeps(g, decided):
                out.append(g)
    return out


def _grow(st: State, it: Item, policy: str) -> State:
    if policy == "keep":  # not dataclasses.replace: this runs for every state and module
        return State(st.delta_bytes, st.offload_bytes, st.largest_bytes, st.ms,
                      st.choice + ("keep",), st.weight_rerun_bytes)
    if policy.startswith(OP):
        o = it.ops[int(policy[len(OP):])]
        return State(st.delta_bytes + o.delta_bytes, st.offload_bytes + o.host_bytes,
                      max(st.largest_bytes, o.transient_bytes), st.ms + o.ms,
                      st.choice + (policy,), st.weight_rerun_bytes + o.weight_rerun_bytes)
    if policy == "recompute":
        return State(st.delta_bytes - it.exclusive_bytes + it.inputs_bytes, st.offload_bytes,
                      max(st.largest_bytes, it.recompute_transient_bytes),
                      st.ms + it.recompute_ms, st.choice + ("recompute",),
                      st.weight_rerun_bytes + it.weight_rerun_bytes)
    return State(st.delta_bytes - it.exclusive_bytes, st.offload_bytes + it.host_bytes,
                  max(st.largest_bytes, it.offload_transient_bytes), st.ms + it.offload_ms,
                  st.choice + ("offload",), st.weight_rerun_bytes)
