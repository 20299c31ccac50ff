"""Per-unit remat and offload inside a pipeline stage (PipelineStage.unit_policies): what they
do to the stage's costs. The simulator (planner.sim.pipeline_ranks) and the whole-job planner
(planner.solvers.pipeline.whole_job) both call `policy_stage_costs`, so the two agree exactly.

A unit is one of the stage's modules ('h.3'): the nodes whose module_path is it or inside it.
Per unit, from the ledger's facts: `saved` (storage roots its backward nodes read from forward
nodes: what autograd keeps for it), `inputs` (roots from outside the unit that its forward nodes
read: what a non-reentrant checkpoint of the module keeps), its forward and backward ms. Nodes
of the stage outside every unit (a loss, an `x + pos`) and units not named keep theirs. A
policy on a submodule ('h.3.mlp') makes it a unit of its own (planner.sim.stage_facts).

Policies, per micro-batch (as planner.runtime.pipeline_units runs them):
- keep: nothing changes.
- recompute (non-reentrant torch.utils.checkpoint of the module): the device keeps the unit's
  inputs instead of its saved roots; the stage's B (or I) reruns the unit's forward first, up
  to its last saving (torch's early stop: UnitFacts.rerun_ms, planner.sim.stage_facts
  `checkpoint_rerun`). With `unit_saved_ops` (selective checkpointing, planner.sim.selective_units)
  the device also keeps the outputs of the named calls, and the rerun skips them.
- offload (saved-tensor hooks around the module): each tensor the unit saves is copied to host
  memory as autograd saves it, one copy per saving (backward node, root) pair (`host_bytes`,
  per in-flight micro-batch: what the runtime's HostMemory measures), and reloaded when a
  backward node unpacks it. With `unit_offload_ops` only the saved roots of the named calls'
  outputs are moved (and copied); the unit's other saved roots stay on the device.

Device memory: saved bytes = the union of what the stage keeps: what it sends on and its loss
(held bytes, whatever the policies), the saved roots of keep units and of nodes outside units,
the inputs of recompute units made in the stage; a received input lives in torch's receive
buffer (stage_costs' buffer bytes), so keeping it costs nothing more. The change is applied to
the all-keep stage's saved bytes, so the rest of stage_costs' accounting stays as it is.
Transient (on top of the micro-batch's kept bytes, which the rank charges from F's start): the
largest of the all-keep stage's, the F's working set (`forward_working_bytes`: what a
non-keep unit saves is on the device only while its forward uses it) and the backward's
(`backward_working_bytes`: a node's gradients, an offload unit's reloads for that node, a
recompute unit's rerun and its recomputed roots, less the kept roots already freed; both in
planner.sim.stage_working).
Measured against torch on 2 and 4 gloo ranks (tests/runtime/test_pipeline_policies.py): measured <=
predicted <= 1.10 x measured per rank, host bytes exact.

Time (planner.sim.unit_times), per stage and micro-batch, as the runtime issues the copies:
on the stage's own stream, so a copy holds the compute for its transfer (each copy pays the
link's latency once).
- F: the stage's compute, plus each offloaded unit's device-to-host copies.
- B (or I): each unit's backward (a recompute unit's rerun first), plus each offloaded unit's
  reloads. A split W (zero-bubble, not the first stage) reloads what its weight-gradient nodes
  read again, and reruns recompute units' forwards.
An earlier rule overlapped copies with later compute (d2h behind the next units' forwards,
reloads prefetched a unit ahead); the runtime never did, and host-tier plans took up to 1.48x
their predicted step (docs/whole_job.md, "Copies in the step").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace

from planner.core.graph import Graph
from planner.core.pipeline_actions import Partition, PipelineStage, StageVariant, UnitPolicy
from planner.core.resources import Link, Resources
from planner.sim.ledger import MemoryLedger
from planner.sim.result import PlanError
from planner.sim.selective_units import rerun_ms, unit_cached, unit_moved
from planner.sim.stage_costs import StageCosts, stage_of_nodes
from planner.sim.stage_facts import StageFacts, UnitFacts, region_facts, stage_facts
from planner.sim.stage_working import backward_working_bytes, forward_working_bytes
from planner.sim.unit_times import backward_with_reloads, copies_ms, forward_with_copies

__all__ = ["PolicyCosts", "StageFacts", "UnitFacts", "apply_unit_policies", "policy_stage_costs",
           "stage_facts", "unit_weight_reload_ms", "variant_unit_costs", "weight_rerun_bytes"]

MEMO_ENTRIES = 4096  # stage plans whose effective costs the graph keeps (variant_unit_costs)


@dataclass(frozen=True)
class PolicyCosts:
    """A stage's effective costs under its unit policies, and its host bytes per micro-batch."""

    costs: StageCosts
    host_bytes: int


