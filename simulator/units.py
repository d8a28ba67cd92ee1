"""The training runtime's units of an op placement, for the runtime and the simulator.

The runtime runs a plan as units, and every forward or backward of a unit on a
microbatch is an *action* with CPU of its own beyond the ops: a pipeline runs one unit
per stage group, one group (data parallelism, a parameter server, one device) the whole
model, and an op placement (several groups, no pipeline) one unit per run of ops that
follow each other in the order of every device they run on, with the same devices and
shares, that exchanges data with other devices only at its ends: its first op may
receive, its last op may send (``placement_units``); a single op where neighbours differ.

``runtime/executor.py`` builds an op placement's units with ``placement_units``, and the
simulator charges one action per such unit, replica and direction (``lower.py``,
``placement_units_of``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dl_nfv.artifacts import OpGraph, OpKind, Plan


def placement_units_of(plan: Plan, graph: OpGraph) -> dict[str, str]:
    """``placement_units`` of an op-placement ``plan``: every op of its groups but the
    graph's inputs (which the runtime runs in no unit)."""
    inputs = {op.id for op in graph.ops if op.kind is OpKind.INPUT}
    return placement_units(plan, graph, {op: g for g in plan.groups for op in g.ops
                                         if op not in inputs})


def placement_units(plan: Plan, graph: OpGraph, group_of_op: dict[str, Any]) -> dict[str, str]:
    """Op -> unit id of an op-placement plan: runs of ops merged into one unit.

    Op ``b`` joins the unit of ``a`` when both have the same devices and shares,
    ``b`` comes right after ``a`` in the order of every one of those devices
    (``plan.order``, else topological, restricted to the ops that run there),
    ``a`` sends nothing to ops of other devices or shares and ``b`` receives nothing
    from them (a unit receives all its inputs before it starts and sends its outputs
    when it ends, so a send or receive inside a unit would hold up the other device),
    and no op outside the unit lies on a path from the unit to ``b``. If the
    units still depend on each other in a cycle, every op is its own unit. A
    unit is named by its first op. O(ops^2 / 64) (descendant sets as bit masks).
    """
    topo = [op for op in graph.topological_ids() if op in group_of_op]
    index = {op: i for i, op in enumerate(topo)}
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for e in graph.edges:
        if e.src in index and e.dst in index:
            preds[e.dst].append(e.src)
            succs[e.src].append(e.dst)
    below: dict[str, int] = {}  # op -> bit mask of the op and its descendants
    for op in reversed(topo):
        mask = 1 << index[op]
        for nxt in succs[op]:
            mask |= below[nxt]
        below[op] = mask
    following: dict[str, set] = defaultdict(set)  # op -> the op after it on each of its devices
    for device in plan.devices:
        order = plan.order.get(device) or topo
        ops = [op for op in order if op in index and device in group_of_op[op].devices]
        for a, b in zip(ops, [*ops[1:], None]):
            following[a].add(b)

    def same(a: str, b: str) -> bool:
        ga, gb = group_of_op[a], group_of_op[b]
        return (ga.devices, ga.shares) == (gb.devices, gb.shares)

    # an op whose output goes to other devices ends its unit (the unit sends when it ends),
    # and one that receives from other devices starts one (the unit receives when it starts)
    sends = {a for a in topo if any(not same(a, b) for b in succs[a])}
    receives = {b for b in topo if any(not same(a, b) for a in preds[b])}
    link = {a: b for a, f in following.items()
            if len(f) == 1 and None not in f and same(a, b := next(iter(f)))
            and a not in sends and b not in receives}
    linked = set(link.values())
    unit_of: dict[str, str] = {}
    for head in topo:
        if head in linked:
            continue
        op, uid, members, reach = head, head, 0, 0
        while op is not None:
            if members and not all(members >> index[p] & 1 or not reach >> index[p] & 1
                                   for p in preds[op]):
                uid, members, reach = op, 0, 0  # a path leaves the unit and comes back: cut
            unit_of[op] = uid
            members |= 1 << index[op]
            reach |= below[op]
            op = link.get(op)
    for op in topo:  # ops on a cycle of links (an inconsistent order) stay alone
        unit_of.setdefault(op, op)
    if graph.blocked_units(unit_of):
        return {op: op for op in topo}
    return unit_of
