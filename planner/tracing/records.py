"""From the fx joint graph to per-op records: sizes, aliasing, phase, module path, FLOPs.

A record is one fx call node. Views (schema alias without write), `_unsafe_view`/`detach`/
`alias` share their base's storage (no bytes of their own). A multi-output op owns no bytes:
each `getitem` of it owns its element's storage, so elements are freed independently;
in-place ops (schema alias with write) share the mutated argument's storage. Ops tagged
`nondeterministic_seeded` are random.

Identity dropout: `F.dropout` with p = 0 (or not training) returns its input in eager, where
the joint graph clones it (AOT's dropout decomposition); that clone is sized as a view of its
input (no bytes), or the graph would hold the input and its copy wherever both are saved (e.g.
softmax output and the attention matmul's input: +1 probability tensor per layer).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.tracing.capture import JointCapture, module_path_from_stack

ALIAS_OPS = {"aten._unsafe_view", "aten.alias", "aten.detach", "aten.lift_fresh"}


@dataclass
class OpRecord:
    name: str  # fx node name
    index: int  # position in the fx graph
    op: str  # e.g. "aten.addmm"
    phase: str  # forward / loss / backward
    output_bytes: int  # bytes of its own storage (0 for views and in-place ops)
    alias_of: str | None  # fx record whose storage it shares; None: own storage or a primal's
    module_path: str
    random: bool
    inputs: list[str]  # fx names of records it reads (primals and tangents left out)
    trivial: bool  # costs no memory of its own: view, getitem, in-place, metadata
    flops: float = 0.0
    bytes_moved: int = 0  # bytes read and written, for the roofline
    dtype: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def tensor_storage_bytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # fake tensors without storage: dense size
        return int(t.numel() * t.element_size())


def value_tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in value_tensors(v)]
    return []


def dense_bytes(val: Any) -> int:
    return sum(int(t.numel() * t.element_size()) for t in value_tensors(val))


def _alias_kind(target: Any) -> str | None:
    """'view', 'inplace' or None from the op schema."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    if f"aten.{target.overloadpacket.__name__}" in ALIAS_OPS:
        return "view"
    for ret in target._schema.returns:
        info = ret.alias_info
        if info is not None:
            return "inplace" if info.is_write else "view"
    return None


def op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    return getattr(target, "__name__", str(target))


