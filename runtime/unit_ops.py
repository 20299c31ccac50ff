"""Op-level plans inside a unit of a pipeline stage, by call ('OP#K': the K-th call of operator OP
in the unit's forward, counted as the traced graph counts them: "aten." + the packet name, an
in-place call as its functional op, views included, which the graph leaves out).

- `SavedOpsPolicy` and `selective_contexts`: a selective checkpoint that keeps the named calls'
  outputs (PipelineStage.unit_saved_ops) and reruns the rest, serving every backward through
  the unit (zero-bubble runs two).
- `CallOutputs`: a dispatch mode that records the storages of the named calls' outputs while the
  unit's forward runs (PipelineStage.unit_offload_ops: only saved tensors on those storages go
  to host memory).

Both report the named calls the forward did not make (`missing`), which planner.runtime.
pipeline_units refuses in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from planner.core.pipeline_actions import saved_op, saved_op_parts


def op_name(func: Any) -> str:
    """'aten.addmm' for aten.addmm.default, 'aten.add' for aten.add_.Tensor (as the graph)."""
    packet = getattr(func, "overloadpacket", None)
    name = str(getattr(packet, "__name__", None) or getattr(func, "__name__", func))
    return _functional(f"{getattr(func, 'namespace', 'aten')}.{name}")


def _functional(op: str) -> str:
    """'aten.add_' -> 'aten.add' (an in-place call counts as its functional op)."""
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


class SavedOpsPolicy:
    """A selective-checkpointing policy for one call of a unit: MUST_SAVE for the calls named
    ('OP#K'), PREFER_RECOMPUTE for the rest. Calls are counted per op name, the forward and a
    recompute apart (`ctx.is_recompute`); `counts`: the forward's calls per op name."""

    def __init__(self, saved: Sequence[str]) -> None:
        self.saved = frozenset(saved_op(_functional(op), k) for op, k in map(saved_op_parts, saved))
        self.seen: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}

    @property
    def counts(self) -> Counter[str]:
        return self.seen[False]

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        op = op_name(func)
        seen = self.seen[bool(getattr(ctx, "is_recompute", False))]
        k = seen[op]
        seen[op] += 1
        if saved_op(op, k) in self.saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def missing(self) -> list[tuple[str, int]]:
        """(name, calls of its op) for each named call the forward did not make."""
        return _missing(self.saved, self.counts)


_CONSUMED = getattr(torch.utils.checkpoint, "_CONSUMED", None)  # torch's SAC cache entries
_RECOMPUTE = getattr(torch.utils.checkpoint, "_RECOMPUTE", None)


class _EveryBackward:
    """The recompute side of a selective checkpoint, serving every backward through the unit.
    Torch's marks a kept output consumed once its rerun read it (freeing it), so a second
    backward through the region (zero-bubble schedules run one for the inputs' gradients, then
    one per weight group) would fail: a later rerun recomputes what an earlier one consumed."""

    def __init__(self, cached: Any, storage: Any) -> None:
        self.cached = cached
        self.storage = storage  # op -> call index -> kept output, _RECOMPUTE or _CONSUMED

    def __enter__(self) -> Any:
        for calls in self.storage.values():
            for k, entry in calls.items():
                if entry is _CONSUMED:
                    calls[k] = _RECOMPUTE
        return self.cached.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.cached.__exit__(*exc)


def selective_contexts(policy: SavedOpsPolicy) -> tuple[Any, Any]:
    caching, cached = create_selective_checkpoint_contexts(policy)
    storage = getattr(cached, "storage", None)
    if storage is None or _CONSUMED is None or _RECOMPUTE is None:
        return caching, cached
    return caching, _EveryBackward(cached, storage)


def _missing(named: frozenset[str], counts: Counter[str]) -> list[tuple[str, int]]:
    """(name, calls of its op) for each named call the forward did not make."""
    out = []
    for name in sorted(named):
        op, k = saved_op_parts(name)
        if k >= counts[op]:
            out.append((name, counts[op]))
    return out


class CallOutputs(TorchDispatchMode):
    """While active: counts every call per op name and records the storages of the named
    calls' outputs (weakly: an output freed during the forward may have its address reused by
    a tensor no named call made, which `holds` then tells apart)."""

    def __init__(self, named: Sequence[str]) -> None:
        super().__init__()
        self.named = frozenset(saved_op(_functional(op), k)
                               for op, k in map(saved_op_parts, named))
        self.counts: Counter[str] = Counter()
        self.storages: dict[int, StorageWeakRef] = {}  # data pointer -> the storage

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        op = op_name(func)
        k = self.counts[op]
        self.counts[op] += 1
        if saved_op(op, k) in self.named:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    storage = t.untyped_storage()
                    self.storages[storage.data_ptr()] = StorageWeakRef(storage)
        return out

    def missing(self) -> list[tuple[str, int]]:
        return _missing(self.named, self.counts)

    def holds(self, t: torch.Tensor) -> bool:
        """`t` lies on a named call's output storage (that storage, still alive)."""
        storage = t.untyped_storage()
        ref = self.storages.get(storage.data_ptr())
        return ref is not None and not ref.expired() and ref.cdata == storage._cdata
