"""Operation sequences on a chain and their exact memory/compute accounting.

Operations (stage i is 1-based; text form in brackets):

- F_all i [`Fall3`]: run stage i's forward from a^{i-1}, keep everything its backward needs
  (x̄_i bytes, a^i included). Peak while it runs: resident + max(x_i + forward_tmp_i,
  x̄_i + forward_all_tmp_i).
- F_ck i [`Fck3`]: run stage i's forward, keep a^i only (x_i), a^{i-1} stays.
  Peak: resident + x_i + forward_tmp_i.
- F_∅ i [`Fn3`]: as F_ck, then free a^{i-1}.
- B i [`B3`]: stage i's backward; reads ā^i, a^{i-1} and δ^i; writes δ^{i-1}, then frees ā^i
  and δ^i. Peak: resident + δ_{i-1} + backward_tmp_i. a^{i-1} stays resident.
- D i [`D3`]: discard the checkpoint a^i (not part of a kept ā^i).

`ChainLiveBytes` holds these memory rules for the chain model (its own arithmetic, not
planner.sim.ledger's: the same rules, as the graph mapping in `planner.solvers.chain.layout`
gives them to the simulator; tests/sim/test_memory_model_props.py checks the two agree).
`run_sequence` replays a sequence with them, rejecting an invalid operation with its index, and
returns the exact peak (fixed memory included) and compute cost; POFO's replay adds its host
copies to them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from planner.solvers.chain.model import Chain


class OpKind(StrEnum):
    f_all = "Fall"
    f_ck = "Fck"
    f_none = "Fn"
    backward = "B"
    discard = "D"


FORWARD_KINDS = (OpKind.f_all, OpKind.f_ck, OpKind.f_none)


@dataclass(frozen=True)
class Op:
    kind: OpKind
    stage: int  # 1-based stage (for D: the index i of the discarded a^i)

    def __str__(self) -> str:
        return f"{self.kind.value}{self.stage}"


def ops_text(ops: Iterable[Op]) -> str:
    return " ".join(str(o) for o in ops)


def ops_from_text(text: str) -> list[Op]:
    out: list[Op] = []
    for token in text.split():
        for kind in (OpKind.f_all, OpKind.f_ck, OpKind.f_none, OpKind.backward, OpKind.discard):
            if token.startswith(kind.value) and token[len(kind.value) :].isdigit():
                out.append(Op(kind, int(token[len(kind.value) :])))
                break
        else:
            raise ValueError(f"cannot parse operation {token!r} (expected e.g. Fall3, Fck3, B3)")
    return out


class SequenceError(ValueError):
    """An operation that cannot run in the current state; names its index."""


@dataclass(frozen=True)
class SequenceResult:
    peak_bytes: int  # fixed memory included
    cost: float  # total compute
    forward_count: int  # forward operations run (L of them are the first runs)
    complete: bool  # every backward ran and δ^0 is resident

    def recomputations(self, length: int) -> int:
        return self.forward_count - length


class ChainLiveBytes:
    """Live bytes of a sequence on a chain, operation by operation (unchecked: the caller keeps
    the sequence valid). Peaks are taken while an operation runs, before its result settles."""

    __slots__ = ("chain", "live_bytes", "peak_bytes")

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.live_bytes = chain.input_bytes  # a^0 resident; fixed memory excluded
        self.peak_bytes = self.live_bytes

    def forward(self, kind: OpKind, i: int) -> None:
        """F_all / F_ck / F_∅ of stage i: its transient, then what it keeps (F_∅ frees its
        input)."""
        st = self.chain.stage(i)
        if kind is OpKind.f_all:
            during, kept = st.all_forward_peak_bytes, st.saved_bytes
        else:
            during, kept = st.output_bytes + st.forward_tmp_bytes, st.output_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + during)
        self.live_bytes += kept
        if kind is OpKind.f_none:
            self.live_bytes -= self.chain.x(i - 1)

    def backward(self, i: int) -> None:
        """B i: δ^{i-1} and the transient while it runs, then ā^i and δ^i are freed."""
        st = self.chain.stage(i)
        self.peak_bytes = max(self.peak_bytes,
                              self.live_bytes + st.grad_input_bytes + st.backward_tmp_bytes)
        self.live_bytes += st.grad_input_bytes - st.saved_bytes - self.chain.delta(i)

    def discard(self, i: int) -> None:
        self.live_bytes -= self.chain.x(i)

    def add(self, nbytes: int) -> None:
        """Bytes that become resident outside an operation (a copy back from the host)."""
        self.live_bytes += nbytes

    def release(self, nbytes: int) -> None:
        """Bytes freed outside an operation (a device copy whose host copy is done)."""
        self.live_bytes -= nbytes

    @property
    def step_peak_bytes(self) -> int:
        """The peak so far with the chain's fixed memory."""
        return self.peak_bytes + self.chain.fixed_bytes


