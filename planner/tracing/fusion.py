"""Grouping of op records into graph nodes: trivial nodes fused into their neighbours.

A trivial record (view, getitem, in-place op, metadata op) joins the group of the record whose
storage it shares, so its consumers read that group instead: same memory, fewer nodes.
A trivial record of a primal or tangent (e.g. `t(weight)`) has no producing group; it joins its
first consumer, and later consumers get no edge for it (it is free to redo and holds no memory).
A multi-output op (no bytes of its own) joins its first `getitem`; the other elements stay
nodes of their own so that each is freed after its own last use.
Without fusion every record is its own group and views keep `alias_of`.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.tracing.records import OpRecord


@dataclass(frozen=True)
class Group:
    """One graph node: its primary record and every fx node fused into it, in fx order."""

    primary: str
    members: tuple[str, ...]
    inputs: tuple[str, ...]  # primary names of the groups it reads
    alias_of: str | None  # primary of the group whose storage it shares (unfused views only)


def group_records(records: list[OpRecord], fuse: bool = True) -> list[Group]:
    by_name = {r.name: r for r in records}
    if not fuse:
        return [
            Group(r.name, (r.name,), tuple(dict.fromkeys(r.inputs)), r.alias_of) for r in records
        ]
    parent: dict[str, str] = {r.name: r.name for r in records}
    floating: dict[str, list[str]] = {}  # root -> members: trivial records of primals only
    from_primal: set[str] = set()  # trivial records that only read primals/tangents
    detached: set[str] = set()  # records absorbed from a floating root: no edges for them

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for r in records:
        if r.trivial:
            base = r.alias_of or next(iter(r.inputs), None)
            if base is not None and base not in from_primal:
                parent[r.name] = find(base)
                continue
            # A view of a primal (or of such a view) stays apart: joining the group that
            # absorbed its base would tie its consumers to that group's output.
            from_primal.add(r.name)
            floating[r.name] = [r.name]
            continue
        for u in r.inputs:
            root = find(u)
            if root in floating:
                detached.update(floating.pop(root))
                parent[root] = r.name
        if r.op == "getitem" and r.inputs:
            op = by_name[r.inputs[0]]
            if op.extra.get("multi") and find(op.name) == op.name:
                parent[op.name] = r.name  # a multi-output op runs with its first element
    members: dict[str, list[str]] = {}
    for r in records:
        members.setdefault(find(r.name), []).append(r.name)
    groups: list[Group] = []
    for root, names in members.items():
        inputs: dict[str, None] = {}
        for m in names:
            for u in by_name[m].inputs:
                if u in detached:  # a view of a primal: free to redo, holds no memory
                    continue
                g = find(u)
                if g != root:
                    inputs[g] = None
        groups.append(Group(root, tuple(names), tuple(inputs), None))
    return groups

