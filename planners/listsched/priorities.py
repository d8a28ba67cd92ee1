"""Task priorities of the list schedulers: HEFT's upward rank, CPOP's downward rank and
critical path (Topcuoglu et al., 2002), on mean costs over the allowed devices.

Each is O(U + E) on a ``StepGraph`` of U units and E unit edges; ``cpop_pins``
adds O(|CP| x D) for the critical path CP.
"""

from __future__ import annotations

from collections.abc import Sequence

from .stepgraph import StepGraph


def upward_ranks(sg: StepGraph, allowed: Sequence[int]) -> list[float]:
    """HEFT's upward rank of every task on mean costs: the longest (mean) path to the end.

    O(U + E).
    """
    w, lat, pb = sg.mean_costs(allowed)
    U = sg.U
    rank = [0.0] * (2 * U)
    for u in range(U):  # backward tasks: their successors are the backwards of pred units
        best = 0.0
        for a, nbytes in sg.pred[u]:
            if not sg.rg[a]:
                continue
            c = (lat + nbytes * pb) if nbytes > 0 else 0.0
            best = max(best, c + rank[U + a])
        rank[U + u] = w[U + u] + best
    for u in range(U - 1, -1, -1):
        best = rank[U + u]
        for s, nbytes in sg.succ[u]:
            c = (lat + nbytes * pb) if nbytes > 0 else 0.0
            best = max(best, c + rank[s])
        rank[u] = w[u] + best
    return rank


def downward_ranks(sg: StepGraph, allowed: Sequence[int]) -> list[float]:
    """CPOP's downward rank of every task: the longest (mean) path from the start to it.

    O(U + E).
    """
    w, lat, pb = sg.mean_costs(allowed)
    U = sg.U
    rank = [0.0] * (2 * U)
    for u in range(U):
        best = 0.0
        for a, nbytes in sg.pred[u]:
            c = (lat + nbytes * pb) if nbytes > 0 else 0.0
            best = max(best, rank[a] + w[a] + c)
        rank[u] = best
    for u in range(U - 1, -1, -1):
        best = rank[u] + w[u]
        for s, nbytes in (sg.succ[u] if sg.rg[u] else ()):
            c = (lat + nbytes * pb) if nbytes > 0 else 0.0
            best = max(best, rank[U + s] + w[U + s] + c)
        rank[U + u] = best
    return rank


def cpop_pins(sg: StepGraph, allowed: Sequence[int], up: list[float],
              down: list[float]) -> tuple[dict[int, int], list[int]]:
    """CPOP's critical path and the single device minimising its summed cost.

    Returns (unit -> device for the free units whose forward or backward lies
    on the critical path, the critical tasks). O(U + E + |CP| x D).
    """
    prio = [a + b for a, b in zip(up, down)]
    cp_len = max(prio)
    tol = 1e-9 * max(1.0, cp_len)
    U = sg.U
    entries = [u for u in range(U) if not sg.pred[u]]
    t = max(entries, key=lambda u: (prio[u], -u))
    path = [t]
    while True:
        nxt = [s for s, _ in sg.task_succs(t) if abs(prio[s] - cp_len) <= tol]
        if not nxt:
            break
        t = min(nxt)
        path.append(t)
    units = sorted({t if t < U else t - U for t in path})
    free = [u for u in units if sg.pin[u] < 0]
    if not free:
        return {}, path
    totals = {d: sum(sg.fwd[u][d] + sg.bwd[u][d] for u in free) for d in allowed}
    best = min(allowed, key=lambda d: (totals[d], d))
    return {u: best for u in free}, path