def policy_stage_costs(
    graph: Graph,
    facts: StageFacts,
    base: StageCosts,
    policies: Mapping[str, UnitPolicy],
    resources: Resources | None,
    saved_ops: Mapping[str, Sequence[str]] | None = None,
    offload_ops: Mapping[str, Sequence[str]] | None = None,
) -> PolicyCosts:
    """`base` (the stage's costs with every unit kept) under `policies` (for recompute units
    `saved_ops`: selective checkpointing; for offload units `offload_ops`: only those calls'
    outputs go to the host); unchanged when every unit keeps. A policy may name a submodule
    of a unit ('h.3.mlp'): a unit of its own here (stage_facts.region_facts)."""
    if all(p == "keep" for p in policies.values()):
        return PolicyCosts(base, 0)
    facts = region_facts(graph, facts, [*policies, *(saved_ops or {}), *(offload_ops or {})])
    chosen = {u.name: policies.get(u.name, "keep") for u in facts.units}
    ledger = MemoryLedger.of(graph)
    size, root = ledger.storage_bytes, ledger.storage_root
    cached = unit_cached(graph, facts.forward, chosen, saved_ops)
    moved = unit_moved(graph, facts.forward, chosen, offload_ops)

    def nbytes(roots: Iterable[int]) -> int:
        return sum(size[r] for r in roots)

    kept = set(facts.rest_saved | facts.held)  # on the device from F on
    every_saved = set(facts.rest_saved | facts.held)  # what `base` counts
    for u in facts.units:
        every_saved |= u.saved
        if chosen[u.name] == "keep":
            kept |= u.saved
        elif chosen[u.name] == "recompute":
            kept |= u.inputs | {root[v] for v in cached.get(u.name, ())}
        elif u.name in moved:  # a partial offload: what it does not move stays
            kept |= u.saved - moved[u.name]
    offloaded = [u for u in facts.units if chosen[u.name] == "offload"]
    host = {u.name: u.host_bytes_of(moved.get(u.name), size) for u in offloaded}
    copies = {u.name: u.copies_of(moved.get(u.name)) for u in offloaded}
    saved_bytes = base.saved_bytes - nbytes(every_saved - kept) + nbytes(kept - every_saved)
    # each recompute unit is a checkpoint call: its state, kept from F to B (stage_costs)
    saved_bytes += base.checkpoint_bytes * sum(p == "recompute" for p in chosen.values())
    # the all-keep stage's transient credits as freed saved roots a policy may not keep; the
    # working bytes below count every node's transient less only the kept roots it freed
    unreduced = base.recompute_transient_bytes
    transient = max(base.transient_bytes, forward_working_bytes(graph, facts, kept),
                    backward_working_bytes(graph, facts, chosen, kept, cached=cached,
                                           moved=moved))
    d2h = resources.d2h if resources is not None else None
    h2d = resources.h2d if resources is not None else None
    if offloaded and (d2h is None or h2d is None):
        raise PlanError("unit_policies: 'offload' needs a host tier (resources h2d and d2h "
                        "links); give resources with a host tier or use 'recompute'")
    forward_ms = forward_with_copies(facts, host, copies, d2h) if offloaded else base.forward_ms
    backward_ms = backward_with_reloads(facts, chosen, h2d if offloaded else None,
                                         rerun_ms(graph, facts, cached), host, copies)
    extra_ms = backward_ms - (facts.rest_backward_ms + sum(u.backward_ms for u in facts.units))
    weight_transient = unreduced + weight_rerun_bytes(
        graph, facts, chosen, base.first_stage) + weight_reload_bytes(
        facts, chosen, moved, size, base.first_stage)
    costs = replace(
        base,
        forward_ms=max(base.forward_ms, forward_ms),
        backward_ms=base.backward_ms + extra_ms,
        backward_input_ms=base.backward_input_ms + extra_ms,
        backward_weight_ms=base.backward_weight_ms
        + weight_rerun_ms(facts, chosen, base.first_stage)
        + weight_reload_ms(facts, chosen, moved, size, base.first_stage, h2d),
        saved_bytes=saved_bytes,
        transient_bytes=transient,
        input_transient_bytes=transient,
        recompute_transient_bytes=transient,
        weight_transient_bytes=weight_transient,
        weight_rerun_bytes=max(base.weight_rerun_bytes, weight_transient),
    )
    return PolicyCosts(costs, sum(host.values()))


