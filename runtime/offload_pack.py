"""What an offload of one graph node copies, and how its values are rebuilt after a prefetch.

A graph node is a group of fx values (`JointProgram.members`): the op's output, views of it,
the tuple of a multi-output op, and views of parameters (`t(weight)`). Offloading the node
copies each *storage the node owns* once, as raw bytes (views of one storage share one copy),
and a prefetch rebuilds every value as the same view (`Tensor.set_(storage, offset, size,
stride)`) of the reloaded bytes, so aliasing inside the node survives the round trip.

Which storages a node owns is decided from the fx graph, before any step runs (`group_layouts`):
a value's storage is followed through view ops to the op that allocated it; it is the node's
own when that op (or the getitem taking that element of a multi-output op) belongs to the node.
Views of parameters or of another node's output are kept by reference (they cost this node no
device memory). An element of a tuple whose own getitem belongs to another node (a dropout mask
with `dropout_masks="graph"`) is copied with the tuple when that node does not hold it at the
offload (not computed yet, or freed), or when the plan frees that node before the prefetch and
computes it again from the reloaded tuple (`copy_also`, decided by the offload compiler); else it
is read back from that node at the prefetch. An element no node reads from the reloaded tuple
(`left`, also the compiler's) is not copied at all: the copy would keep its device storage alive
until the tuple's node is freed, past the free of its own node where the simulator releases it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from planner.runtime.op_executor import _is_view

# Static kinds of a member value: a tensor (own storage or kept by reference), or a sequence
# whose elements are own (True) or another node's element read back by its getitem's fx name.
ElementKind = bool | str


@dataclass(frozen=True)
class MemberLayout:
    name: str  # fx name
    own: bool  # tensor members: its storage belongs to the node
    elements: tuple[ElementKind, ...] | None = None  # sequence members (tuple/list outputs)


@dataclass(frozen=True)
class GroupLayout:
    group: int
    members: tuple[MemberLayout, ...]


def group_layouts(program: Any) -> dict[int, GroupLayout]:
    """Per graph node, how each of its fx values is offloaded (see the module docstring)."""
    nodes: dict[str, fx.Node] = program.fx_nodes
    group_of: dict[str, int] = program.group_of
    getitem_of: dict[tuple[str, int], str] = {}
    for n in nodes.values():
        if n.op == "call_function" and n.target is operator.getitem:
            base, k = n.args[0], n.args[1]
            if isinstance(base, fx.Node) and isinstance(k, int):
                getitem_of.setdefault((base.name, k), n.name)

    def root(name: str) -> tuple[str, int | None]:
        """(allocating fx node, element index of a multi-output op or None)."""
        seen = 0
        while seen < 10_000:
            seen += 1
            n = nodes[name]
            if n.op != "call_function":
                return name, None
            if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
                base = n.args[0]
                if _is_view(base) and base.all_input_nodes:  # split/unbind: views of the input
                    name = base.all_input_nodes[0].name
                    continue
                k = n.args[1]
                return base.name, k if isinstance(k, int) else None
            if _is_view(n) and n.all_input_nodes:
                name = n.all_input_nodes[0].name
                continue
            return name, None
        return name, None

    def owner(r: tuple[str, int | None]) -> int | None:
        name, k = r
        if k is not None and (name, k) in getitem_of:
            return group_of.get(getitem_of[(name, k)])
        return group_of.get(name)

    out: dict[int, GroupLayout] = {}
    for g, names in program.members.items():
        layouts = []
        for m in names:
            n = nodes[m]
            elements: tuple[ElementKind, ...] | None = None
            if _is_sequence_node(n):
                count = _sequence_length(n)
                kinds: list[ElementKind] = []
                for k in range(count):
                    r = root(n.all_input_nodes[0].name) if _is_view(n) else (m, k)
                    if owner(r) == g:
                        kinds.append(True)
                    else:
                        kinds.append(getitem_of.get((m, k), False) or False)
                elements = tuple(kinds)
            layouts.append(MemberLayout(m, owner(root(m)) == g, elements))
        out[g] = GroupLayout(g, tuple(layouts))
    return out


def _is_sequence_node(n: fx.Node) -> bool:
    val = n.meta.get("val")
    return isinstance(val, (tuple, list))


def _sequence_length(n: fx.Node) -> int:
    val = n.meta.get("val")
    return len(val) if isinstance(val, (tuple, list)) else 0


# -- runtime packing --------------------------------------------------------------------------
@dataclass(frozen=True)
class _View:
    """A tensor as a view of copied storage `slot`."""

    slot: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class Packed:
    """One offload of one node: the storages to copy (byte views on the device) and, per fx
    value, how to rebuild it."""

    group: int
    storages: list[torch.Tensor] = field(default_factory=list)  # uint8 views, device side
    recipes: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(int(s.numel()) for s in self.storages)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of `t` as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def pack(
    layout: GroupLayout, values: Mapping[str, Any], copy_also: frozenset[str] = frozenset(),
    left: frozenset[str] = frozenset(),
) -> Packed:
    """What to copy for this node's values now held in `values` (an fx name -> value dict);
    `copy_also`: tuple elements to copy although their own node holds them now (the plan frees
    that node before the prefetch and computes it again from the reloaded tuple); `left`: tuple
    elements no node reads from the reloaded tuple (not copied, None after the prefetch)."""
    out = Packed(layout.group)
    slots: dict[int, int] = {}  # storage data pointer -> slot

    def tensor(t: torch.Tensor, own: bool) -> Any:
        storage = t.untyped_storage()
        if not own or storage.nbytes() == 0:
            return ("ref", t)
        key = storage.data_ptr()
        if key not in slots:
            slots[key] = len(out.storages)
            out.storages.append(byte_view(t))
        return _View(slots[key], t.dtype, tuple(t.size()), tuple(t.stride()),
                     int(t.storage_offset()))

    for m in layout.members:
        if m.name not in values:
            continue
        value = values[m.name]
        if m.elements is not None and isinstance(value, (tuple, list)):
            items: list[Any] = []
            for v, kind in zip(value, m.elements, strict=False):
                if isinstance(v, torch.Tensor) and kind is True:
                    items.append(tensor(v, True))
                elif isinstance(v, torch.Tensor) and kind in left:
                    items.append(("val", None))
                elif isinstance(v, torch.Tensor) and isinstance(kind, str):
                    # held by its own node now: read back from it; else (not computed yet, or
                    # freed) the tuple is what holds it: copied with the tuple
                    held = kind in values and kind not in copy_also
                    items.append(("lookup", kind) if held else tensor(v, True))
                else:
                    items.append(("val", v))
            out.recipes[m.name] = ("seq", type(value), items)
        elif isinstance(value, torch.Tensor):
            out.recipes[m.name] = tensor(value, m.own)
        else:
            out.recipes[m.name] = ("val", value)
    return out


def unpack(packed: Packed, buffers: list[torch.Tensor], values: dict[str, Any]) -> None:
    """Write the node's values, rebuilt on `buffers` (the reloaded storages), into `values`."""

    def build(recipe: Any) -> Any:
        if isinstance(recipe, _View):
            buf = buffers[recipe.slot]
            return torch.empty(0, dtype=recipe.dtype, device=buf.device).set_(
                buf.untyped_storage(), recipe.offset, recipe.size, recipe.stride
            )
        kind = recipe[0]
        if kind == "lookup":
            return values.get(recipe[1])
        return recipe[1]  # "ref" / "val"

    for name, recipe in packed.recipes.items():
        if isinstance(recipe, tuple) and recipe[0] == "seq":
            _, seq_type, items = recipe
            values[name] = seq_type(build(r) for r in items)
        else:
            values[name] = build(recipe)
