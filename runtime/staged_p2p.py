"""Several pipeline ranks on one GPU: point-to-point messages of CUDA tensors over gloo, staged
through host memory.

NCCL refuses two ranks on one device, and gloo's send/recv read and write the tensor's pointer as
host memory, so a multi-rank pipeline cannot share one GPU as it stands. `install()` wraps
torch.distributed's send, recv, isend, irecv and batch_isend_irecv (the module attributes every
caller resolves at call time, torch.distributed.pipelining's stages and schedules included): a
CUDA tensor is sent as a host copy, and a receive lands in a host buffer that is copied into the
CUDA tensor when the work is waited. What stays on the device is what torch itself allocates
(receive buffers, sent tensors, activations); a send's work keeps its CUDA tensor alive until
it is waited, as NCCL's does, so the device memory a rank measures is the memory it would hold
with NCCL. Only the copies' time differs (the step time is not a pipeline's: the ranks also
share the GPU's compute).

`install(stage_all=True)` stages host tensors too (a copy to a fresh host tensor), so the
wrapping can be exercised on a machine without a GPU (tests/runtime/test_staged_p2p.py: the same
loss, gradients and per-rank peaks as unstaged). `benchmarks/gpu/whole_job_ranks.py` runs whole-job
plans this way on one GPU. Call it in each rank's process before the pipeline is built.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import _disable_current_modes

from planner.tracing.allocator_events import host_memory

_ORIGINAL: dict[str, Any] = {}
_NAMES = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


class _StagedWork:
    """A gloo work on a host copy; `wait()` finishes it and, for a receive, copies the host
    buffer into the device tensor. Until then it holds the device tensor (as NCCL's work does)."""

    def __init__(self, work: Any, device_tensor: torch.Tensor, host: torch.Tensor,
                 receive: bool) -> None:
        self.work = work
        self.device_tensor: torch.Tensor | None = device_tensor
        self.host: torch.Tensor | None = host
        self.receive = receive

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        done = self.work.wait(*args, **kwargs)
        if self.device_tensor is not None:
            if self.receive:
                assert self.host is not None
                with torch.no_grad(), _disable_current_modes():  # buffers: leaves with grad
                    self.device_tensor.copy_(self.host)
            self.device_tensor = self.host = None
        return bool(done) if done is not None else True

    def is_completed(self) -> bool:
        return self.device_tensor is None or bool(self.work.is_completed())


class _AllWorks:
    """Every work of a batch as one (torch versions that `.pop()` batch_isend_irecv's list and
    wait on that alone still wait for, and copy in, every receive)."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        for w in self.works:
            w.wait(*args, **kwargs)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def _staged(tensor: torch.Tensor, stage_all: bool) -> bool:
    return tensor.device.type != "cpu" or stage_all


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    # outside any dispatch mode and in a host scope: neither a storage tracker nor the
    # allocator's count of the step (planner.tracing.allocator_events) counts the copy
    with _disable_current_modes(), host_memory():
        return tensor.detach().to("cpu", copy=True)


def _host_buffer(tensor: torch.Tensor) -> torch.Tensor:
    with _disable_current_modes(), host_memory():
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")


def install(stage_all: bool = False) -> None:
    """Wrap torch.distributed's point-to-point calls (idempotent)."""
    if _ORIGINAL:
        return
    for name in _NAMES:
        _ORIGINAL[name] = getattr(c10d, name)

    def send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _staged(tensor, stage_all):
            tensor = _host_copy(tensor)
        return _ORIGINAL["send"](tensor, *args, **kwargs)

    def recv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not _staged(tensor, stage_all):
            return _ORIGINAL["recv"](tensor, *args, **kwargs)
        host = _host_buffer(tensor)
        out = _ORIGINAL["recv"](host, *args, **kwargs)
        with torch.no_grad(), _disable_current_modes():
            tensor.copy_(host)
        return out

    def started(name: str, tensor: torch.Tensor, args: Any, kwargs: Any) -> Any:
        """isend/irecv: the gloo work on a host copy (send) or host buffer (receive)."""
        if not _staged(tensor, stage_all):
            return _ORIGINAL[name](tensor, *args, **kwargs)
        receive = name == "irecv"
        host = _host_buffer(tensor) if receive else _host_copy(tensor)
        work = _ORIGINAL[name](host, *args, **kwargs)
        return None if work is None else _StagedWork(work, tensor, host, receive)

    def isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return started("isend", tensor, args, kwargs)

    def irecv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return started("irecv", tensor, args, kwargs)

    def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
        # gloo does not coalesce: one call per op, in the list's order (as torch does for it)
        works = []
        for op in p2p_op_list:
            if op.op in (isend, _ORIGINAL["isend"]):
                work = isend(op.tensor, group=op.group, tag=op.tag, group_dst=op.group_peer)
            else:
                work = irecv(op.tensor, group=op.group, tag=op.tag, group_src=op.group_peer)
            if work is not None:
                works.append(work)
        return [_AllWorks(works)] if works else []

    wrapped = {"send": send, "recv": recv, "isend": isend, "irecv": irecv,
               "batch_isend_irecv": batch_isend_irecv}
    for name, fn in wrapped.items():
        setattr(c10d, name, fn)  # P2POp's op check and send_object_list look here
        setattr(dist, name, fn)  # torch.distributed.pipelining calls dist.<name>


def uninstall() -> None:
    for name, fn in _ORIGINAL.items():
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    _ORIGINAL.clear()
