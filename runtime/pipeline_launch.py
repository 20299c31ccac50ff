"""Run a function in several local processes joined by a gloo process group (CPU pipelines).

`run_local(fn, world_size, *args)` starts `world_size` processes on this machine, each calling
`torch.distributed.init_process_group("gloo")` on a free port of 127.0.0.1 and then
`fn(rank, world_size, *args)`; it returns each rank's return value (which must pickle), in rank
order, or raises RuntimeError with the first failing rank's error. Tests and benchmarks use it;
real jobs use `torchrun` (examples/pipeline_torchrun.py).

"fork" (the default on Linux) starts fast because the children inherit the parent's imports;
each child runs torch with one intra-op thread (as DataLoader workers do), which also keeps
them from oversubscribing the cores. "spawn" starts clean interpreters (fn must then be
importable by name).
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple[Any, ...], out: Any
) -> None:
    try:
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            out.put((rank, True, fn(rank, world, *args)))
        except BaseException as e:  # queued before the group closes: the peers' errors follow
            out.put((rank, False, _describe(e)))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # reported to the parent, which raises
        out.put((rank, False, _describe(e)))


def _describe(e: BaseException) -> str:
    lines = traceback.format_exception(e)
    return f"{type(e).__name__}: {e}\n{''.join(lines[-6:])}"


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _first_cause(failures: list[str]) -> str:
    """The failure that is not a peer's closed connection (the rank that failed first)."""
    own = [f for f in failures if not any(m in f for m in PEER_GONE)]
    return (own or failures)[0]


def run_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    start_method: str = "fork",
    timeout_s: float = 120.0,
) -> list[Any]:
    """fn(rank, world_size, *args) in `world_size` gloo processes; their results by rank."""
    ctx: Any = mp.get_context(start_method)
    results: Any = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, port, args, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    failure: str | None = None
    try:
        while len(got) < world_size and failure is None:
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                failure = f"no result from ranks {sorted(set(range(world_size)) - set(got))} " \
                          f"within {timeout_s:.0f} s"
                break
            if ok:
                got[rank] = value
            else:
                failure = _first_cause([f"rank {rank}: {value}", *_more_failures(results)])
    finally:
        for p in procs:
            p.join(timeout=5 if failure is None else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if failure is not None:
        raise RuntimeError(failure)
    return [got[r] for r in range(world_size)]


def _more_failures(results: Any, wait_s: float = 1.0) -> list[str]:
    """Other ranks' failures that arrive within `wait_s` of the first."""
    out: list[str] = []
    while True:
        try:
            rank, ok, value = results.get(timeout=wait_s)
        except queue.Empty:
            return out
        if not ok:
            out.append(f"rank {rank}: {value}")
