"""CPU convolutions' and batch norms' own buffers (im2col columns, reordered weights, per-thread
scratch, a batch norm backward's products): what such an op allocates and frees while it runs,
above its outputs, as the allocator's own records (planner.tracing.allocator_events) see it.
Other CPU ops allocate at most a wrapped scalar (8-12 B) beside their outputs.

Each such op of the joint graph is run once on zero tensors of its inputs' shapes, strides
and dtypes, all of them in one torch.profiler session (`profile_memory=True`; starting and
stopping one costs ~110 ms, so never one per op). Around each op the allocator is sent a marker,
a uint8 storage of an odd size no tensor of the graph has (marker i is `MARK_BASE + 2i` bytes;
2k before op k, 2k + 1 after it) allocated and freed at once, so that the raw memory records
read in time order split into one window per op. The op's peak is the most bytes live inside
its window above the window's start; its workspace is that peak less the bytes of the outputs
the graph keeps (of a multi-output op, the elements a `getitem` reads), never below 0.
Identical calls (target; argument shapes, strides, dtypes and values; intra-op threads) are
measured once per process. Under an open profiler session (none nests) nothing is measured.

    measure_cpu_workspace_bytes(cap.gm)   # {fx name: bytes}
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from torch._C._autograd import DeviceType

from planner.tracing.records import dense_bytes

__all__ = ["MEASURED_OPS", "MARK_BASE", "is_measured", "kept_output_bytes",
           "measure_cpu_workspace_bytes", "window_peaks"]

# aten packets measured: what a joint graph holds for nn.Conv*d (convolution and its
# backward) and the device-specific kernels a graph can hold once decomposed; batch norms
# (forward: a few hundred bytes of statistics; backward: up to an input's size)
MEASURED_OPS = frozenset({
    "convolution", "_convolution", "convolution_backward", "convolution_overrideable",
    "convolution_backward_overrideable", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution", "_slow_conv2d_forward",
    "_slow_conv2d_backward", "slow_conv3d_forward", "slow_conv_dilated2d", "slow_conv_dilated3d",
    "slow_conv_transpose2d", "slow_conv_transpose3d", "thnn_conv2d",
    "_nnpack_spatial_convolution", "_mps_convolution",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "native_batch_norm_backward", "batch_norm_backward",
    # CPU dropout draws its mask in the input's dtype, then returns a bool one: 4 B an element
    # while it runs (a GPT's recompute-all plan measured 105,984 B over its prediction)
    "native_dropout",
})

MARK_BASE = 999_983  # odd: no float/half/int tensor of a graph has a marker's byte size

_Key = tuple[Any, ...]
_PEAKS: dict[_Key, int] = {}  # measured peak above the window start, per identical call


def is_measured(target: Any) -> bool:
    """A convolution or batch norm (MEASURED_OPS) of aten."""
    packet = getattr(target, "overloadpacket", None)
    return (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
            and packet is not None and packet.__name__ in MEASURED_OPS)


def measure_cpu_workspace_bytes(gm: torch.fx.GraphModule,
                                eager_dropout: bool = False) -> dict[str, int]:
    """{fx name: workspace bytes > 0} of `gm`'s convolutions, batch norms and dropouts (module
    doc). `eager_dropout`: the graph sizes a dropout's mask as CPU eager keeps it (the input's
    dtype, planner.tracing.records): that buffer is its output then, not its workspace."""
    keys: dict[str, _Key] = {}
    nodes: dict[str, torch.fx.Node] = {}
    todo: dict[_Key, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_measured(node.target):
            continue
        if eager_dropout and node.target is torch.ops.aten.native_dropout.default:
            continue
        key = _call_key(node)
        if key is None:
            continue
        keys[node.name], nodes[node.name] = key, node
        if key not in _PEAKS:
            todo.setdefault(key, node)
    if todo:
        _PEAKS.update(_measure_peaks(todo))
    out: dict[str, int] = {}
    for name, key in keys.items():
        peak = _PEAKS.get(key)
        if peak is None:
            continue
        workspace = peak - kept_output_bytes(nodes[name])
        if workspace > 0:
            out[name] = workspace
    return out


def kept_output_bytes(node: torch.fx.Node) -> int:
    """The bytes of the outputs the graph charges the op: all of a tensor result; of a tuple,
    the elements some `getitem` reads (the others the op frees before the graph sees them)."""
    val = node.meta.get("val")
    if not isinstance(val, (list, tuple)):
        return dense_bytes(val)
    read = {u.args[1] for u in node.users if u.target is operator.getitem}
    return sum(dense_bytes(v) for i, v in enumerate(val) if i in read)


def _call_key(node: torch.fx.Node) -> _Key | None:
    """What decides the op's allocations; None when an input is no known tensor."""
    parts: list[Any] = []
    ok = True

    def describe(a: Any) -> Any:
        nonlocal ok
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if not isinstance(val, torch.Tensor):
                ok = False
                return None
            return ("T", tuple(val.shape), tuple(val.stride()), str(val.dtype))
        if isinstance(a, (list, tuple)):
            return tuple(describe(x) for x in a)
        return repr(a)

    parts.append(str(node.target))
    parts.append(describe(tuple(node.args)))
    parts.append(tuple(sorted((k, describe(v)) for k, v in node.kwargs.items())))
    parts.append(torch.get_num_threads())
    return tuple(parts) if ok else None


