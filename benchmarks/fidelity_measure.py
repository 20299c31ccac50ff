"""Measuring one training step for the GPU fidelity benchmark: traces, the eager reference, a
plan's memory, time and gradient parity, and the traced graphs saved for CPU replays.

Memory: on CUDA the allocator's peak above the step's start (`planner.runtime.measure`:
parameters and inputs excluded, the gradients allocated during backward included, as
`zero_grad(set_to_none=True)` leaves them); on CPU exact live-storage accounting of the same.
Time: median of timed steps after warm-up (`time_steps`), `zero_grad(set_to_none=True)` before
each as a training loop does. Parity: the planned step's gradients against eager's, same seed.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GRAPH_FILE_LIMIT_BYTES = 2 * 2**20  # graphs saved under benchmarks/data stay small
SEED = 7


@contextlib.contextmanager
def autocast_context(device: str, autocast: str | None) -> Iterator[None]:
    """`torch.autocast` for the forward of a model trained under mixed precision, or nothing."""
    if autocast is None:
        yield
        return
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[autocast]
    with torch.autocast(device_type=device, dtype=dtype):
        yield


def trace_model(model: Any, inputs: tuple[Any, ...], autocast: str | None,
                repeats: int = 5) -> Any:
    """The op-level trace the benchmark plans on: measured costs (median of `repeats` runs of
    each op), dropout masks as the runtime keeps them, gradients created in backward (how a
    default torch loop trains)."""
    from planner.tracing.api import trace

    kwargs: dict[str, Any] = dict(costs="measure", dropout_masks="graph",
                                  gradient_lifetime="backward", repeats=repeats,
                                  warmup=1 if repeats > 1 else 0)
    if autocast is not None:
        kwargs["autocast"] = autocast
    try:
        return trace(model, inputs, **kwargs)
    except TypeError as e:
        if autocast is not None and "autocast" in str(e):
            raise RuntimeError(f"trace(autocast={autocast!r}) is not available here: {e}") from e
        raise


def machine_resources(device: str) -> Any:
    """The machine the offload planners plan for: measured links on CUDA, a preset on CPU."""
    if device == "cuda":
        from planner.runtime.offload_measure import measured_resources

        return measured_resources("cuda")
    from planner.core.resources import resources_preset

    return resources_preset("h100-pcie-gen5").model_copy(update={"host_memory_bytes": 2**34})


def training_step(module: Any, inputs: tuple[Any, ...], device: str,
                  autocast: str | None) -> Callable[[], Any]:
    """forward (under autocast when given) + loss + backward, returning the loss."""
    from planner.tracing.capture import compute_loss

    def step() -> Any:
        with autocast_context(device, autocast):
            loss = compute_loss(module(*inputs))
        loss.backward()
        return loss.detach()

    return step


@dataclass(frozen=True)
class Reference:
    loss: float
    grads: dict[str, torch.Tensor]
    scale: float  # the largest |gradient entry|


def seeded_grads(model: Any, step: Callable[[], Any], device: str
                 ) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one step from seed SEED (dropout draws the same masks)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)  # seeds CUDA too
    loss = float(step())
    if device == "cuda":
        torch.cuda.synchronize()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss, grads


def eager_reference(model: Any, inputs: tuple[Any, ...], device: str,
                    autocast: str | None) -> Reference:
    loss, grads = seeded_grads(model, training_step(model, inputs, device, autocast), device)
    scale = max((float(g.abs().max()) for g in grads.values()), default=0.0)
    return Reference(loss, grads, scale)


def measure(model: Any, step: Callable[[], Any], device: str, repeats: int,
            ref: Reference | None = None) -> dict[str, Any]:
    """Measured peak, median step ms of `repeats` steps and (with `ref`) gradient parity of
    `step`. On CUDA after two warm-up steps (cuBLAS workspaces, pinned pools); `repeats` 0 times
    the parity step alone (a CPU smoke run's informational time)."""
    from planner.runtime.measure import measure_step, time_steps

    cuda = device == "cuda"

    def clean_step() -> Any:
        model.zero_grad(set_to_none=True)
        return step()

    for _ in range(2 if cuda else 0):
        clean_step()
    mem = measure_step(step, model, device)
    out: dict[str, Any] = {"meas_peak_bytes": int(mem.peak_bytes)}
    if repeats > 0:
        out["step_ms"] = round(time_steps(clean_step, warmup=1, repeats=repeats, cuda=cuda), 3)
    if ref is not None:
        started = time.perf_counter()
        loss, grads = seeded_grads(model, step, device)
        if repeats <= 0:
            out["step_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        missing = set(ref.grads) ^ set(grads)
        out["loss_diff"] = abs(loss - ref.loss)
        out["grad_scale"] = ref.scale
        out["max_grad_diff"] = float("inf") if missing else max(
            (float((grads[n].float() - g.float()).abs().max()) for n, g in ref.grads.items()),
            default=0.0)
    model.zero_grad(set_to_none=True)
    return out


def measure_plan(model: Any, module: Any, inputs: tuple[Any, ...], device: str,
                 autocast: str | None, repeats: int, ref: Reference) -> dict[str, Any]:
    """`measure` of a planned module's step, with what its last step moved over the links."""
    out = measure(model, training_step(module, inputs, device, planned_autocast(autocast)),
                  device, repeats, ref)
    stats = getattr(module, "last_transfer_stats", None)
    if stats is not None:
        out["d2h_bytes"], out["h2d_bytes"] = int(stats.d2h_bytes), int(stats.h2d_bytes)
    return out


def planned_autocast(autocast: str | None) -> str | None:
    """The autocast a planned module runs under: the user's loop unchanged, the planned module
    in place of the model inside the same autocast block (the runtime replays the traced
    graph's own casts with autocast off, inside or outside such a block)."""
    return autocast


def device_tag(device: str) -> str:
    """'cuda_nvidia-h100-80gb-hbm3' or 'cpu': the prefix of saved graph files."""
    if device != "cuda":
        return "cpu"
    name = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return f"cuda_{name}"


def save_graph(graph: Any, folder: Path, tag: str, model_name: str) -> tuple[Path, str]:
    """Write `graph` (measured costs) as folder/<tag>_<model>.json; a note if it is too big."""
    from planner.core.io import write_json

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{tag}_{model_name}.json"
    write_json(path, graph)
    size = path.stat().st_size
    note = "" if size <= GRAPH_FILE_LIMIT_BYTES else (
        f"{path.name} is {size / 2**20:.1f} MiB, over the {GRAPH_FILE_LIMIT_BYTES >> 20} MiB "
        "meant for benchmarks/data: do not commit it")
    return path, note
