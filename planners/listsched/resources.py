"""What list schedulers book while they place tasks: device timelines, memory, links.

``Timeline`` finds the earliest idle slot of a device (HEFT's insertion
policy); ``MemoryLedger`` keeps every device under its capacity and every
colocation group on one device; ``Links`` books transfers on every link of
their route for their whole duration (the simulator's whole-route
reservation), so the schedulers see contention.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from .stepgraph import MemoryShortfall, StepGraph

MAX_GAP_SCAN = 48  # idle intervals a task may look back through before it appends
EPS_MS = 1e-9


class Timeline:
    """Busy intervals of one device, sorted, for insertion-based slot search."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def slot(self, ready: float, duration: float, insertion: bool) -> float:
        """Earliest start >= ``ready`` where ``duration`` fits (an idle gap, or the end)."""
        ends = self.ends
        if not ends:
            return ready
        if ready >= ends[-1] or not insertion:
            return max(ready, ends[-1])
        k = bisect_right(ends, ready)
        candidate = ready
        starts = self.starts
        stop = min(len(starts), k + MAX_GAP_SCAN)
        for i in range(k, stop):
            if candidate + duration <= starts[i] + EPS_MS:
                return candidate
            candidate = max(candidate, ends[i])
        return max(candidate, ends[-1])

    def add(self, start: float, end: float) -> None:
        k = bisect_right(self.starts, start)
        self.starts.insert(k, start)
        self.ends.insert(k, end)


class MemoryLedger:
    """Bytes placed per device: static state, stashed activations, received inputs; and the
    device of every colocation group placed so far.

    An upper bound of what the simulator holds at its peak: it frees
    activations after their last backward reader, this keeps them all. The
    first unit of a colocation group placed sets the group's device (its
    ``home``) and reserves there what the group's other units need, so that
    they find room where they must go.
    """

    def __init__(self, sg: StepGraph, capacity: Sequence[float]):
        self.sg = sg
        self.capacity = list(capacity)
        self.used = [0.0] * sg.D
        self.received: dict[tuple[int, int], float] = {}
        self.homes: dict[int, int] = {}  # colocation group -> its device

    def need(self, u: int, d: int, device: list[int]) -> float:
        sg = self.sg
        total = sg.static_bytes[u] + sg.act_bytes[u]
        for a, nbytes in sg.pred[u]:
            if device[a] != d:
                total += max(0.0, nbytes - self.received.get((a, d), 0.0))
        return total

    def home(self, u: int) -> int | None:
        """The device unit ``u`` must go to (its colocation group's), if already set."""
        g = self.sg.group[u]
        return self.homes.get(g) if g >= 0 else None

    def _reserved(self, u: int) -> float:
        """What placing ``u`` adds to (or takes from) the reservation of its group: the other
        units' bytes for the group's first unit, minus its own for a later one."""
        g = self.sg.group[u]
        if g < 0:
            return 0.0
        own = self.sg.static_bytes[u] + self.sg.act_bytes[u]
        return -own if g in self.homes else self.sg.group_bytes[g] - own

    def fits(self, u: int, d: int, device: list[int]) -> bool:
        return self.used[d] + self.need(u, d, device) + self._reserved(u) <= self.capacity[d] + 1e-6

    def place(self, u: int, d: int, device: list[int]) -> None:
        self.used[d] += self.need(u, d, device) + self._reserved(u)
        if self.sg.group[u] >= 0:
            self.homes.setdefault(self.sg.group[u], d)
        for a, nbytes in self.sg.pred[u]:
            if device[a] != d:
                key = (a, d)
                self.received[key] = max(self.received.get(key, 0.0), nbytes)

    def shortfall(self, u: int, allowed: Sequence[int], device: list[int]) -> MemoryShortfall:
        sg = self.sg
        d = max(allowed, key=lambda j: (self.capacity[j] - self.used[j] - self.need(u, j, device), -j))
        return MemoryShortfall(sg.op_ids[sg.unit_op[u]], self.need(u, d, device), sg.devices[d],
                               max(0.0, self.capacity[d] - self.used[d]), self.capacity[d])


class Links:
    """When each directed link is next free, and what has already been sent where.

    A transfer holds every link of its route for its whole duration and starts
    when the last of them frees up (the simulator's whole-route reservation);
    a producer's output goes to a device once, however many consumers it has.
    """

    __slots__ = ("free", "sent")

    def __init__(self, n_links: int):
        self.free = [0.0] * n_links
        self.sent: dict[tuple[int, int], tuple[float, float]] = {}  # -> (arrival, bytes)

    def arrival(self, sg: StepGraph, u: int, d: int, finish: list[float], device: list[int],
                commit: bool = False) -> float:
        """When every input of the forward of unit ``u`` is on device ``d``; ``commit``
        books the transfers."""
        ready = 0.0
        preds = sg.pred[u]
        if len(preds) > 1:
            preds = sorted(preds, key=lambda p: finish[p[0]])
        booked: dict[int, float] = {}
        for a, nbytes in preds:
            src = device[a]
            at = finish[a]
            if src != d and nbytes > 0:
                key = (a, d)
                sent = self.sent.get(key)
                if sent is not None and sent[1] >= nbytes:
                    at = sent[0]
                else:
                    route = sg.route_links[src][d]
                    free = self.free
                    for link in route:
                        at = max(at, booked.get(link, free[link]))
                    at += sg.lat[src][d] + nbytes * sg.per_byte[src][d]
                    for link in route:
                        booked[link] = at
                    if commit:
                        self.sent[key] = (at, nbytes)
            ready = max(ready, at)
        if commit:
            for link, at in booked.items():
                self.free[link] = at
        return ready

    def send(self, sg: StepGraph, src: int, dst: int, ready: float, nbytes: float) -> float:
        """Book one transfer that can leave at ``ready``; returns its arrival."""
        route = sg.route_links[src][dst]
        at = ready
        for link in route:
            at = max(at, self.free[link])
        at += sg.lat[src][dst] + nbytes * sg.per_byte[src][dst]
        for link in route:
            self.free[link] = at
        return at
