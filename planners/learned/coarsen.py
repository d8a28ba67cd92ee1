"""Coarsening an op graph into op groups: the units a learned planner decides for.

Method: a topological order of the ops is cut into contiguous ranges of about
equal work. A cut is only made
where ``colocation.allowed_cuts`` allows one, so no colocation group is ever split.
Work is an op's forward plus backward (where its backward runs, ``needs_grad``)
time on its fastest device type, from the cost model.

Greedy rule: walking the order, close the current group at the first allowed cut where
it holds at least an even share of the work left (the work not yet grouped over the
groups still to make); ops with no work, as inputs and shape ops, ride with their
neighbours. So the result has at most ``target`` groups,
fewer where colocation or a few heavy ops leave fewer allowed cuts, and every group is
contiguous in the topological order (edges between groups point forward).

Limits: contiguity in one topological order is a restriction (two independent
branches of equal depth are never grouped apart from what lies between them in the
order), and a colocation group whose ops are far apart in the order makes one large
group. Complexity: O(ops + edges).

Example
-------
A chain of 8 ops of 1 ms each coarsened to ``target=4`` gives 4 groups of 2 ops.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import BadInput
from dl_nfv.planners.colocation import allowed_cuts
from dl_nfv.simulator.costs import CostModel

DEFAULT_TARGET = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class Coarsening:
    """Op groups of one graph: ``groups[g]`` lists its op ids in topological order.

    ``edges`` maps ``(source group, destination group)`` to the bytes the graph's
    edges carry between them (source < destination: groups follow the order).
    """

    groups: tuple[tuple[str, ...], ...]
    edges: dict[tuple[int, int], float]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for g, ops in enumerate(self.groups):
            if not ops:
                raise ValueError(f"op group {g} is empty")
            for op in ops:
                if op in seen:
                    raise ValueError(f"op {op!r} is in two op groups")
                seen.add(op)

    @property
    def group_of(self) -> dict[str, int]:
        """Op id -> index of its group."""
        return {op: g for g, ops in enumerate(self.groups) for op in ops}


def coarsen(cm: CostModel, target: int = DEFAULT_TARGET) -> Coarsening:
    """Cut the cost model's graph into at most ``target`` contiguous op groups of about
    equal work, never splitting a colocation group.

    Parameters
    ----------
    cm : CostModel
        The graph and cluster (work is per-op time on the fastest device type).
    target : int
        The most groups wanted (>= 1).

    Returns
    -------
    Coarsening

    Raises
    ------
    BadInput
        ``target`` below 1.
    """
    if target < 1:
        raise BadInput(f"coarsening needs a target of at least 1 group, got {target}")
    order = cm.topological_ids
    work = _op_work_ms(cm)
    weights = np.array([work[cm.op_index[o]] for o in order])
    ok = allowed_cuts(cm.graph, order)
    total = float(weights.sum())
    bounds = [0]
    done = last = 0.0  # work before position b; work before the last cut
    for b in range(1, len(order)):
        done += weights[b - 1]
        if len(bounds) >= target:
            break
        # the rest of the work shared evenly by the groups still to make
        share = (total - last) / (target - len(bounds) + 1)
        if ok[b] and done - last >= share * (1 - 1e-9) and (total == 0 or done < total):
            bounds.append(b)
            last = done
    bounds.append(len(order))
    groups = tuple(tuple(order[a:b]) for a, b in zip(bounds, bounds[1:]))
    group_of = {op: g for g, ops in enumerate(groups) for op in ops}
    edges: dict[tuple[int, int], float] = defaultdict(float)
    for e in cm.graph.edges:
        src, dst = group_of[e.src], group_of[e.dst]
        if src != dst:
            edges[(src, dst)] += float(e.bytes)
    return Coarsening(groups=groups, edges=dict(sorted(edges.items())))


def _op_work_ms(cm: CostModel) -> np.ndarray:
    """Per op (graph order): forward plus backward (where it runs) on its fastest type."""
    total = cm.fwd_ms_by_type + cm.bwd_ms_by_type * cm.bwd_runs[:, None]
    return total.min(axis=1)
