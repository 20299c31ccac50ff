"""A model's fingerprint: what decides its joint graph, hashed without capturing anything.

`apply` re-traces a plan's model to run it; the capture (dynamo + AOTAutograd) is most of that
time. A trace records the fingerprint of what it captured (`graph.trace_options["fingerprint"]`,
copied into the plan) and keeps the capture in the capture store (planner.tracing.capture_store);
a later trace of a model with the same fingerprint can use the recorded capture instead.

The fingerprint covers what the graph depends on and can be read without running the model:
torch's version; each module's class (and the hash of the source file defining it, for classes
outside torch) and its plain settings (`p` of a dropout, `eps` of a norm, `training`); every
parameter's and buffer's name, shape, dtype, device and `requires_grad`; each input's shape,
dtype and device (a non-tensor input by its value); a configuration object's fields
(`to_dict()`, as transformers' configs); the loss function; the autocast setting and
the grad mode. Values do not count (the capture is data-independent: a data-dependent branch is
refused at capture). Code outside the model's own classes' files (a helper module the forward
calls) is not covered: the graph hash that `apply` checks afterwards still catches any change of
the graph's structure or sizes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

FINGERPRINT_VERSION = 1  # bump when what is covered changes
_PLAIN = (bool, int, float, str, type(None))


def model_fingerprint(model: Any, inputs: tuple[Any, ...], loss_fn: Any = None,
                      autocast: str | None = None) -> tuple[str, dict[str, Any]]:
    """('sha256:…', the parts hashed) of `model(*inputs)` traced with `loss_fn`, `autocast`."""
    parts = fingerprint_parts(model, inputs, loss_fn, autocast)
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest(), parts


def fingerprint_parts(model: Any, inputs: tuple[Any, ...], loss_fn: Any = None,
                      autocast: str | None = None) -> dict[str, Any]:
    import torch

    modules: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        cls = type(module)
        modules[name or "."] = [_qualname(cls), _settings(module)]
        for klass in cls.__mro__:
            source = _source_hash(klass.__module__)
            if source is not None:
                sources[klass.__module__] = source
    if loss_fn is not None:
        owner = getattr(loss_fn, "__module__", None) or type(loss_fn).__module__
        source = _source_hash(owner)
        if source is not None:
            sources[owner] = source
    return {
        "version": FINGERPRINT_VERSION,
        "torch": str(torch.__version__),
        "model": _qualname(type(model)),
        "modules": modules,
        "parameters": {n: _tensor(p) for n, p in model.named_parameters(remove_duplicate=False)},
        "buffers": {n: _tensor(b) for n, b in model.named_buffers(remove_duplicate=False)},
        "inputs": [_value(x) for x in inputs],
        "loss": loss_name(loss_fn),
        "autocast": autocast,
        "grad_enabled": torch.is_grad_enabled(),
        "sources": sources,
    }


def loss_name(loss_fn: Any) -> str | None:
    """'module:qualname' of a loss function (None: the model's own loss), for messages."""
    if loss_fn is None:
        return None
    named = loss_fn if hasattr(loss_fn, "__qualname__") else type(loss_fn)
    return f"{getattr(named, '__module__', '?')}:{named.__qualname__}"


_ORDER = ("torch", "parameters", "buffers", "inputs", "loss", "autocast", "grad_enabled",
          "model", "modules", "sources", "version")
_LABELS = {"parameters": "parameter", "buffers": "buffer", "modules": "module",
           "sources": "source file of"}


def differences(recorded: dict[str, Any], now: dict[str, Any], limit: int = 3) -> list[str]:
    """What differs between two fingerprints' parts, in words, most telling first
    ('parameter h.0.weight: [16, 16] float32 then, [24, 24] float32 now', ...)."""
    out: list[str] = []
    keys = [k for k in _ORDER if k in recorded or k in now]
    keys += sorted((set(recorded) | set(now)) - set(keys))
    for key in keys:
        a, b = recorded.get(key), now.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and key in _LABELS:
            for name in sorted(set(a) | set(b), key=lambda n: (n not in a or n not in b, n)):
                if a.get(name) != b.get(name):
                    out.append(f"{_LABELS[key]} {name}: {_what_differs(a.get(name), b.get(name))}")
                if len(out) >= limit:
                    break
        else:
            out.append(f"{key}: {_short(a)} then, {_short(b)} now")
        if len(out) >= limit:
            break
    return out[:limit]


def _what_differs(a: Any, b: Any) -> str:
    """'in_features 16 then, 24 now' for a module's settings; else both values."""
    if a is None or b is None:
        return "absent then" if a is None else "absent now"
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) == 2 \
            and isinstance(a[1], dict) and isinstance(b[1], dict) and a[0] == b[0]:
        changed = [k for k in sorted(set(a[1]) | set(b[1])) if a[1].get(k) != b[1].get(k)]
        if changed:
            k = changed[0]
            return f"{k} {_short(a[1].get(k))} then, {_short(b[1].get(k))} now"
    return f"{_short(a)} then, {_short(b)} now"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _settings(module: Any) -> dict[str, Any]:
    """A module's plain attributes (numbers, strings, tuples of them): its hyper-parameters."""
    out: dict[str, Any] = {}
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        if isinstance(value, _PLAIN):
            out[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
            out[key] = list(value)
        elif callable(getattr(value, "to_dict", None)) and not isinstance(value, type):
            try:  # a configuration object (transformers' PretrainedConfig): its fields
                fields = value.to_dict()
            except Exception:
                continue
            if isinstance(fields, dict):
                out[key] = json.loads(json.dumps(fields, sort_keys=True, default=str))
    return out


def _tensor(t: Any) -> list[Any]:
    return [list(t.shape), str(t.dtype), t.device.type, bool(t.requires_grad)]


def _value(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return ["tensor", *_tensor(x)]
    if isinstance(x, (tuple, list)):
        return [_value(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _value(v) for k, v in x.items()}
    if isinstance(x, _PLAIN):
        return x
    return f"{type(x).__module__}:{type(x).__qualname__}"


def _source_hash(module_name: str) -> str | None:
    """sha256 of the source file of a module outside torch (None: torch's, or no file)."""
    if module_name.split(".")[0] in ("torch", "builtins", "typing", "abc"):
        return None
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        return None
    return _file_hash(str(p), stat.st_mtime_ns, stat.st_size)


@cache
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
