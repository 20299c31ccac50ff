"""The module-level trace's graph (planner.tracing.modules): one forward and one backward node
per unit, with the measured (or estimated) Rotor quantities, data-flow edges between units
(skip connections included) and the model's per-parameter state, so pipeline partitioners
place each layer's weights on its stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.core.graph import CostSource, Edge, Graph, GraphMetadata, Node, Phase

if TYPE_CHECKING:
    from planner.tracing.modules import Unit


def unit_graph(
    model: Any,
    inputs: Any,
    units: list[Unit],
    stages: list[dict[str, Any]],
    forward_sizes: list[tuple[int, int]],
    optimizer: str,
    costs: str,
    model_name: str,
    block_pattern: str | None,
    profile_name: str,
    batch: int | None,
    dtype: str,
    fixed_fn: Any,
) -> Graph:
    n = len(units)
    source = CostSource.measured if costs == "measure" else CostSource.estimated
    nodes = []
    for i, (u, (kept, tmp)) in enumerate(zip(units, forward_sizes, strict=True)):
        nodes.append(
            Node(
                id=i,
                name=f"F:{u.name}",
                op="module.forward",
                phase=Phase.forward,
                compute_ms=stages[i]["forward_ms"],
                cost_source=source,
                output_bytes=kept,
                workspace_bytes=tmp,
                module_path=u.name,
            )
        )
    for i in reversed(range(n)):
        u, st = units[i], stages[i]
        nodes.append(
            Node(
                id=2 * n - 1 - i,
                name=f"B:{u.name}",
                op="module.backward",
                phase=Phase.backward,
                compute_ms=st["backward_ms"],
                cost_source=source,
                output_bytes=st["grad_input_bytes"],
                workspace_bytes=st["backward_tmp_bytes"],
                module_path=u.name,
            )
        )

    def bwd(i: int) -> int:
        return 2 * n - 1 - i

    pairs: set[tuple[int, int]] = set()
    for i, u in enumerate(units):
        pairs.add((i, bwd(i)))
        for j in u.reads_from:
            if j < i:
                pairs.add((j, i))
                pairs.add((bwd(i), bwd(j)))
    if n > 1:
        pairs.add((n - 1, bwd(n - 1)))
    from planner.tracing.step_state import model_state_of

    # Per-parameter model state (module paths) so that pipeline partitioners place each layer's
    # weights on its stage; no gradient nodes (a unit's backward outputs its input gradient, not
    # the weights'), so gradients are charged from the start, the totals as before.
    model_state = model_state_of(model, optimizer, {})
    fixed, extra = fixed_fn(model, inputs, None, optimizer, model_state)
    extra.update(
        level="module", block_pattern=block_pattern or "", costs=costs, optimizer=optimizer, units=n
    )
    return Graph(
        nodes=nodes,
        edges=[Edge(source=a, target=b) for a, b in sorted(pairs)],
        fixed=fixed,
        model_state=model_state,
        order=list(range(2 * n)),
        metadata=GraphMetadata(
            model_name=model_name,
            batch_size=batch,
            dtype=dtype,
            device_profile=profile_name,
            source="planner.tracing (modules)",
            extra=extra,
        ),
    )