def _materialize(node: torch.fx.Node) -> tuple[Any, Any]:
    def real(a: Any) -> Any:
        val = a.meta["val"]
        return torch.empty_strided(tuple(val.shape), tuple(val.stride()),
                                   dtype=val.dtype).zero_()

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), real)
    return args, kwargs


def _mark(i: int) -> None:
    """Marker i: MARK_BASE + 2i bytes (odd), allocated and freed."""
    marker = torch.empty(MARK_BASE + 2 * i, dtype=torch.uint8)
    del marker


def _measure_peaks(todo: dict[_Key, torch.fx.Node]) -> dict[_Key, int]:
    # The autograd profiler, not torch.profiler.profile: the same kineto session and memory
    # records, but torch.profiler's start imports torch._inductor, and with it all of dynamo
    # (seconds), which a trace reusing a recorded capture has no other use for.
    from torch.autograd.profiler import profile

    if torch.autograd.profiler._is_profiler_enabled:  # a session is open: none nests
        return {}
    jobs = list(todo.items())
    failed: set[int] = set()
    with torch.no_grad(), profile(use_cpu=True, profile_memory=True) as prof:
        for k, (_key, node) in enumerate(jobs):
            args, kwargs = _materialize(node)
            op: Any = node.target
            _mark(2 * k)
            try:
                result = op(*args, **kwargs)
            except Exception:  # not runnable standalone: no workspace recorded
                failed.add(k)
                result = None
            _mark(2 * k + 1)
            del result, args, kwargs
    records = [(e.start_ns(), e.nbytes()) for e in prof.kineto_results.events()
               if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    peaks = window_peaks(delta for _, delta in sorted(records, key=lambda r: r[0]))
    return {key: peaks[k] for k, (key, _node) in enumerate(jobs)
            if k in peaks and k not in failed}


def window_peaks(deltas: Iterable[int]) -> dict[int, int]:
    """{op k: the most bytes live between markers 2k and 2k + 1 above the live bytes at
    marker 2k}, from allocator deltas in time order (markers' own records left out)."""
    peaks: dict[int, int] = {}
    live = 0
    start = peak = 0
    expect = 0  # the next marker's index
    inside = False
    for delta in deltas:
        size = abs(delta)
        if size >= MARK_BASE and (size - MARK_BASE) % 2 == 0 and \
                (size - MARK_BASE) // 2 <= expect:
            index = (size - MARK_BASE) // 2
            if delta > 0 and index == expect:
                if expect % 2 == 0:
                    inside, start, peak = True, live, live
                else:
                    if inside:
                        peaks[expect // 2] = peak - start
                    inside = False
                expect += 1
            continue  # a marker's allocation or free: not the op's
        live += delta
        if inside:
            peak = max(peak, live)
    return peaks