def run_sequence(chain: Chain, ops: Sequence[Op]) -> SequenceResult:
    length = chain.length
    acts: set[int] = {0}  # i: a^i resident
    saved: set[int] = set()  # i: ā^i resident (its a^i is in `acts` too)
    grads: set[int] = set()  # i: δ^i resident
    done: set[int] = set()
    live = ChainLiveBytes(chain)
    costs: list[float] = []
    forwards = 0
    for k, op in enumerate(ops):
        i = op.stage
        if not 1 <= i <= length and not (op.kind is OpKind.discard and 0 <= i <= length):
            raise SequenceError(f"op {k} ({op}): stage {i} is not in 1..{length}")
        if op.kind in FORWARD_KINDS:
            st = chain.stage(i)
            if i - 1 not in acts:
                raise SequenceError(f"op {k} ({op}): input a^{i - 1} is not resident")
            if i in acts:
                raise SequenceError(f"op {k} ({op}): a^{i} is already resident")
            if op.kind is OpKind.f_none and i - 1 in saved:
                raise SequenceError(f"op {k} ({op}): a^{i - 1} is part of ā^{i - 1}, kept")
            live.forward(op.kind, i)
            acts.add(i)
            if op.kind is OpKind.f_all:
                saved.add(i)
            if op.kind is OpKind.f_none:
                acts.discard(i - 1)
            costs.append(st.forward_ms)
            forwards += 1
        elif op.kind is OpKind.backward:
            st = chain.stage(i)
            if i not in saved:
                raise SequenceError(f"op {k} ({op}): ā^{i} is not resident (run Fall{i} first)")
            if i - 1 not in acts:
                raise SequenceError(f"op {k} ({op}): a^{i - 1} is not resident")
            if i < length and i not in grads:
                raise SequenceError(f"op {k} ({op}): δ^{i} is not resident")
            if i in done:
                raise SequenceError(f"op {k} ({op}): stage {i}'s backward already ran")
            live.backward(i)
            saved.discard(i)
            acts.discard(i)
            grads.discard(i)
            grads.add(i - 1)
            done.add(i)
            costs.append(st.backward_ms)
        else:  # discard
            if i not in acts or i in saved:
                raise SequenceError(f"op {k} ({op}): a^{i} is not a resident checkpoint")
            acts.discard(i)
            live.discard(i)
    return SequenceResult(
        peak_bytes=live.step_peak_bytes,
        cost=math.fsum(costs),
        forward_count=forwards,
        complete=len(done) == length and 0 in grads,
    )


def store_all_ops(length: int) -> list[Op]:
    """F_all every stage, then every backward: no recomputation, the most memory."""
    return [Op(OpKind.f_all, i) for i in range(1, length + 1)] + [
        Op(OpKind.backward, i) for i in range(length, 0, -1)
    ]


def segments_ops(length: int, starts: Sequence[int]) -> list[Op]:
    """Chen-style segments: checkpoint a^{s-1} at each segment start s, recompute each segment
    once with F_all for its backward. `starts` are 1-based, ascending, starting with 1."""
    bounds = list(starts) + [length + 1]
    ops: list[Op] = []
    for j in range(len(bounds) - 2):  # run through every segment but the last, keeping its input
        s, e = bounds[j], bounds[j + 1] - 1
        ops.append(Op(OpKind.f_ck, s))
        ops.extend(Op(OpKind.f_none, k) for k in range(s + 1, e + 1))
    for j in range(len(bounds) - 2, -1, -1):
        s, e = bounds[j], bounds[j + 1] - 1
        if j < len(bounds) - 2:
            ops.append(Op(OpKind.discard, e))  # a^e was the next segment's checkpoint
        ops.extend(Op(OpKind.f_all, k) for k in range(s, e + 1))
        ops.extend(Op(OpKind.backward, k) for k in range(e, s - 1, -1))
    return ops


def chen_sqrt_ops(length: int) -> list[Op]:
    """Chen et al. 2016 on a chain: segments of about √L stages."""
    size = max(1, round(math.sqrt(length)))
    return segments_ops(length, list(range(1, length + 1, size)))