def weight_rerun_bytes(graph: Graph, facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                       first_stage: bool) -> int:
    """What the reruns of the recompute units leave alive in a split W (planner.sim.
    rank_memory.weight_rerun_residue_bytes per unit): the W is one autograd call
    (planner.runtime.pipeline merges torch's weight groups), so each unit reruns once: every
    unit's recomputed roots an input-gradient node reads, counted alive until W ends (an upper
    bound: counting one unit's at a time fell below torch's peak, 0.918 of it, in
    tests/runtime/test_pipeline_selective_runtime.py), and the roots only weight nodes read, of one
    unit at a time. None on the first stage, whose W is one whole backward (one rerun per
    checkpoint)."""
    if first_stage:
        return 0
    size = MemoryLedger.of(graph).storage_bytes
    input_read = only_weight = 0
    for u in facts.units:
        if chosen[u.name] != "recompute" or not u.weight_groups:
            continue
        # what the rerun makes: a selective checkpoint's kept calls too (the I pass consumed
        # them; planner.runtime.pipeline_units has the W pass rerun them)
        again = u.saved - u.inputs
        read = again & u.input_read
        input_read += sum(size[r] for r in read)
        only_weight = max(only_weight, sum(size[r] for r in again - read))
    return input_read + only_weight


def weight_rerun_ms(facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                    first_stage: bool) -> float:
    """What a split W adds (zero-bubble, not the first stage): its autograd call reruns each
    recompute unit's forward once more, the calls a selective checkpoint kept too (the I pass
    consumed them)."""
    if first_stage:
        return 0.0
    return sum(u.forward_ms for u in facts.units
               if chosen[u.name] == "recompute" and u.weight_groups)


def weight_reload_ms(facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                     moved: Mapping[str, Set[int]], size: Mapping[int, int], first_stage: bool,
                     h2d: Link | None) -> float:
    """What a split W's reloads add (zero-bubble, not the first stage): each offloaded unit's
    weight-gradient nodes reload their saved tensors again, in the stage's stream."""
    if first_stage or h2d is None:
        return 0.0
    return sum(unit_weight_reload_ms(u, moved.get(u.name), size, h2d)
               for u in facts.units if chosen[u.name] == "offload")


def unit_weight_reload_ms(u: UnitFacts, moved: Set[int] | None, size: Mapping[int, int],
                          h2d: Link) -> float:
    """One offloaded unit's share of `weight_reload_ms` (`moved`: the roots it moves; None:
    every saved one): the knapsack's figure too."""
    read = u.weight_read & (u.saved if moved is None else moved)
    return copies_ms(h2d, u.host_bytes_of(read, size), u.copies_of(read))


