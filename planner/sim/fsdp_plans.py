"""FSDP plans on a graph: the graph's FSDP model, the machine's link, and a plan of kind fsdp
replayed by `planner.sim.fsdp.simulate_fsdp` (what `planner.sim.simulator.simulate` sends such
a plan to).

The FSDP model (`FsdpModel`, schema `fsdp-model-1`) is what the tracer measured per block and
policy (`planner.tracing.fsdp_blocks.profile_blocks`), stored in the graph's
`metadata.extra["fsdp_model"]` by `planner-cli trace ... --fsdp-ranks 2,4`. The collectives run
over the resources' `device_link`; without one, over `DEFAULT_FSDP_LINK` (said in a note).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.core.errors import InputError
from planner.core.resources import LINK_PRESETS, Resources
from planner.sim.fsdp import FsdpModel, FsdpPlan, FsdpResult, LinkSpec, simulate_fsdp
from planner.sim.result import SimulationResult

if TYPE_CHECKING:
    from planner.core.graph import Graph
    from planner.core.plan import FsdpSettings

FSDP_MODEL_KEY = "fsdp_model"
DEFAULT_FSDP_LINK = "pcie-gen4-x16"
HOW_TO_PROFILE = ("trace the model with `planner-cli trace MODULE:FACTORY --fsdp-ranks 2,4 -o "
                  "graph.json` (or store planner.tracing.fsdp_blocks.profile_blocks(...)"
                  ".to_dict() in metadata.extra['fsdp_model'])")


def fsdp_model_of(graph: Graph, ranks: int | None = None) -> FsdpModel:
    """The graph's FSDP model; InputError (field `graph`) when it has none, it does not read,
    or it was not profiled for `ranks`."""
    data = graph.metadata.extra.get(FSDP_MODEL_KEY)
    if data is None:
        raise InputError(f"no FSDP block profile (metadata.extra.{FSDP_MODEL_KEY}): "
                         f"{HOW_TO_PROFILE}", field="graph")
    try:
        model = FsdpModel.from_dict(data)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise InputError(f"metadata.extra.{FSDP_MODEL_KEY} does not read: {e}",
                         field="graph") from None
    if not model.blocks:
        raise InputError(f"metadata.extra.{FSDP_MODEL_KEY} has no blocks to plan", field="graph")
    if ranks is not None:
        profiled = sorted(model.root_padded_bytes)
        if ranks not in profiled:
            raise InputError(f"the FSDP profile has padded sizes for {profiled} ranks, not "
                             f"{ranks}: trace again with --fsdp-ranks {ranks}", field="graph")
    return model


def fsdp_link(resources: Resources | None) -> tuple[LinkSpec, str | None]:
    """The link the collectives use and, when it is the default, a note saying so."""
    if resources is not None and resources.device_link is not None:
        link = resources.device_link
        return LinkSpec(link.bandwidth_bytes_per_s, link.latency_s), None
    link = LINK_PRESETS[DEFAULT_FSDP_LINK]
    return (LinkSpec(link.bandwidth_bytes_per_s, link.latency_s),
            f"collectives over {DEFAULT_FSDP_LINK} (no device_link in the resources)")


def keep_all_compute_ms(model: FsdpModel) -> float:
    """The step's compute with every block kept: what recomputation adds to."""
    return (model.head_forward.ms + model.tail_forward.ms + model.tail_backward.ms
            + model.head_backward.ms
            + sum(b.forward["keep"].ms + b.backward["keep"].ms for b in model.blocks))


def simulate_fsdp_settings(graph: Graph, settings: FsdpSettings,
                           resources: Resources | None = None) -> tuple[FsdpResult, FsdpModel]:
    """One rank's step under `settings` on the graph's FSDP model (InputError when the plan
    does not fit the model: another block count, ranks not profiled)."""
    model = fsdp_model_of(graph, settings.ranks)
    try:
        plan = FsdpPlan.parse(settings.text)
        link, _ = fsdp_link(resources)
        return simulate_fsdp(model, plan, settings.ranks, link, settings.collectives), model
    except ValueError as e:
        raise InputError(f"the fsdp plan does not run on this graph's FSDP model: {e}",
                         field="plan") from None


def simulate_fsdp_plan(graph: Graph, settings: FsdpSettings,
                       resources: Resources | None = None) -> SimulationResult:
    """The simulator's result for an fsdp plan: the rank's whole peak (sharded state plus the
    step's peak), its compute (recomputation included), its collectives and its step time."""
    result, model = simulate_fsdp_settings(graph, settings, resources)
    baseline = keep_all_compute_ms(model)
    return SimulationResult(
        peak_bytes=result.peak_bytes,
        peak_action_index=0,
        fixed_bytes=result.resident_bytes,
        compute_cost=result.compute_ms,
        baseline_cost=baseline,
        computations=0,
        node_count=0,
        timeline=(),
        event_simulated=True,
        compute_ms=result.compute_ms,
        transfer_ms=result.comm_ms,
        exposed_transfer_ms=result.exposed_comm_ms,
        makespan_ms=result.step_ms,
    )
