"""The capture store: joint graphs kept on disk by model fingerprint, so that a later trace of
the same model (`apply` running a plan) need not capture again.

A capture is the joint fx graph with what each node's metadata says (fake-tensor shapes,
strides and dtypes, partitioner tags, sequence numbers, module stacks, AOT descriptors) and
what its placeholders and outputs are (planner.tracing.capture.JointCapture). `save` writes it
as plain data (no code) to `<dir>/<fingerprint>.capture`; `load` rebuilds the graph module, its
values fake tensors of the recorded sizes. A capture whose graph holds something this format
does not describe (a higher-order op, a symbolic size) is not kept: `save` says so and returns
False, and the next trace captures again.

The directory: PLANNER_TRACE_CACHE, else `$XDG_CACHE_HOME/planner/captures` (`~/.cache/...`);
PLANNER_TRACE_CACHE=off keeps nothing. At most KEEP captures are kept (the least recently used
go first). The files are pickles of plain data, read back by an
unpickler that accepts nothing else (no code runs from a store file).
"""

from __future__ import annotations

import builtins
import importlib
import io
import operator
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

FORMAT = 1
ENV = "PLANNER_TRACE_CACHE"
KEEP = 64  # captures kept; saving one more removes the least recently used
OFF = ("off", "0", "none", "no", "false")
_KEPT_META = ("val", "partitioner_tag", "seq_nr", "nn_module_stack", "source_fn_stack", "desc",
              "original_aten", "stack_trace", "is_gradient_acc", "autograd_backward",
              "fwd_nn_module_stack", "fwd_source_fn_stack")


class _Unsupported(Exception):
    """Something the format does not describe."""


def store_dir() -> Path | None:
    """Where captures are kept; None when the store is off."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in OFF:
        return None
    if setting:
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "planner" / "captures"


def capture_path(fingerprint: str) -> Path | None:
    folder = store_dir()
    if folder is None:
        return None
    return folder / (fingerprint.replace("sha256:", "") + ".capture")


def save(fingerprint: str, cap: Any, parts: dict[str, Any]) -> bool:
    """Keep `cap` (a JointCapture) under `fingerprint`; False when the store is off, the graph
    holds what the format does not describe, or the file cannot be written."""
    path = capture_path(fingerprint)
    if path is None:
        return False
    try:
        payload = {"format": FORMAT, "fingerprint": fingerprint, "parts": parts,
                   **_encode_capture(cap)}
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except (_Unsupported, pickle.PicklingError, TypeError, AttributeError):
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: concurrent traces of one model write the same bytes
    except OSError:
        return False
    _prune(path.parent)
    return True


def _prune(folder: Path, keep: int = KEEP) -> None:
    """Remove all but the `keep` most recently used captures (a load touches its file)."""
    try:
        files = sorted(folder.glob("*.capture"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[keep:]:
            old.unlink(missing_ok=True)
    except OSError:  # another process pruned the same file: nothing to do
        pass


def recorded_parts(fingerprint: str) -> dict[str, Any] | None:
    """The fingerprint parts of the capture kept under `fingerprint` (None: none kept)."""
    payload = _read(fingerprint)
    return None if payload is None else payload.get("parts")


def load(fingerprint: str) -> Any:
    """The JointCapture kept under `fingerprint`, rebuilt; None when there is none (or it is
    unreadable: the caller captures again)."""
    payload = _read(fingerprint)
    if payload is None:
        return None
    path = capture_path(fingerprint)
    try:
        if path is not None:
            os.utime(path)  # recently used: kept by `_prune`
    except OSError:
        pass
    try:
        return _decode_capture(payload)
    except Exception:  # a file of another torch, a missing op: capture again
        return None


def _read(fingerprint: str) -> dict[str, Any] | None:
    path = capture_path(fingerprint)
    if path is None or not path.is_file():
        return None
    try:
        payload = _SafeUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception:  # unreadable, another format, or a global the format never writes
        return None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT \
            or payload.get("fingerprint") != fingerprint:
        return None
    return payload


class _SafeUnpickler(pickle.Unpickler):
    """Loads only what `save` writes: plain data, torch's dtypes, devices, layouts and memory
    formats, and AOTAutograd's descriptor dataclasses; any other global (a function a crafted
    file would call) is refused, so a store folder others can write to runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "builtins" and name in ("slice", "set", "frozenset", "complex"):
            return getattr(builtins, name)
        if module in ("torch", "torch._utils"):  # memory formats pickle as torch._utils's
            value = getattr(torch, name.removeprefix("torch."), None)
            if value is torch.device or isinstance(
                    value, torch.dtype | torch.layout | torch.memory_format):
                return value
        if (module, name) == ("torch.serialization", "_get_layout"):  # how layouts pickle
            return _layout

        if module.startswith("torch._functorch._aot_autograd.descriptors") and \
                not name.startswith("_"):
            value = getattr(importlib.import_module(module), name, None)
            if isinstance(value, type):
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a capture file")


