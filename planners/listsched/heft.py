"""HEFT-style list scheduling of a training step's forwards (Topcuoglu et al., 2002).

Tasks leave a ready queue in decreasing priority; each forward goes to the
allowed device giving its earliest finish time (insertion into idle gaps),
with per-device memory respected and every colocation group kept on the
device its first op went to. With ``upward_ranks`` as the priority this is
HEFT; with ``upward + downward`` ranks and the critical path pinned
(``cpop_pins``) it is CPOP. Backwards then run as ``backward_pass`` says.

Complexity: O((U + E) x D x L) for U units, E unit edges, D devices and L
links per route, plus the gap search of insertion (bounded by
``MAX_GAP_SCAN`` intervals per query).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from .backward import backward_pass
from .resources import EPS_MS, Links, MemoryLedger, Timeline
from .schedule import OpSchedule, new_schedule
from .stepgraph import StepGraph


def list_schedule(sg: StepGraph, priority: Sequence[float], *, allowed: Sequence[int],
                  capacity_bytes: Sequence[float], pins: Mapping[int, int] | None = None,
                  insertion: bool = True, lookahead: bool = False,
                  algorithm: str = "heft", buckets: Sequence[Sequence[int]] = ()) -> OpSchedule:
    """Place and order forwards by decreasing ``priority`` from a ready queue; then backwards.

    A forward goes to the allowed device (or its pinned one, or its colocation
    group's) with the earliest finish time that still has memory for it;
    ``lookahead`` adds the op's backward time on the device to that score (it
    runs there too). With ``insertion`` a forward may fill an idle gap of its
    device (HEFT's insertion policy). Backwards then run as ``backward_pass``
    says (with ``buckets``).

    Raises ``MemoryShortfall`` when a forward fits on no device it may use.
    Complexity: O((U + E) x D) plus the bounded gap search.
    """
    U = sg.U
    pins = dict(pins or {})
    allowed = list(allowed)
    sched = new_schedule(sg, algorithm)
    device, start, finish = sched.device, sched.start, sched.finish
    lines = [Timeline() for _ in range(sg.D)]
    memory = MemoryLedger(sg, capacity_bytes)
    links = Links(sg.n_links)
    fwd, bwd = sg.fwd, sg.bwd
    indegree = [len(sg.pred[u]) for u in range(U)]
    heap = [(-priority[u], u) for u in range(U) if indegree[u] == 0]
    heapq.heapify(heap)
    while heap:
        _, u = heapq.heappop(heap)
        best = None
        for d in _candidates(sg, u, memory, device, pins, allowed):
            ready = links.arrival(sg, u, d, finish, device)
            cost = fwd[u][d]
            s = lines[d].slot(ready, cost, insertion)
            score = s + cost + (bwd[u][d] if lookahead else 0.0)
            if best is None or score < best[0] - EPS_MS:
                best = (score, d)
        d = best[1]
        ready = links.arrival(sg, u, d, finish, device, commit=True)
        s = lines[d].slot(ready, fwd[u][d], insertion)
        memory.place(u, d, device)
        device[u] = d
        start[u], finish[u] = s, s + fwd[u][d]
        lines[d].add(s, finish[u])
        for v, _ in sg.succ[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(heap, (-priority[v], v))
    backward_pass(sched, links, buckets)
    return sched


def _candidates(sg: StepGraph, u: int, memory: MemoryLedger, device: list[int],
                pins: Mapping[int, int], allowed: Sequence[int]) -> list[int]:
    """The devices the forward of ``u`` may go to: its own (a replica of a split op), its
    colocation group's, its pin when that has room, else every allowed device with room.
    Raises ``MemoryShortfall`` when that leaves none."""
    fixed = sg.pin[u] if sg.pin[u] >= 0 else memory.home(u)
    if fixed is not None:  # a replica of a split op, or a later op of a placed group
        if not memory.fits(u, fixed, device):
            raise memory.shortfall(u, [fixed], device)
        return [fixed]
    if u in pins and memory.fits(u, pins[u], device):
        return [pins[u]]
    candidates = [d for d in allowed if memory.fits(u, d, device)]
    if not candidates:
        raise memory.shortfall(u, allowed, device)
    return candidates