def _flops(target: Any, node: torch.fx.Node) -> float:
    from torch.utils.flop_counter import flop_registry

    packet = getattr(target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is None:
        return 0.0
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    try:
        return float(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:
        return 0.0


def draws_random(node: torch.fx.Node) -> bool:
    """Whether the op draws from the RNG: tagged nondeterministic_seeded, unless its dropout
    probability is 0 (CPU attention takes a `dropout_p` and draws nothing then). A random op
    is replayed from its recorded generator state when a plan recomputes it (on CPU that
    state is a 5,056 B tensor the simulator does not charge), so fewer is better."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or \
            torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for k, arg in enumerate(target._schema.arguments):
        if arg.name == "dropout_p":
            value = node.args[k] if k < len(node.args) else node.kwargs.get(
                "dropout_p", arg.default_value)
            return not (isinstance(value, (int, float)) and value == 0)
    return True


def is_identity_dropout(node: torch.fx.Node) -> bool:
    """A forward `clone` that AOT's dropout decomposition emits for p = 0 or eval mode."""
    if node.target is not torch.ops.aten.clone.default:
        return False
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False  # .contiguous() / reshape copies carry a memory format
    stack = node.meta.get("source_fn_stack") or []
    if not stack or not isinstance(stack[-1], tuple) or len(stack[-1]) < 2:
        return False
    fn = stack[-1][1]
    if isinstance(fn, type):
        from torch.nn.modules.dropout import _DropoutNd

        return issubclass(fn, _DropoutNd)
    return "dropout" in str(getattr(fn, "__name__", fn))


def build_records(cap: JointCapture, cpu_eager_dropout: bool = False) -> list[OpRecord]:
    """One record per fx call node of the joint graph, in fx order.

    cpu_eager_dropout: size dropout masks as eager CPU keeps them (input dtype), not as the
    joint graph's bool mask; the nodes concerned are marked `extra["eager_sized"]`.
    """
    graph = cap.gm.graph
    records: dict[str, OpRecord] = {}
    seq_module: dict[int, str] = {}
    for index, node in enumerate(graph.nodes):
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        tensors = value_tensors(val)
        inputs = [a.name for a in node.all_input_nodes if a.name in records]
        target = node.target
        tag = node.meta.get("partitioner_tag", "")
        stack = node.meta.get("nn_module_stack")
        seq = node.meta.get("seq_nr")
        backward = tag == "is_backward"
        if backward:
            path = seq_module.get(seq, "") if seq is not None else ""
            phase = "backward"
        else:
            path = module_path_from_stack(stack)
            entries = (e[0] if isinstance(e, tuple) else str(e) for e in (stack or {}).values())
            in_model = any("model" in e for e in entries)
            phase = "forward" if in_model else "loss"
            if seq is not None and path:
                seq_module.setdefault(seq, path)
        first_arg = node.args[0] if node.args else None
        base = first_arg.name if isinstance(first_arg, torch.fx.Node) else None
        kind = _alias_kind(target)
        if target is operator.getitem:
            parent = records.get(base or "")
            # An element of a multi-output op owns its tensor, so each output is freed after
            # its own last use; elements of a view op (split, unbind) stay views.
            kind = "view" if parent is None or parent.trivial else None
        identity = kind is None and is_identity_dropout(node)
        if identity:
            kind = "view"
        if not tensors:  # symbolic sizes and other metadata: nothing stored
            kind = kind or "meta"
        alias_of = base if kind in ("view", "inplace") and base in records else None
        multi = isinstance(val, (tuple, list)) and kind is None
        own = 0 if kind is not None or multi else _own_bytes(tensors)
        eager_sized = False
        if cpu_eager_dropout and target is operator.getitem and node.args[1] == 1:
            parent = records.get(base or "")
            dropped = first_arg.args[0] if isinstance(first_arg, torch.fx.Node) else None
            ok = isinstance(dropped, torch.fx.Node)
            if parent is not None and parent.op == "aten.native_dropout" and tensors and ok:
                # CPU eager dropout keeps a mask of the input's dtype, not bool (CUDA does).
                t = tensors[0]
                own = int(t.numel() * dropped.meta["val"].element_size())  # type: ignore[union-attr]
                eager_sized = True
        is_random = draws_random(node)
        in_bytes = sum(
            dense_bytes(a.meta.get("val")) for a in node.all_input_nodes
        )
        records[node.name] = OpRecord(
            name=node.name,
            index=index,
            op=op_name(target),
            phase=phase,
            output_bytes=own,
            alias_of=alias_of,
            module_path=path,
            random=bool(is_random),
            inputs=inputs,
            trivial=kind is not None,
            flops=_flops(target, node),
            bytes_moved=0 if kind is not None else in_bytes + dense_bytes(val),
            dtype=str(tensors[0].dtype).replace("torch.", "") if tensors else "",
            extra=(
                {"multi": True} if multi
                else {"eager_sized": True} if eager_sized
                else {"identity_dropout": True} if identity else {}
            ),
        )
    loss = records.get(cap.loss_node)
    if loss is not None and not any(r.phase == "loss" for r in records.values()):
        # The model computed its own loss (a transformers model given labels): no op ran
        # outside it, but the backward must still start after the loss, so its op is the loss.
        loss.phase = "loss"
    return list(records.values())


def _own_bytes(tensors: list[torch.Tensor]) -> int:
    """Storage bytes of an op's outputs (multi-output ops return distinct storages)."""
    return sum(tensor_storage_bytes(t) for t in tensors)