def _layout(name: str) -> Any:
    """torch.serialization._get_layout, for layouts only ('torch.strided' -> torch.strided)."""
    import torch

    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.layout):
        raise pickle.UnpicklingError(f"{name!r} is not a layout")
    return value


def _raw_tensor(t: Any) -> tuple[Any, ...]:
    """A constant tensor as plain data: dtype, shape and its bytes."""
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return ("raw", t.dtype, tuple(t.shape), data)


def _tensor_from_raw(raw: tuple[Any, ...]) -> Any:
    import torch

    _, dtype, shape, data = raw
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


# -- encoding ----------------------------------------------------------------------------------
def _encode_capture(cap: Any) -> dict[str, Any]:
    import torch

    gm = cap.gm
    nodes = []
    attrs: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor) or "." in node.target:
                raise _Unsupported(f"get_attr {node.target}")
            attrs[node.target] = _raw_tensor(value)
        elif node.op not in ("placeholder", "output", "call_function"):
            raise _Unsupported(node.op)
        meta = {}
        for key in _KEPT_META:
            if key in node.meta:
                try:
                    meta[key] = _enc(node.meta[key])
                except _Unsupported:
                    if key == "val":
                        raise
        nodes.append({
            "name": node.name, "op": node.op, "target": _enc_target(node),
            "args": _enc(node.args), "kwargs": _enc(node.kwargs), "meta": meta,
        })
    return {
        "nodes": nodes, "attrs": attrs, "num_fwd_outputs": cap.num_fwd_outputs,
        "primal_kinds": dict(cap.primal_kinds), "primal_names": dict(cap.primal_names),
        "loss_node": cap.loss_node, "gradient_nodes": dict(cap.gradient_nodes),
        "tangent_nodes": list(cap.tangent_nodes),
    }


def _enc_target(node: Any) -> Any:
    import torch

    target = node.target
    if node.op != "call_function":
        return target
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target.namespace, target._opname, target._overloadname)
    if target is operator.getitem:
        return ("py", "operator", "getitem")
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module in ("_operator", "operator") and name:
        return ("py", "operator", name)
    if module and name and "<" not in name:
        return ("py", module, name)
    raise _Unsupported(f"target {target!r}")


def _enc(x: Any) -> Any:
    import torch
    import torch.fx

    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, torch.fx.Node):
        return ("N", x.name)
    if isinstance(x, torch.Tensor):
        return ("T", _tensor_spec(x))
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise _Unsupported("symbolic size")
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return ("U", [_enc(v) for v in x])
    if isinstance(x, list):
        return ("L", [_enc(v) for v in x])
    if isinstance(x, dict):
        return ("D", [(_enc(k), _enc(v)) for k, v in x.items()])
    if isinstance(x, slice):
        return ("S", [_enc(x.start), _enc(x.stop), _enc(x.step)])
    if isinstance(x, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return ("O", x)
    if isinstance(x, type) or callable(x) and hasattr(x, "__qualname__"):
        if isinstance(x, torch._ops.OpOverload):
            return ("op", x.namespace, x._opname, x._overloadname)
        module, name = getattr(x, "__module__", None), x.__qualname__
        if module and "<" not in name:
            return ("C", module, name)
        raise _Unsupported(f"callable {x!r}")
    try:  # AOT descriptors and other small dataclasses
        pickle.dumps(x)
    except Exception as e:
        raise _Unsupported(type(x).__name__) from e
    return ("O", x)


def _tensor_spec(t: Any) -> tuple[Any, ...]:
    try:
        nbytes = int(t.untyped_storage().nbytes())
    except Exception:
        nbytes = -1
    return (tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()),
            int(t.storage_offset()), nbytes, t.dtype, str(t.device), bool(t.requires_grad))


