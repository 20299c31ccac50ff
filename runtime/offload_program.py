"""Plans with host copies (`O`, `P`, `D`, alone or with recomputation) on the joint graph.

The same program as the remat executor (planner.runtime.op_executor: the plan split at the first
computation that needs the loss's tangent, each segment compiled to straight-line code), with
more statements: `X.offload(v, V)`, `X.release(v)` before the plan's `F v` of a node with a host
copy (the compute stream waits for the copies still using its storages, which go right there,
in program order: planner.runtime.offload_engine), `X.prefetch(v, V)` which brings v's values
back into the held set, `X.drop(v)`, and `X.ready(v)` before the first computation reading a
prefetched node (on CUDA the compute stream waits there for the copy). `X` is the step's
`planner.runtime.offload_engine.StepCopies`.

What may run is the event simulator's to say, on the plan's resources (a host tier is needed):
the program is refused with the simulator's message otherwise.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from planner.core.plan import Action, ActionOp
from planner.core.resources import Resources
from planner.runtime.offload_engine import CopyStreams, StepCopies, TransferStats
from planner.runtime.offload_pack import GroupLayout, group_layouts
from planner.runtime.op_codegen import (
    CompiledSegment,
    PlanExecutionError,
    SegmentCompiler,
    _Emitter,
)
from planner.runtime.op_executor import JointProgram, PlanRun


class OffloadProgram(JointProgram):
    """A JointProgram whose plan may copy node outputs to the host and back."""

    def __init__(self, trace: Any, actions: Sequence[Action], resources: Resources | None) -> None:
        # JointProgram's set-up, with the event simulator on the plan's resources, the tensors'
        # layouts and the offload compiler (the hooks below).
        super().__init__(trace, actions, resources)
        self._streams: dict[str, CopyStreams] = {}

    # what makes the copy streams of a device (a test puts a copy that completes late here)
    streams_class: type[CopyStreams] = CopyStreams

    def _prepare(self) -> None:
        self.layouts: dict[int, GroupLayout] = group_layouts(self)

    def _compiler(self) -> SegmentCompiler:
        return OffloadCompiler(self)

    def _compiled(self, compiler: SegmentCompiler) -> None:
        self.resident_after = tuple(compiler.resident_after)

    def streams_for(self, device: torch.device) -> CopyStreams:
        """The copy streams and host pool of `device` (made once, reused by every step)."""
        key = str(device)
        if key not in self._streams:
            self._streams[key] = self.streams_class(device)
        return self._streams[key]


class _OffloadEmitter(_Emitter):
    """The remat emitter, with the rule for dropping tuple elements adapted to host copies."""

    def __init__(self, program: Any, available: set[str]) -> None:
        super().__init__(program, available)
        self.plan: list[Action] = [*program.forward.actions, *program.backward.actions]
        # node -> ascending indices of the actions on it / of its computes
        self.on: dict[int, list[int]] = {}
        self.recomputes: dict[int, list[int]] = {}
        for i, a in enumerate(self.plan):
            self.on.setdefault(a.node, []).append(i)
            if a.op is ActionOp.compute:
                self.recomputes.setdefault(a.node, []).append(i)

    def _taken_later(self, element_group: int, group: int, index: int) -> bool:
        """An element stays unless its node is next computed after the op is computed again
        (or never): one taken after the tuple's round trip through the host travels in it
        (`OffloadCompiler._copy_also`), where the remat rule would drop it too early."""
        return _next(self.recomputes.get(element_group, []), index) <= \
            _next(self.recomputes.get(group, []), index)

    def _drop_allowed(self, tup: str, group: int, index: int) -> bool:
        """Whether an element of `tup` can leave the held tuple when `group` (its getitem's
        node) is freed: unless the plan computes `group` again before the tuple's node is
        computed again. With host copies the tuple lives on through offload, free and
        prefetch of its node: only its recomputation makes a new one."""
        owner = self.program.group_of.get(tup)
        if tup not in self.available or owner is None or owner == group:
            return False
        again = _next(self.recomputes.get(group, []), index)
        return again == math.inf or again > _next(self.recomputes.get(owner, []), index)


def _next(indices: list[int], index: int) -> float:
    """The first of the ascending `indices` after `index`, or infinity."""
    k = bisect.bisect_right(indices, index)
    return indices[k] if k < len(indices) else math.inf


class OffloadCompiler(SegmentCompiler):
    """SegmentCompiler with `O`, `P`, `D` statements and the waits before prefetched inputs."""

    emitter: _OffloadEmitter

    def __init__(self, program: OffloadProgram) -> None:
        super().__init__(program)
        self.emitter = _OffloadEmitter(program, set(program.primals))
        self.program = program
        self.offloaded_names: dict[int, frozenset[str]] = {}  # node -> fx values at its offload
        self.unwaited: set[int] = set()  # prefetched nodes no compute has waited for yet

    def compile(self, segment: Any, extra_inputs: Iterable[str] = ()) -> CompiledSegment:
        em = self.emitter
        em.available.update(extra_inputs)
        em.lines = []
        computations = 0
        preds = self.program.graph.index.predecessors
        for offset, action in enumerate(segment.actions):
            index = segment.start + offset
            v, op = action.node, action.op
            if op is ActionOp.compute:
                for u in preds[v]:
                    if u in self.unwaited:
                        em.lines.append(f"X.ready({u})")
                        self.unwaited.discard(u)
                em.compute(v, index)
                computations += 1
            elif op is ActionOp.free:
                if v in self.offloaded_names:  # copies may still use its storages: wait, then
                    em.lines.append(f"X.release({v})")  # release here, at the plan's point
                self.unwaited.discard(v)
                em.free(v, index)
            elif op is ActionOp.offload:
                names = frozenset(m for m in self.program.members[v] if m in em.available)
                self.offloaded_names[v] = names
                also, left = self._element_routes(v, index)
                em.lines.append(f"X.offload({v}, V, {em.const(also)}, {em.const(left)})"
                                if also or left else f"X.offload({v}, V)")
            elif op is ActionOp.prefetch:
                held = self.offloaded_names.get(v)
                if held is None:  # the simulator refuses this first
                    raise PlanExecutionError(f"action {index} ({action}): nothing offloaded")
                em.lines.append(f"X.prefetch({v}, V)")
                em.available.update(held)
                em.resident.add(v)
                self.unwaited.add(v)
            else:  # drop
                em.lines.append(f"X.drop({v})")
            self.resident_after.append(frozenset(em.resident))
        body = "\n".join(f"    {line}" for line in em.lines) or "    pass"
        source = f"def segment(V, K, R, L, X):\n{body}\n"
        namespace: dict[str, Any] = {"C": list(em.constants)}
        exec(compile(source, "<offload plan segment>", "exec"), namespace)  # noqa: S102
        return CompiledSegment(namespace["segment"], computations, source)

    def _element_routes(self, v: int, index: int) -> tuple[frozenset[str], frozenset[str]]:
        """For the elements of v's tuples that other nodes own, at v's offload (action `index`):
        those to copy although their own node holds them now (the plan frees that node, then
        computes it again from the reloaded tuple before computing v again), and those no node
        reads from a reloaded tuple (not copied: `offload_pack.pack`'s `left`)."""
        em = self.emitter
        kinds = {k for m in self.program.layouts[v].members for k in m.elements or ()
                 if isinstance(k, str)}
        also: set[str] = set()
        left: set[str] = set()
        for name in kinds:
            g = self.program.group_of.get(name)
            if g is None:
                continue
            held = name in em.available
            reread = self._read_after_reload(v, g, index, held)
            if held and reread:
                also.add(name)
            elif not held and not reread:
                left.add(name)
        return frozenset(also), frozenset(left)

    def _read_after_reload(self, v: int, g: int, index: int, held: bool) -> bool:
        """Whether node g is computed from v's tuple as a prefetch rebuilt it, after `index`
        and before v is computed again; `held`: g holds its element now (then only a compute
        of g after g was freed before the prefetch reads the reloaded tuple)."""
        em = self.emitter
        resident, reloaded = held, False
        for i in sorted(j for j in {*em.on.get(v, []), *em.on.get(g, [])} if j > index):
            a = em.plan[i]
            if a.node == v and a.op is ActionOp.compute:
                return False
            if a.node == v and a.op is ActionOp.prefetch:
                reloaded = reloaded or not resident
            if a.node == g and a.op is ActionOp.free:
                resident = False
            elif a.node == g and a.op is ActionOp.compute:
                if reloaded:
                    return True
                resident = True
        return False


class OffloadRun(PlanRun):
    """One step of an offload plan: PlanRun plus the step's copies."""

    program: OffloadProgram

    def __init__(self, program: OffloadProgram, primals: Sequence[torch.Tensor]) -> None:
        super().__init__(program, primals)
        device = next(
            (p.device for p in primals if isinstance(p, torch.Tensor)), torch.device("cpu")
        )
        self.copies = StepCopies(program.streams_for(device), program.layouts)
        self.transfer_stats: TransferStats | None = None

    def _run(self, code: CompiledSegment) -> None:
        code.function(  # type: ignore[call-arg]
            self.values, self.kept_outputs, self.rng.run, self._in_parameter_layout, self.copies
        )
        self.computations += code.computations

    def run_forward(self) -> torch.Tensor:
        try:
            return super().run_forward()
        except BaseException:
            self.copies.finish()  # the step is abandoned: its host buffers go back to the pool
            raise

    def run_backward(self, tangents: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            return super().run_backward(tangents)
        finally:
            self.transfer_stats = self.copies.finish()
