"""Colocation: groups of ops that must share a placement, as every planner and validator reads them.

An op graph's ``colocation`` field lists groups of op ids (``OpGraph.colocation``);
the ops of one group must run on the same device set and, in a pipeline, in the
same stage. An op in no group is free. These functions answer the questions
planners ask of that field:

* ``group_of`` — which group an op belongs to (ops in no group are absent);
* ``units`` — the graph's placement units: each group as one unit, every other
  op alone, so that a planner placing units can never split a group;
* ``uncuttable`` / ``allowed_cuts`` — for a planner that cuts an op order into
  contiguous ranges (pipeline stages), where a cut would split a group;
* ``placement_violations`` — for a validator, every group a placement splits.

Positions are indices into an order of op ids (a topological order for the
pipeline planners): a *cut at b* separates positions ``< b`` from ``>= b``, so
the cuts of ``n`` positions are ``0..n`` and ``0`` and ``n`` never split anything.

Example
-------
A graph with ops ``a b c d`` in that order and ``colocation = (("b", "d"),)``:
``group_of`` is ``{"b": 0, "d": 0}``; ``uncuttable(graph, order)`` is
``[(1, 3)]``; ``allowed_cuts(graph, order)`` is
``[True, True, False, False, True]`` (cuts at 2 and 3 would put ``b`` and ``d``
in different ranges); ``placement_violations(graph, {"a": 0, "b": 0, "c": 1,
"d": 1})`` reports group 0 split between ``b`` (0) and ``d`` (1).

Complexity: every function is O(ops + order length).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from dl_nfv.artifacts import OpGraph


def group_of(graph: OpGraph) -> dict[str, int]:
    """Op id -> index of its group in ``graph.colocation``; an op in no group is absent."""
    return {op: i for i, group in enumerate(graph.colocation) for op in group}


def units(graph: OpGraph) -> list[tuple[str, ...]]:
    """The graph's placement units, in the graph's op order.

    Each colocation group is one unit (its ops in the graph's op order) placed
    where its first op appears; every op in no group is a unit of its own. The
    units partition the ops: every op is in exactly one unit.
    """
    owner = group_of(graph)
    members: dict[int, list[str]] = {}
    for op in graph.ops:
        if op.id in owner:
            members.setdefault(owner[op.id], []).append(op.id)
    out: list[tuple[str, ...]] = []
    emitted: set[int] = set()
    for op in graph.ops:
        g = owner.get(op.id)
        if g is None:
            out.append((op.id,))
        elif g not in emitted:
            emitted.add(g)
            out.append(tuple(members[g]))
    return out


def uncuttable(graph: OpGraph, order: Sequence[str]) -> list[tuple[int, int]]:
    """``(first, last)`` positions in ``order`` of each colocation group, in group order.

    A cut at ``b`` splits the group when ``first < b <= last``. Ops of a group
    that ``order`` does not list are ignored; a group with fewer than two ops
    in ``order`` is left out (nothing in ``order`` can split it).
    """
    position = {op: i for i, op in enumerate(order)}
    spans = []
    for group in graph.colocation:
        where = [position[op] for op in group if op in position]
        if len(where) >= 2:
            spans.append((min(where), max(where)))
    return spans


def allowed_cuts(graph: OpGraph, order: Sequence[str]) -> list[bool]:
    """``ok[b]`` for ``b`` in ``0..len(order)``: whether a cut at ``b`` keeps every group whole.

    ``ok[0]`` and ``ok[len(order)]`` are always true. Computed with a
    difference array over the spans of ``uncuttable``.
    """
    n = len(order)
    inside = [0] * (n + 2)
    for first, last in uncuttable(graph, order):
        inside[first + 1] += 1  # cuts first+1 .. last split the group
        inside[last + 1] -= 1
    ok, depth = [], 0
    for b in range(n + 1):
        depth += inside[b]
        ok.append(depth == 0)
    return ok


def cut_positions(graph: OpGraph, order: Sequence[str],
                  bounds: Sequence[int] | None = None) -> list[int]:
    """The positions ``0 = b0 < b1 < ... = len(order)`` where a cut keeps every group whole.

    With ``bounds`` (increasing op positions ``[0, ..., len(order)]`` that delimit
    coarser units, as a pipeline problem's unit boundaries), the indices ``k``
    into ``bounds`` where a cut at ``bounds[k]`` keeps every group whole.
    """
    ok = allowed_cuts(graph, order)
    if bounds is None:
        return [b for b, fine in enumerate(ok) if fine]
    return [k for k, b in enumerate(bounds) if ok[int(b)]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """A colocation group that a placement splits: two of its ops and their placements."""

    group: int
    op: str
    place: Hashable
    other_op: str
    other_place: Hashable

    def describe(self, what: str = "placement") -> str:
        """One sentence naming the group, the two ops and where each is."""
        return (f"colocation[{self.group}] is split: op {self.op!r} on {what} "
                f"{_show(self.place)}, op {self.other_op!r} on {what} {_show(self.other_place)}")


def placement_violations(graph: OpGraph, place_of: Mapping[str, Hashable]) -> list[Split]:
    """Every colocation group whose ops do not all have the same ``place_of`` value.

    ``place_of`` maps op id -> a hashable placement (a frozenset of devices, a
    stage index, a device name); ops it does not map are ignored. One ``Split``
    per split group, naming the group's first mapped op and the first op placed
    elsewhere.
    """
    out = []
    for i, group in enumerate(graph.colocation):
        placed = [op for op in group if op in place_of]
        if not placed:
            continue
        first = placed[0]
        for op in placed[1:]:
            if place_of[op] != place_of[first]:
                out.append(Split(group=i, op=first, place=place_of[first], other_op=op,
                                 other_place=place_of[op]))
                break
    return out


def _show(place: Hashable) -> str:
    if isinstance(place, (frozenset, set, tuple, list)):
        return "{" + ", ".join(sorted(map(str, place))) + "}"
    return str(place)