def weight_reload_bytes(facts: StageFacts, chosen: Mapping[str, UnitPolicy],
                        moved: Mapping[str, Set[int]], size: Mapping[int, int],
                        first_stage: bool) -> int:
    """What a split W reloads from the host (zero-bubble, not the first stage): an offloaded
    unit's weight-gradient nodes unpack their saved tensors again in W, one unit at a time."""
    if first_stage:
        return 0
    return max((sum(size[r] for r in u.weight_read & moved.get(u.name, u.saved))
                for u in facts.units if chosen[u.name] == "offload"), default=0)


def apply_unit_policies(
    graph: Graph,
    partition: Partition,
    costs: Sequence[StageCosts],
    resources: Resources | None,
) -> list[PolicyCosts]:
    """Every stage's effective costs (stage_costs' `costs` under each stage's unit_policies)."""
    return [own for own, _ in variant_unit_costs(graph, partition, costs, resources)]


def _plan_key(plan: PipelineStage | StageVariant) -> tuple[object, ...]:
    return (tuple(sorted(plan.unit_policies.items())),
            tuple(sorted((m, tuple(ops)) for m, ops in plan.unit_saved_ops.items())),
            tuple(sorted((m, tuple(ops)) for m, ops in plan.unit_offload_ops.items())))


def variant_unit_costs(
    graph: Graph,
    partition: Partition,
    costs: Sequence[StageCosts],
    resources: Resources | None,
) -> list[tuple[PolicyCosts, dict[int, PolicyCosts]]]:
    """Per stage its own plan's effective costs (as apply_unit_policies) and, per micro-batch
    of a variant (PipelineStage.variants), that variant's."""
    out: list[tuple[PolicyCosts, dict[int, PolicyCosts]]] = [(PolicyCosts(c, 0), {})
                                                             for c in costs]

    def planned(s: PipelineStage) -> bool:
        plans: list[PipelineStage | StageVariant] = [s, *s.variants]
        return any(p != "keep" for plan in plans for p in plan.unit_policies.values())

    active = [s for s in partition.stages if planned(s)]
    if not active:
        return out
    stage = stage_of_nodes(graph, partition)
    members: dict[int, list[int]] = {s.stage_index: [] for s in active}
    for v, index in stage.items():
        if index in members:
            members[index].append(v)
    # a search simulates the same stages under the same plans many times: memoised per
    # (stage nodes, modules, costs, plan, resources) on the graph
    memo = graph.index.memo.setdefault("policy_stage_costs", {})
    machine = None if resources is None else resources.model_dump_json()
    for s in active:
        nodes = tuple(sorted(members[s.stage_index]))
        base = costs[s.stage_index]
        found: list[StageFacts] = []  # made on the first plan not memoised

        def run(plan: PipelineStage | StageVariant, base: StageCosts = base,
                nodes: tuple[int, ...] = nodes, modules: tuple[str, ...] = tuple(s.modules),
                found: list[StageFacts] = found) -> PolicyCosts:
            key = (nodes, modules, base, machine, _plan_key(plan))
            if key not in memo:
                if not found:
                    found.append(stage_facts(graph, nodes, modules))
                if len(memo) > MEMO_ENTRIES:  # the oldest go
                    memo.pop(next(iter(memo)))
                memo[key] = policy_stage_costs(graph, found[0], base, plan.unit_policies,
                                               resources, plan.unit_saved_ops,
                                               plan.unit_offload_ops)
            got: PolicyCosts = memo[key]
            return got

        by_microbatch: dict[int, PolicyCosts] = {}
        for variant in s.variants:
            by_microbatch.update(dict.fromkeys(variant.microbatches, run(variant)))
        out[s.stage_index] = (run(s), by_microbatch)
    return out