# -- decoding ----------------------------------------------------------------------------------
def _decode_capture(payload: dict[str, Any]) -> Any:
    import torch
    import torch.fx

    from planner.tracing.capture import JointCapture

    mode = None
    graph = torch.fx.Graph()
    env: dict[str, Any] = {}
    for nd in payload["nodes"]:
        target = _dec_target(nd["op"], nd["target"])
        args = _dec(nd["args"], env, mode)
        kwargs = _dec(nd["kwargs"], env, mode)
        node = graph.create_node(nd["op"], target, tuple(args), dict(kwargs), name=nd["name"])
        if node.name != nd["name"]:
            raise _Unsupported(f"node name {nd['name']} became {node.name}")
        node.meta = {k: _dec(v, env, mode) for k, v in nd["meta"].items()}
        env[nd["name"]] = node
    root = torch.nn.Module()
    for name, value in payload["attrs"].items():
        root.register_buffer(name, _tensor_from_raw(value))
    gm = torch.fx.GraphModule(root, graph)
    return JointCapture(
        gm=gm, num_fwd_outputs=payload["num_fwd_outputs"],
        primal_kinds=dict(payload["primal_kinds"]), primal_names=dict(payload["primal_names"]),
        loss_node=payload["loss_node"], gradient_nodes=dict(payload["gradient_nodes"]),
        tangent_nodes=list(payload["tangent_nodes"]),
    )


def _dec_target(op: str, target: Any) -> Any:
    if op != "call_function":
        return target
    kind = target[0]
    if kind == "op":
        return _op(*target[1:])
    return _import(target[1], target[2])


def _op(namespace: str, name: str, overload: str) -> Any:
    import torch

    packet = getattr(getattr(torch.ops, namespace), name)
    return getattr(packet, overload or "default")


def _import(module: str, qualname: str) -> Any:
    if module == "builtins":
        return getattr(builtins, qualname)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _dec(x: Any, env: dict[str, Any], mode: Any) -> Any:
    if not isinstance(x, tuple):
        return x
    kind, *rest = x
    if kind == "N":
        return env[rest[0]]
    if kind == "U":
        return tuple(_dec(v, env, mode) for v in rest[0])
    if kind == "L":
        return [_dec(v, env, mode) for v in rest[0]]
    if kind == "D":
        return {_dec(k, env, mode): _dec(v, env, mode) for k, v in rest[0]}
    if kind == "S":
        return slice(*(_dec(v, env, mode) for v in rest[0]))
    if kind == "O":
        return rest[0]
    if kind == "T":
        return _fake(rest[0], mode)
    if kind == "op":
        return _op(*rest)
    if kind == "C":
        try:
            return _import(rest[0], rest[1])
        except (ImportError, AttributeError):
            return f"{rest[0]}.{rest[1]}"
    raise _Unsupported(f"tag {kind!r}")


def _fake(spec: tuple[Any, ...], mode: Any) -> Any:
    shape, stride, offset, nbytes, dtype, device, requires_grad = spec
    return _recorded_tensor_type()(shape, stride, offset, nbytes, dtype, device, requires_grad)


@cache
def _recorded_tensor_type() -> type:
    """A tensor of metadata only (sizes, strides, dtype, device, storage bytes), as a capture's
    fake tensors are to the tracer and the runtime; running an op on it is an error. (A
    FakeTensorMode would import all of dynamo, the time the store saves.)"""
    import torch

    class _Storage:
        def __init__(self, nbytes: int) -> None:
            self._nbytes = nbytes

        def nbytes(self) -> int:
            return self._nbytes

    class RecordedTensor(torch.Tensor):
        _storage_nbytes: int

        @staticmethod
        def __new__(cls, shape: Any, stride: Any, offset: int, nbytes: int, dtype: Any,
                    device: str, requires_grad: bool) -> Any:
            t = torch.Tensor._make_wrapper_subclass(
                cls, shape, strides=stride, storage_offset=offset, dtype=dtype,
                device=torch.device(device), requires_grad=requires_grad)
            itemsize = t.element_size()
            dense = (offset + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))
                     + 1) * itemsize if all(shape) else 0
            t._storage_nbytes = nbytes if nbytes >= 0 else dense
            return t

        def __init__(self, *args: Any) -> None:
            pass

        def untyped_storage(self) -> Any:
            return _Storage(self._storage_nbytes)

        def __repr__(self) -> str:  # type: ignore[override]
            return (f"RecordedTensor(size={tuple(self.shape)}, dtype={self.dtype}, "
                    f"device={self.device})")

        @classmethod
        def __torch_dispatch__(  # type: ignore[override]
                cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise RuntimeError(f"{func}: a recorded capture's values are sizes only")

    return RecordedTensor
