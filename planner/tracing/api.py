"""`trace(model, inputs)`: one training step of a PyTorch model as a graph.json `Graph`."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

from planner.core.errors import InputError
from planner.core.graph import (
    CostSource,
    Edge,
    Graph,
    GraphMetadata,
    Node,
    Phase,
)
from planner.tracing.fingerprint import loss_name as loss_name  # where callers find it
from planner.tracing.step_state import (
    OPTIMIZER_STATES,
    TraceResult,
    batch_size,
    dtype_name,
    fixed_memory,
    model_state_of,
)

# (stage, done, total): `stage` says the phase in words (with its counts); total 0: a phase
# without a count (the capture's steps, the workspace measurement).
Progress = Callable[[str, int, int], None]


def _silent(stage: str, done: int, total: int) -> None:
    """The progress callback of a caller that asked for none."""


def trace(
    model: Any,
    inputs: tuple[Any, ...],
    *,
    loss_fn: Any = None,
    level: str = "op",
    block_pattern: str | None = None,
    costs: str = "estimate",
    device_profile: str = "cpu",
    optimizer: str = "sgd",
    fuse: bool = True,
    dropout_masks: str = "eager",
    clock: str = "wall",
    repeats: int = 5,
    warmup: int = 1,
    model_name: str = "",
    progress: Progress | None = None,
    gradient_lifetime: str | None = None,
    grad_accumulation_steps: int = 1,
    autocast: str | None = None,
    reuse_capture: bool | str = False,
) -> TraceResult:
    """Trace one step (forward, loss, backward) of `model(*inputs)`; see planner.tracing.

    `reuse_capture` (op level): True uses the capture store's joint graph of a model with this
    model's fingerprint (planner.tracing.fingerprint) instead of capturing again; a fingerprint
    ("sha256:…", a plan's `trace_options["fingerprint"]`) does so only when the model's
    fingerprint now is that one. Every op-level trace records its fingerprint in
    `graph.trace_options` and keeps its capture in the store (planner.tracing.capture_store);
    `details["capture_source"]` says "recorded" or "captured", and `details["capture_note"]`
    why a capture asked to be reused was not.

    `gradient_lifetime`: "backward" when each gradient is created during backward and released
    by the optimizer step (`zero_grad(set_to_none=True)`, the default of torch optimizers): its
    bytes count from its gradient node on; "step" when gradients stay allocated across steps
    (gradient accumulation, `zero_grad(set_to_none=False)`): they count from the start. Default
    (None): "backward", or "step" when `grad_accumulation_steps` > 1. The graph always states
    it (module-level graphs have no gradient nodes: "step").

    `autocast` ("bf16", "fp16"; op level): the step runs under `torch.autocast` of the model's
    device type, as when `trace` is called inside the user's own autocast block (None: that
    block's setting, if any); recorded in `graph.metadata.extra["autocast"]`
    (planner.tracing.autocast)."""
    lifetime = resolve_gradient_lifetime(gradient_lifetime, grad_accumulation_steps)
    if level not in ("op", "module"):
        raise InputError(f"--level {level}: use 'op' or 'module'")
    if costs not in ("estimate", "measure"):
        raise InputError(f"--costs {costs}: use 'estimate' or 'measure'")
    if clock not in ("wall", "cpu"):
        raise InputError(f"clock {clock!r}: use 'wall' or 'cpu' (CPU time of this thread)")
    if dropout_masks not in ("eager", "graph"):
        raise InputError(f"dropout_masks {dropout_masks!r}: use 'eager' or 'graph'")
    if optimizer not in OPTIMIZER_STATES:
        raise InputError(f"--optimizer {optimizer}: use one of {', '.join(OPTIMIZER_STATES)}")
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    from planner.tracing.autocast import autocast_off, device_type_of, resolve_autocast

    device_type = device_type_of(model, inputs)
    autocast = resolve_autocast(autocast, device_type)
    if autocast is not None and level == "module":
        raise InputError(
            f"--autocast {autocast}: mixed precision is traced at op level only (--level op)"
        )
    model.train()
    name = model_name or type(model).__name__
    options: dict[str, Any] = {
        "level": level, "block_pattern": block_pattern, "costs": costs,
        "device_profile": device_profile, "optimizer": optimizer, "fuse": fuse,
        "dropout_masks": dropout_masks, "gradient_lifetime": lifetime,
        "grad_accumulation_steps": grad_accumulation_steps, "autocast": autocast,
        "loss": loss_name(loss_fn),
    }
    if level == "module":
        from planner.tracing.modules import trace_modules

        result = trace_modules(
            model, inputs, loss_fn=loss_fn, block_pattern=block_pattern, costs=costs,
            device_profile=device_profile, optimizer=optimizer, repeats=repeats, warmup=warmup,
            model_name=name, progress=progress, clock=clock,
        )
        return _with_metadata(result, {**options, "dropout_masks": "graph"})
    with autocast_off(device_type):  # the capture sets it; measuring runs the graph's casts
        result = _trace_ops(
            model, inputs, loss_fn, costs, device_profile, optimizer, fuse, dropout_masks,
            repeats, warmup, name, progress, clock, autocast=autocast,
            reuse_capture=reuse_capture,
        )
    # What the masks were sized as: eager sizes exist on CPU only.
    options["dropout_masks"] = result.graph.metadata.extra.get("dropout_masks", dropout_masks)
    options["fingerprint"] = result.details.get("fingerprint")
    result = _with_metadata(result, options)
    state = result.graph.model_state
    if state is None:
        return result
    # Set even when equal to the schema default, so the graph states it explicitly.
    graph = result.graph.model_copy(
        update={"model_state": state.model_copy(update={"gradient_lifetime": lifetime})}
    )
    return dataclasses.replace(result, graph=graph)


# The keyword arguments of `trace` that shape the graph, recorded in
# `graph.metadata.extra["trace_options"]` (with "loss", the loss function's name) so that the
# runtime re-traces a plan's model as its graph was traced (planner.runtime.retrace).
TRACE_OPTION_NAMES = (
    "level", "block_pattern", "costs", "device_profile", "optimizer", "fuse", "dropout_masks",
    "gradient_lifetime", "grad_accumulation_steps", "autocast",
)


def _with_metadata(result: TraceResult, options: dict[str, Any]) -> TraceResult:
    """`result` whose graph records `options` (metadata: the content hash is unchanged)."""
    meta = result.graph.metadata
    metadata = meta.model_copy(update={"extra": {**meta.extra, "trace_options": options}})
    return dataclasses.replace(result, graph=result.graph.model_copy(update={"metadata": metadata}))


def resolve_gradient_lifetime(lifetime: str | None, grad_accumulation_steps: int = 1) -> str:
    """The gradient lifetime of a training loop: as given, else from the accumulation steps
    ("step" when gradients accumulate over several micro-steps, else torch's default
    "backward"); one-line InputError for a bad value or a contradictory pair."""
    if lifetime is not None and lifetime not in ("step", "backward"):
        raise InputError(f"--gradient-lifetime {lifetime}: use 'step' or 'backward'")
    steps = grad_accumulation_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(
            f"--grad-accumulation-steps {grad_accumulation_steps}: use a whole number >= 1 "
            "(1: no accumulation)"
        )
    if lifetime == "backward" and grad_accumulation_steps > 1:
        raise InputError(
            f"--gradient-lifetime backward with --grad-accumulation-steps "
            f"{grad_accumulation_steps}: accumulated gradients stay allocated between "
            "micro-steps, so their lifetime is 'step'; drop one of the two"
        )
    if lifetime is None:
        return "step" if grad_accumulation_steps > 1 else "backward"
    return lifetime


def _trace_ops(
    model: Any, inputs: tuple[Any, ...], loss_fn: Any, costs: str, device_profile: str,
    optimizer: str, fuse: bool, dropout_masks: str, repeats: int, warmup: int, name: str,
    progress: Progress | None, clock: str = "wall", autocast: str | None = None,
    reuse_capture: bool | str = False,
) -> TraceResult:
    from planner.tracing import capture_store
    from planner.tracing.capture import capture_joint
    from planner.tracing.costs import (
        estimate_record_ms,
        joint_arguments,
        measure_fx_ms,
        measure_fx_workspace_bytes,
    )
    from planner.tracing.cpu_workspace import measure_cpu_workspace_bytes
    from planner.tracing.cuda_allocator import use_exact_allocator
    from planner.tracing.fusion import group_records
    from planner.tracing.profiles import load_profile
    from planner.tracing.records import build_records

    say = progress or _silent
    profile = load_profile(device_profile) if costs == "estimate" else None
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if not on_cpu:  # workspaces measured as the plan's runtime will allocate them
        use_exact_allocator()
    from planner.tracing.fingerprint import model_fingerprint

    fingerprint, parts = model_fingerprint(model, inputs, loss_fn, autocast)
    cap, note = None, ""
    if reuse_capture:
        note = _reuse_note(reuse_capture, fingerprint, parts)
        if not note:
            say("capture: loading the recorded capture", 0, 0)
            cap = capture_store.load(fingerprint)
            if cap is None:
                note = f"the recorded capture {fingerprint[7:19]} could not be read"
    capture_source = "recorded" if cap is not None else "captured"
    if cap is None:
        cap = capture_joint(model, inputs, loss_fn, autocast=autocast, progress=progress)
        say("capture: keeping it in the capture store", 0, 0)
        capture_store.save(fingerprint, cap, parts)
    calls = sum(1 for n in cap.gm.graph.nodes if n.op == "call_function")
    say(f"op graph: records of {calls} joint-graph ops", 0, calls)
    records = build_records(cap, cpu_eager_dropout=dropout_masks == "eager" and on_cpu)
    say(f"op graph: records of {calls} joint-graph ops", len(records), calls)
    by_name = {r.name: r for r in records}
    if costs == "measure":
        args = joint_arguments(cap, model, inputs)
        runs = warmup + repeats
        say(f"timing {len(records)} ops: run 0/{runs} ({warmup} warm-up, median of {repeats})",
            0, runs)

        def report(done: int, total: int) -> None:
            say(f"timing {len(records)} ops: run {done}/{total} ({warmup} warm-up, median of "
                f"{repeats})", done, total)

        fx_ms = measure_fx_ms(
            cap, args, warmup=warmup, repeats=repeats, progress=report, clock=clock
        )
        source = CostSource.measured
        profile_name = f"measured:{args[0].device.type if args else 'cpu'}"
    else:
        assert profile is not None
        fx_ms = {}
        for i, r in enumerate(records):
            if i % 64 == 0:
                say(f"costs: roofline estimate ({profile.name}) of {len(records)} ops", i,
                    len(records))
            fx_ms[r.name] = estimate_record_ms(r, profile)
        say(f"costs: roofline estimate ({profile.name}) of {len(records)} ops", len(records),
            len(records))
        source = CostSource.estimated
        profile_name = profile.name
    # What each op allocates and frees while it runs is memory, not time: measured whichever
    # way the costs are found (on CPU convolutions' and batch norms', one profiler session).
    say("workspace: measuring what convolutions, batch norms and dropouts allocate while "
        "they run" if on_cpu else "workspace: one run of the joint graph", 0, 0)
    workspace = measure_cpu_workspace_bytes(
        cap.gm, eager_dropout=dropout_masks == "eager") if on_cpu else measure_fx_workspace_bytes(
        cap, joint_arguments(cap, model, inputs))
    say(f"op graph: fusing views and in-place ops of {len(records)} records", 0, 0)
    groups = group_records(records, fuse=fuse)
    order = _execution_order(groups, by_name)
    ids = {g.primary: i for i, g in enumerate(order)}
    nodes, edges = _op_nodes(order, by_name, ids, fx_ms, workspace, source, on_cpu)
    fx_to_id = {m: ids[g.primary] for g in order for m in g.members}
    outputs = [fx_to_id[cap.loss_node]] if cap.loss_node in fx_to_id else []
    outputs += [fx_to_id[n] for n in cap.gradient_nodes.values() if n in fx_to_id]
    gradient_ids = {fqn: fx_to_id[n] for fqn, n in cap.gradient_nodes.items() if n in fx_to_id}
    model_state = model_state_of(model, optimizer, gradient_ids)
    fixed, extra = fixed_memory(model, inputs, cap, optimizer, model_state)
    extra.update(
        level="op",
        fuse=fuse,
        fx_call_nodes=len(records),
        nodes_before_fusion=len(records),
        nodes_after_fusion=len(order),
        costs=costs,
        optimizer=optimizer,
        clock=clock if costs == "measure" else "",
        dropout_masks=dropout_masks if on_cpu else "graph",
        autocast=autocast,  # the weights keep metadata.dtype; compute in this precision
    )
    graph = Graph(
        nodes=nodes,
        edges=edges,
        fixed=fixed,
        order=list(range(len(nodes))),
        outputs=list(dict.fromkeys(outputs)) or None,
        metadata=GraphMetadata(
            model_name=name,
            batch_size=batch_size(inputs),
            dtype=dtype_name(model),
            device_profile=profile_name,
            source="planner.tracing (AOTAutograd joint graph)",
            extra=extra,
        ),
        model_state=model_state,
    )
    result = _op_result(graph, cap, order, ids, records, fx_to_id)
    result.details.update(fingerprint=fingerprint, capture_source=capture_source,
                          capture_note=note)
    return result


def _reuse_note(wanted: bool | str, fingerprint: str, parts: dict[str, Any]) -> str:
    """'' when the store holds a capture for `fingerprint` that `wanted` allows; else why not."""
    from planner.tracing import capture_store
    from planner.tracing.fingerprint import differences

    folder = capture_store.store_dir()
    if folder is None:
        return f"the capture store is off ({capture_store.ENV})"
    if isinstance(wanted, str) and wanted != fingerprint:
        recorded = capture_store.recorded_parts(wanted)
        if recorded is None:
            return (f"the model's fingerprint differs from the one recorded with the plan "
                    f"({wanted[7:19]} then, {fingerprint[7:19]} now)")
        said = "; ".join(differences(recorded, parts)) or "fingerprints differ"
        return f"the model differs from the one the plan's graph was traced from: {said}"
    if capture_store.recorded_parts(fingerprint) is None:
        return (f"no capture of this model is kept in {folder} (traced on another machine, or "
                "the store was cleared)")
    return ""


def _op_result(graph: Graph, cap: Any, order: list[Any], ids: dict[str, int],
               records: list[Any], fx_to_id: dict[str, int]) -> TraceResult:
    """The op-level trace: the graph and what maps its nodes back to the joint graph's."""
    return TraceResult(
        graph=graph,
        level="op",
        joint=cap.gm,
        node_fx_names={ids[g.primary]: g.members for g in order},
        owner_fx_names={ids[g.primary]: g.primary for g in order},
        capture=cap,
        primal_kinds=dict(cap.primal_kinds),
        primal_names=dict(cap.primal_names),
        tangent_fx_names=tuple(cap.tangent_nodes),
        loss_fx_name=cap.loss_node,
        gradient_fx_names=dict(cap.gradient_nodes),
        nodes_before_fusion=len(records),
        details={
            "eager_sized_nodes": [
                fx_to_id[r.name] for r in records if r.extra.get("eager_sized")
            ],
            # fx clones of identity dropout (p = 0): sized as views of their input, so an
            # executor should alias them rather than copy
            "identity_dropout_fx_names": [
                r.name for r in records if r.extra.get("identity_dropout")
            ],
        },
    )


def _op_nodes(order: list[Any], by_name: dict[str, Any], ids: dict[str, int],
              fx_ms: dict[str, float], workspace: dict[str, int], source: CostSource,
              on_cpu: bool) -> tuple[list[Node], list[Edge]]:
    """One node per fused group (`order`: execution order) and its input edges."""
    nodes: list[Node] = []
    edges: list[Edge] = []
    for i, g in enumerate(order):
        primary = by_name[g.primary]
        # The node is named after the op that does the work (a multi-output op, not getitem).
        workers = [by_name[m] for m in g.members if not by_name[m].trivial]
        head = next((r for r in workers if r.op != "getitem"), primary)
        nodes.append(
            Node(
                id=i,
                name=head.name,
                op=head.op,
                phase=Phase(primary.phase),
                compute_ms=sum(fx_ms.get(m, 0.0) for m in g.members),
                workspace_bytes=max((workspace.get(m, 0) for m in g.members), default=0),
                cost_source=source,
                output_bytes=_allocated_bytes(primary.output_bytes, on_cpu),
                module_path=primary.module_path,
                random=any(by_name[m].random for m in g.members),
                alias_of=ids[g.alias_of] if g.alias_of is not None else None,
            )
        )
        edges.extend(Edge(source=ids[u], target=i) for u in g.inputs)
    return nodes, edges


CUDA_BLOCK_BYTES = 512  # the CUDA caching allocator rounds every allocation up to this


def _allocated_bytes(nbytes: int, on_cpu: bool) -> int:
    """What an output occupies on the traced device: on CUDA its allocator block (a multiple of
    512 bytes: a scalar loss costs 512, not 4); on CPU its bytes, as the storage accounting of
    the CPU runtime counts them."""
    if on_cpu or nbytes <= 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def _execution_order(groups: list[Any], by_name: dict[str, Any]) -> list[Any]:
    """Topological order preferring forward before backward, then fx order; the other outputs
    of a multi-output op (getitem nodes reading only it) right after it, as the op makes them
    all at once (planner.sim.ledger: they are live from the op's computation on)."""
    index = {g.primary: g for g in groups}
    indegree = {g.primary: 0 for g in groups}
    succs: dict[str, list[str]] = {g.primary: [] for g in groups}
    for g in groups:
        for u in g.inputs:
            succs[u].append(g.primary)
            indegree[g.primary] += 1

    def key(name: str) -> tuple[int, int]:
        r = by_name[name]
        return (1 if r.phase == "backward" else 0, r.index)

    heap = [(key(n), n) for n, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    out = []
    pending: list[str] = []
    while heap or pending:
        n = pending.pop() if pending else heapq.heappop(heap)[1]
        out.append(index[n])
        elements = []
        for s in succs[n]:
            indegree[s] -= 1
            if indegree[s] == 0:
                if by_name[s].op == "getitem" and list(index[s].inputs) == [n]:
                    elements.append(s)
                else:
                    heapq.heappush(heap, (key(s), s))
        pending.extend(sorted(elements, key=key, reverse=True))  # popped in fx order
    return out

