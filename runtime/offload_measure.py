"""Measuring the host link and offloaded steps: what the simulator needs to predict a real step.

`measure_links(device)` times pinned copies each way (a small one for the latency, a large one
for the bandwidth) and returns the two `Link`s; `measured_resources(device)` is one device with
those links, its memory and a host tier. `save_on_cpu_step` is the baseline users have today:
`torch.autograd.graph.save_on_cpu`, every saved tensor copied to the host and back.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from planner.core.resources import Link, Resources


def _copy_ms(dst: torch.Tensor, src: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        started = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])


def measure_links(
    device: torch.device | str = "cuda", large_bytes: int = 256 * 2**20, repeats: int = 5
) -> tuple[Link, Link]:
    """(h2d, d2h) of this machine, from pinned copies of 4 KiB and `large_bytes`."""
    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError("measure_links: needs a CUDA device")
    out: list[Link] = []
    for to_device in (True, False):
        small_ms = []
        big_ms = 0.0
        for nbytes in (4096, large_bytes):
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            dst, src = (dev, host) if to_device else (host, dev)
            ms = _copy_ms(dst, src, repeats)
            if nbytes == 4096:
                small_ms.append(ms)
            else:
                big_ms = ms
        latency_s = min(small_ms) / 1e3
        bandwidth = large_bytes / max(big_ms / 1e3 - latency_s, 1e-9)
        out.append(Link(bandwidth_bytes_per_s=bandwidth, latency_s=latency_s))
    return out[0], out[1]


def measured_resources(device: torch.device | str = "cuda", host_bytes: int = 64 * 2**30
                       ) -> Resources:
    """One device as measured: its memory, measured h2d/d2h links, `host_bytes` of host tier."""
    device = torch.device(device)
    h2d, d2h = measure_links(device)
    props = torch.cuda.get_device_properties(device)
    return Resources(
        device_memory_bytes=int(props.total_memory), device_name=props.name,
        host_memory_bytes=host_bytes, h2d=h2d, d2h=d2h,
    )


def save_on_cpu_step(
    model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any = None
) -> Callable[[], Any]:
    """One eager training step under `torch.autograd.graph.save_on_cpu(pin_memory=True)`."""
    from planner.tracing.capture import compute_loss

    def step() -> Any:
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            loss = compute_loss(model(*inputs), loss_fn)
        loss.backward()
        return loss.detach()

    return step
