"""Earliest task first (Hwang et al., 1989), Baechi's m-ETF, and with favourite children
its m-SCT: among all ready forwards, start the (task, device) pair that can start earliest.

Devices run forwards back to back in start order (no insertion); a forward
only goes where its memory fits, and the forwards of a colocation group go
to the device its first one went to. Backwards then run as ``backward_pass``
says.

Complexity: O(U x R x D) for U units, the largest ready set R and D devices
(vectorised per step with numpy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .backward import backward_pass
from .priorities import upward_ranks
from .resources import EPS_MS, Links, MemoryLedger
from .schedule import OpSchedule, new_schedule
from .stepgraph import StepGraph


class ReadyForwards:
    """The ready forwards and, per ready forward and device, when its inputs are there
    (inf where it may not go), packed in ``rows[:len(ids)]``."""

    def __init__(self, sg: StepGraph, sched: OpSchedule, allowed: Sequence[int],
                 memory: MemoryLedger, links: Links, favourite: Mapping[int, int]):
        self.sg, self.sched, self.allowed = sg, sched, list(allowed)
        self.memory, self.links, self.favourite = memory, links, favourite
        self.barred = np.ones(sg.D, dtype=bool)
        self.barred[self.allowed] = False
        self.rows = np.full((max(sg.U, 1), sg.D), np.inf)
        self.ids: list[int] = []
        self.held: set[int] = set()  # favourite children held to their parent's device

    def fill(self, k: int, u: int, free: bool = False) -> None:
        """Row ``k`` for unit ``u``: its own device when pinned, its colocation group's once
        placed, its favourite parent's (unless ``free``) when that has room, else every
        allowed device."""
        sg, device, memory = self.sg, self.sched.device, self.memory
        row = self.rows[k]
        row[:] = np.inf
        home = memory.home(u)
        self.held.discard(u)
        if sg.pin[u] >= 0:
            targets = [sg.pin[u]]
        elif home is not None:
            targets = [home]
        elif not free and u in self.favourite and memory.fits(u, device[self.favourite[u]], device):
            targets = [device[self.favourite[u]]]
            self.held.add(u)
        else:
            targets = self.allowed
        for d in targets:
            row[d] = self.links.arrival(sg, u, d, self.sched.finish, device)
        row[self.barred] = np.inf

    def add(self, u: int) -> None:
        self.fill(len(self.ids), u)
        self.ids.append(u)

    def remove(self, k: int) -> int:
        u, last = self.ids[k], len(self.ids) - 1
        self.rows[k] = self.rows[last]
        self.ids[k] = self.ids[last]
        self.ids.pop()
        return u

    def refill_group(self, g: int) -> None:
        """Re-fill the ready forwards of colocation group ``g``, whose device was just set."""
        for k, u in enumerate(self.ids):
            if self.sg.group[u] == g:
                self.fill(k, u)

    def pick(self, avail: np.ndarray, prio: Sequence[float]) -> tuple[int, int]:
        """(ready index, device) of the earliest start whose memory fits; ties to the higher
        priority. Memory rarely binds, so it is checked lazily. Raises ``MemoryShortfall``
        when no ready forward fits anywhere."""
        sg, ids, memory = self.sg, self.ids, self.memory
        est = np.maximum(self.rows[:len(ids)], avail[None, :])
        while True:
            best = est.min(axis=1)
            first = best.min()
            if not np.isfinite(first):
                free = [u for u in ids if sg.pin[u] < 0]
                raise memory.shortfall(free[0] if free else ids[0], self.allowed, self.sched.device)
            ties = np.flatnonzero(best <= first + EPS_MS)
            k = int(ties[0]) if len(ties) == 1 else int(
                max(ties, key=lambda i: (prio[ids[i]], -ids[i])))
            d = int(np.argmin(est[k]))
            if memory.fits(ids[k], d, self.sched.device):
                return k, d
            if ids[k] in self.held:  # the parent's device filled up: free the child
                self.fill(k, ids[k], free=True)
                est[k] = np.maximum(self.rows[k], avail)
            else:
                est[k, d] = np.inf


def etf_schedule(sg: StepGraph, *, allowed: Sequence[int], capacity_bytes: Sequence[float],
                 favourite: Mapping[int, int] | None = None, priority: Sequence[float] | None = None,
                 algorithm: str = "etf") -> OpSchedule:
    """Earliest task first: repeatedly start the ready (forward, device) pair that starts first.

    Ties go to the higher ``priority`` (default: upward rank). With
    ``favourite`` (child unit -> parent unit, from m-SCT's rounded LP) a ready
    favourite child is held to its parent's device when it fits there.
    Devices run forwards back to back in start order (no insertion), as in
    Baechi's m-ETF; a forward only goes where its memory fits, and a
    colocation group's forwards where its first went. Backwards then run as
    ``backward_pass`` says.

    Raises ``MemoryShortfall`` when a ready forward fits nowhere.
    Complexity: O(U x R x D) for the largest ready set R (vectorised per step).
    """
    allowed = list(allowed)
    prio = list(priority) if priority is not None else upward_ranks(sg, allowed)
    sched = new_schedule(sg, algorithm)
    device, start, finish = sched.device, sched.start, sched.finish
    memory = MemoryLedger(sg, capacity_bytes)
    links = Links(sg.n_links)
    ready = ReadyForwards(sg, sched, allowed, memory, links, dict(favourite or {}))
    avail = np.zeros(sg.D)
    indegree = [len(sg.pred[u]) for u in range(sg.U)]
    for u in range(sg.U):
        if indegree[u] == 0:
            ready.add(u)
    while ready.ids:
        k, d = ready.pick(avail, prio)
        u = ready.remove(k)
        s = max(links.arrival(sg, u, d, finish, device, commit=True), float(avail[d]))
        homed = sg.group[u] >= 0 and memory.home(u) is None
        memory.place(u, d, device)
        device[u] = d
        start[u], finish[u] = s, s + sg.fwd[u][d]
        avail[d] = finish[u]
        if homed:
            ready.refill_group(sg.group[u])
        for v, _ in sg.succ[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.add(v)
    backward_pass(sched, links)
    return sched
