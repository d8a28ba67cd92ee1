"""List scheduling of one training step at op granularity: HEFT, CPOP and ETF.

The scheduled graph is the *training step* of an op graph: every op has a
forward task and a backward task. Forward tasks follow the graph's edges,
backward tasks follow them reversed (the gradient of a tensor has its size),
and an op's backward waits for its own forward. An op's backward runs on the
device of its forward (its parameters and stashed activations live there), so
only forward tasks choose a device; backward tasks inherit it.

A *unit* is one op on one device: an op that is not split is one unit; an op
split k ways over the batch is k units, each pinned to its device and holding
the batch interval ``[lo, hi)``. Data moves between two units in proportion to
the overlap of their batch intervals, so a split op receives its input
scattered and its consumers gather (concatenate) its output; those transfers
are costed like any other.

Costs come from the shared ``CostModel`` only: op times per device type
(scaled by batch share, launch overhead unscaled) and point-to-point transfer
times on the topology's real routes. A lone transfer is affine in the byte
count on a route, so its two coefficients per ordered device pair are read
once from the cost model (``transfer_affine``) and kept in small tables.

Algorithms (each returns a ``Schedule``):

* ``list_schedule`` - HEFT-style list scheduling (Topcuoglu et al., 2002):
  tasks in decreasing priority from a ready queue, each forward task to the
  device giving its earliest finish time (insertion into idle gaps), with
  per-device memory respected. With ``upward_ranks`` as the priority this is
  HEFT; with ``upward + downward`` ranks and the critical path pinned
  (``cpop_pins``) it is CPOP.
* ``etf_schedule`` - earliest task first (Hwang et al., 1989), Baechi's m-ETF:
  among all ready tasks, the (task, device) pair that can start earliest,
  with memory checks; optional favourite children (Baechi's m-SCT).

Transfers book every link of their route for their whole duration (the
simulator's whole-route reservation), so the schedulers see contention and
their own estimate of the iteration tracks the simulator's closely.

Complexity: building a ``StepGraph`` is O(ops x devices + edges). HEFT and
CPOP are O((U + E) x D x L) for U units, E unit edges, D devices and L links
per route, plus the gap search of insertion (bounded by ``MAX_GAP_SCAN``
intervals per query); ETF is O(U x R x D) with R the largest ready set, done
with numpy per step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import Group, Optimizer, SyncMethod
from dl_nfv.simulator.costs import CostModel, scale_table

GIB = 2**30
MAX_GAP_SCAN = 48  # idle intervals a task may look back through before it appends
EPS_MS = 1e-9


class MemoryShortfall(Exception):
    """No allowed device has room for a unit; names the op and how much is missing."""

    def __init__(self, op_id: str, need_bytes: float, device: str, free_bytes: float,
                 capacity_bytes: float):
        self.op_id = op_id
        self.need_bytes = need_bytes
        self.device = device
        self.free_bytes = free_bytes
        self.capacity_bytes = capacity_bytes
        super().__init__(self.describe())

    @property
    def shortfall_bytes(self) -> float:
        return self.need_bytes - self.free_bytes

    def describe(self) -> str:
        return (f"op {self.op_id!r} needs {self.need_bytes / GIB:.3f} GiB (parameters, gradients, "
                f"optimizer state and activations) but fits on no device: the most room is "
                f"{self.free_bytes / GIB:.3f} GiB left of {self.capacity_bytes / GIB:.2f} GiB on "
                f"{self.device!r} (short by {self.shortfall_bytes / GIB:.3f} GiB)")


@dataclass(frozen=True, slots=True)
class Split:
    """An op split over the batch: ``devices[i]`` computes ``shares[i]`` of it."""

    devices: tuple[str, ...]
    shares: tuple[float, ...]


class StepGraph:
    """The units and tasks of one training step, with their costs on every device.

    Parameters
    ----------
    cm : CostModel
        The shared cost model of the graph and cluster.
    devices : sequence of str
        The devices a schedule may use (names, in this order).
    splits : mapping of op id to Split, optional
        Ops split over the batch, each replica pinned to its device.
    optimizer : Optimizer
        The optimizer whose step and state the schedule counts.
    """

    def __init__(self, cm: CostModel, devices: Sequence[str], *,
                 splits: Mapping[str, Split] | None = None, optimizer: Optimizer = Optimizer.SGD,
                 topological_ids: Sequence[str] | None = None):
        self.cm = cm
        self.devices = list(devices)
        self.splits = dict(splits or {})
        self.optimizer = optimizer
        D = self.D = len(self.devices)
        dev_index = {d: j for j, d in enumerate(self.devices)}
        graph = cm.graph
        self.op_ids = cm.op_ids
        n = len(self.op_ids)
        topo_ops = [cm.op_index[o] for o in (topological_ids or graph.topological_ids())]

        # units: one per unsplit op, one per replica of a split op, in topological order
        unit_op: list[int] = []
        lo: list[float] = []
        hi: list[float] = []
        pin: list[int] = []
        self.units_of_op: list[list[int]] = [[] for _ in range(n)]
        for i in topo_ops:
            split = self.splits.get(self.op_ids[i])
            parts = ([(dev_index[d], s) for d, s in zip(split.devices, split.shares)]
                     if split else [(-1, 1.0)])
            acc = 0.0
            for k, (j, share) in enumerate(parts):
                self.units_of_op[i].append(len(unit_op))
                unit_op.append(i)
                lo.append(acc)
                acc = 1.0 if k == len(parts) - 1 else acc + share
                hi.append(acc)
                pin.append(j)
        self.U = U = len(unit_op)
        self.unit_op, self.lo, self.hi, self.pin = unit_op, lo, hi, pin
        self.share = [h - l_ for l_, h in zip(lo, hi)]

        cols = [cm.device_type_index[d] for d in self.devices]
        cells = np.ix_(np.asarray(unit_op), cols)
        share = np.asarray(self.share)[:, None]
        # a unit's time at its share, and the part of it that does not shrink with the batch
        fwd_fixed, bwd_fixed = cm.fwd_fixed_by_type[cells], cm.bwd_fixed_by_type[cells]
        self.fwd_fixed, self.bwd_fixed = fwd_fixed.tolist(), bwd_fixed.tolist()  # [U][D]
        self.fwd = scale_table(cm.fwd_ms_by_type[cells], fwd_fixed, share).tolist()
        self.bwd = scale_table(cm.bwd_ms_by_type[cells], bwd_fixed, share).tolist()
        # an op has a backward when it or an op it depends on has parameters (as simulated)
        needs = [False] * n
        preds_of: list[list[int]] = [[] for _ in range(n)]
        for e in graph.edges:
            preds_of[cm.op_index[e.dst]].append(cm.op_index[e.src])
        for i in topo_ops:
            needs[i] = cm.param_bytes[i] > 0 or any(needs[p] for p in preds_of[i])
        self.rg = [needs[i] for i in unit_op]
        self.bwd = [row if g else [0.0] * D for row, g in zip(self.bwd, self.rg)]
        params = cm.param_bytes[np.asarray(unit_op)]
        # a backward also adds the op's weight gradients into their buckets
        add = [cm.accumulate_ms_per_byte(d) for d in self.devices]
        self.bwd = [[ms + float(g) * a for ms, a in zip(row, add)] if g > 0 else row
                    for row, g in zip(self.bwd, params)]
        self.param_bytes = params.tolist()
        # tied weights: (owner op index, sharing op index, bytes), from the cost model's
        self.ties = [(cm.op_index[owner], cm.op_index[sharer], nbytes)
                     for _, owner, sharer, nbytes in cm.ties]
        self.static_bytes = (params * (2.0 + optimizer.state_factor)
                             + cm.resident_bytes[np.asarray(unit_op)]).tolist()
        self.act_bytes = (cm.output_bytes[np.asarray(unit_op)] * share[:, 0]).tolist()

        # unit edges: data moves between replicas in proportion to their batch overlap
        self.succ: list[list[tuple[int, float]]] = [[] for _ in range(U)]
        self.pred: list[list[tuple[int, float]]] = [[] for _ in range(U)]
        for e in graph.edges:
            src, dst = self.units_of_op[cm.op_index[e.src]], self.units_of_op[cm.op_index[e.dst]]
            split = self.splits.get(e.src)
            if split is not None and split == self.splits.get(e.dst):
                pairs = zip(src, dst)  # split alike: replica i feeds replica i only
            else:
                pairs = ((a, b) for a in src for b in dst)
            for a, b in pairs:
                overlap = min(hi[a], hi[b]) - max(lo[a], lo[b])
                if overlap <= 1e-12:
                    continue
                nbytes = e.bytes * overlap
                self.succ[a].append((b, nbytes))
                self.pred[b].append((a, nbytes))

        # affine transfer model per ordered device pair, read from the cost model, and the
        # directed links each route holds while it carries a transfer
        self.lat = [[0.0] * D for _ in range(D)]
        self.per_byte = [[0.0] * D for _ in range(D)]
        self.route_links: list[list[tuple[int, ...]]] = [[() for _ in range(D)] for _ in range(D)]
        link_ids: dict[tuple[str, str], int] = {}
        for a, da in enumerate(self.devices):
            for b, db in enumerate(self.devices):
                if a != b:
                    self.lat[a][b], self.per_byte[a][b] = cm.transfer_affine(da, db)
                    self.route_links[a][b] = tuple(link_ids.setdefault(hop, len(link_ids))
                                                   for hop in cm.cluster.route(da, db).hops)
        self.n_links = len(link_ids)

    # ------------------------------------------------------------ helpers
    def comm_ms(self, a: int, b: int, nbytes: float) -> float:
        if a == b or nbytes <= 0:
            return 0.0
        return self.lat[a][b] + nbytes * self.per_byte[a][b]

    def task_succs(self, t: int) -> list[tuple[int, float]]:
        """Successor tasks of task ``t`` with the bytes each receives from it."""
        U = self.U
        if t < U:
            return [*self.succ[t], *([(U + t, 0.0)] if self.rg[t] else [])]
        return [(U + a, b) for a, b in self.pred[t - U] if self.rg[a]]

    def mean_costs(self, allowed: Sequence[int]) -> tuple[list[float], float, float]:
        """Mean compute time of every task over ``allowed`` devices (pinned units: their own
        device), and the mean latency and ms per byte over ordered pairs of allowed devices."""
        cols = list(allowed)
        fwd = np.asarray(self.fwd)[:, cols].mean(axis=1)
        bwd = np.asarray(self.bwd)[:, cols].mean(axis=1)
        w = [*fwd.tolist(), *bwd.tolist()]
        for u, j in enumerate(self.pin):
            if j >= 0:
                w[u], w[self.U + u] = self.fwd[u][j], self.bwd[u][j]
        pairs = [(a, b) for a in cols for b in cols if a != b]
        if not pairs:
            return w, 0.0, 0.0
        lat = sum(self.lat[a][b] for a, b in pairs) / len(pairs)
        per_byte = sum(self.per_byte[a][b] for a, b in pairs) / len(pairs)
        return w, lat, per_byte


# ----------------------------------------------------------------- priorities
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


# ------------------------------------------------------------------ schedules
@dataclass(slots=True)
class Schedule:
    """Devices, start and finish times of every task of one step, and what bound each start.

    ``device[u]`` is the device index of unit ``u``; tasks ``0..U-1`` are the
    forwards and ``U..2U-1`` the backwards of the units. A device runs its
    forwards in start order, then its backwards in the reverse of that order,
    then its optimizer update - the way the simulator runs a plan's ``order``.
    ``makespan_ms`` is the scheduler's own estimate (links booked in
    scheduling order, not simulated): finished candidates are compared by the
    simulator, not by this number.
    """

    sg: StepGraph
    algorithm: str
    device: list[int]
    start: list[float]
    finish: list[float]
    makespan_ms: float = 0.0

    def order(self) -> dict[str, tuple[str, ...]]:
        """Each device's op order, by earliest start.

        A split op is ordered everywhere by its earliest replica, so that all
        devices' orders follow one global order of ops that respects the data
        edges (no device order can then contradict another's through a split
        op).
        """
        sg = self.sg
        key: dict[int, tuple[float, float, int]] = {}
        for i, units in enumerate(sg.units_of_op):
            key[i] = (min(self.start[u] for u in units), min(self.finish[u] for u in units),
                      units[0])
        out: dict[str, tuple[str, ...]] = {}
        for j, name in enumerate(sg.devices):
            ops = sorted({sg.unit_op[u] for u in range(sg.U) if self.device[u] == j},
                         key=key.__getitem__)
            if ops:
                out[name] = tuple(sg.op_ids[i] for i in ops)
        return out


class _Timeline:
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


class _Memory:
    """Bytes placed per device: static state, stashed activations, received inputs.

    An upper bound of what the simulator holds at its peak: it frees
    activations after their last backward reader, this keeps them all.
    """

    def __init__(self, sg: StepGraph, capacity: Sequence[float]):
        self.sg = sg
        self.capacity = list(capacity)
        self.used = [0.0] * sg.D
        self.received: dict[tuple[int, int], float] = {}

    def need(self, u: int, d: int, device: list[int]) -> float:
        sg = self.sg
        total = sg.static_bytes[u] + sg.act_bytes[u]
        for a, nbytes in sg.pred[u]:
            if device[a] != d:
                total += max(0.0, nbytes - self.received.get((a, d), 0.0))
        return total

    def fits(self, u: int, d: int, device: list[int]) -> bool:
        return self.used[d] + self.need(u, d, device) <= self.capacity[d] + 1e-6

    def place(self, u: int, d: int, device: list[int]) -> None:
        self.used[d] += self.need(u, d, device)
        for a, nbytes in self.sg.pred[u]:
            if device[a] != d:
                key = (a, d)
                self.received[key] = max(self.received.get(key, 0.0), nbytes)

    def shortfall(self, u: int, allowed: Sequence[int], device: list[int]) -> MemoryShortfall:
        sg = self.sg
        d = max(allowed, key=lambda j: (self.capacity[j] - self.used[j] - self.need(u, j, device), -j))
        return MemoryShortfall(sg.op_ids[sg.unit_op[u]], self.need(u, d, device), sg.devices[d],
                               max(0.0, self.capacity[d] - self.used[d]), self.capacity[d])


class _Links:
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


def _new_schedule(sg: StepGraph, algorithm: str) -> Schedule:
    n = 2 * sg.U
    return Schedule(sg, algorithm, [-1] * sg.U, [0.0] * n, [0.0] * n)


def list_schedule(sg: StepGraph, priority: Sequence[float], *, allowed: Sequence[int],
                  capacity_bytes: Sequence[float], pins: Mapping[int, int] | None = None,
                  insertion: bool = True, lookahead: bool = False,
                  algorithm: str = "heft", buckets: Sequence[Sequence[int]] = ()) -> Schedule:
    """Place and order forwards by decreasing ``priority`` from a ready queue; then backwards.

    A forward goes to the allowed device (or its pinned one) with the earliest
    finish time that still has memory for it; ``lookahead`` adds the op's
    backward time on the device to that score (it runs there too). With
    ``insertion`` a forward may fill an idle gap of its device (HEFT's
    insertion policy). Backwards then run as ``backward_pass`` says (with
    ``buckets``).

    Raises ``MemoryShortfall`` when a forward fits on no allowed device.
    Complexity: O((U + E) x D) plus the bounded gap search.
    """
    U = sg.U
    pins = dict(pins or {})
    allowed = list(allowed)
    sched = _new_schedule(sg, algorithm)
    device, start, finish = sched.device, sched.start, sched.finish
    lines = [_Timeline() for _ in range(sg.D)]
    memory = _Memory(sg, capacity_bytes)
    links = _Links(sg.n_links)
    fwd, bwd = sg.fwd, sg.bwd
    indegree = [len(sg.pred[u]) for u in range(U)]
    heap = [(-priority[u], u) for u in range(U) if indegree[u] == 0]
    heapq.heapify(heap)
    while heap:
        _, u = heapq.heappop(heap)
        if sg.pin[u] >= 0:  # a replica of a split op cannot move
            candidates = [sg.pin[u]]
            if not memory.fits(u, sg.pin[u], device):
                raise memory.shortfall(u, candidates, device)
        elif u in pins and memory.fits(u, pins[u], device):
            candidates = [pins[u]]
        else:
            candidates = [d for d in allowed if memory.fits(u, d, device)]
            if not candidates:
                raise memory.shortfall(u, allowed, device)
        best = None
        for d in candidates:
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


def backward_pass(sched: Schedule, links: _Links | None = None,
                  buckets: Sequence[Sequence[int]] = ()) -> None:
    """Time the backwards, gradient AllReduces and optimizer updates of a placed forward pass.

    Each device runs its backwards after its last forward, in the reverse of
    its op order (``Schedule.order``: what the simulator does with it); a
    backward also waits for the gradients of its consumers. Ops with no
    parameters at or above them have no backward. A split op with parameters
    AllReduces its gradient over its devices after its last backward, or, when
    it is in one of ``buckets`` (op indices of ops split alike, synchronised
    together), its bucket does after the bucket's last backward (one
    collective at a time per device); each device then updates all the
    parameters it holds. Sets ``makespan_ms``.

    Complexity: O(U log U + E) plus one AllReduce cost per split op.
    """
    sg = sched.sg
    cm = sg.cm
    U = sg.U
    links = links or _Links(sg.n_links)
    device, start, finish = sched.device, sched.start, sched.finish
    rg, bwd = sg.rg, sg.bwd
    free = [0.0] * sg.D
    op_key = {i: (min(start[u] for u in units), min(finish[u] for u in units), units[0])
              for i, units in enumerate(sg.units_of_op)}
    keyed = sorted(range(U), key=lambda u: op_key[sg.unit_op[u]])  # the plan's order
    for u in keyed:
        free[device[u]] = max(free[device[u]], finish[u])
    # the owner of a tied weight whose sharer runs on another device no longer sums the two
    # gradients in its backward (the AllReduce below does), as the simulator lowers it
    untie = [0.0] * U
    for owner, sharer, _ in sg.ties:
        own = {device[u] for u in sg.units_of_op[owner]}
        if {device[u] for u in sg.units_of_op[sharer]} - own:
            for u in sg.units_of_op[owner]:
                untie[u] = max(untie[u], cm.tie_sum_ms(sg.op_ids[owner], sg.devices[device[u]]))
    for u in reversed(keyed):
        if not rg[u]:
            continue
        d = device[u]
        ready = finish[u]
        remote: dict[int, list[float]] = {}  # consumer device -> [gradients ready, bytes]
        for s, nbytes in sg.succ[u]:
            src = device[s]
            if src == d or nbytes <= 0:
                ready = max(ready, finish[U + s])
                continue
            entry = remote.setdefault(src, [0.0, 0.0])
            entry[0] = max(entry[0], finish[U + s])
            entry[1] = max(entry[1], nbytes)
        for src, (at, nbytes) in sorted(remote.items(), key=lambda kv: kv[1][0]):
            ready = max(ready, links.send(sg, src, d, at, nbytes))
        t = U + u
        begin = max(ready, free[d])
        start[t], finish[t] = begin, begin + max(0.0, bwd[u][d] - untie[u])
        free[d] = finish[t]
    # gradient synchronisation of split ops, then one update per device
    done = list(free)
    stream = [0.0] * sg.D
    bucketed = {i for bucket in buckets for i in bucket}
    syncs = [[i] for i, units in enumerate(sg.units_of_op)
             if len(units) > 1 and sg.param_bytes[units[0]] > 0 and i not in bucketed]
    syncs += [list(bucket) for bucket in buckets if bucket]
    timed = sorted((max(finish[U + u] for i in ops for u in sg.units_of_op[i]), k)
                   for k, ops in enumerate(syncs))
    for ready, k in timed:
        units = sg.units_of_op[syncs[k][0]]
        nbytes = sum(sg.param_bytes[sg.units_of_op[i][0]] for i in syncs[k])
        devs = [device[u] for u in units]
        begin = max([ready, *(stream[d] for d in devs)])
        end = begin + cm.allreduce_ms([sg.devices[d] for d in devs], nbytes)
        for d in devs:
            stream[d] = end
            done[d] = max(done[d], end)
    params = [0.0] * sg.D
    for u in range(U):
        params[device[u]] += sg.param_bytes[u]
    # tied weights used on another device than their owner's: a copy there, summed by an
    # AllReduce after both backwards (as the simulator and the runtime do)
    for owner, sharer, nbytes in sg.ties:
        units = (*sg.units_of_op[owner], *sg.units_of_op[sharer])
        held = {device[u] for u in units}
        if len(held) < 2:
            continue
        owners = {device[u] for u in sg.units_of_op[owner]}
        begin = max([max(finish[U + u] for u in units), *(stream[d] for d in held)])
        end = begin + cm.allreduce_ms([sg.devices[d] for d in sorted(held)], nbytes)
        for d in held:
            stream[d] = end
            done[d] = max(done[d], end)
            if d not in owners:
                params[d] += nbytes
    makespan = 0.0
    for d in range(sg.D):
        end = done[d]
        if params[d] > 0:
            end += (cm.update_ms(params[d], sg.devices[d], sg.optimizer)
                    + cm.upkeep_ms(params[d], sg.devices[d], 0))  # zeroing; adding: in bwd
        makespan = max(makespan, end)
    sched.makespan_ms = makespan


# ------------------------------------------------------------------------ ETF
def etf_schedule(sg: StepGraph, *, allowed: Sequence[int], capacity_bytes: Sequence[float],
                 favourite: Mapping[int, int] | None = None, priority: Sequence[float] | None = None,
                 algorithm: str = "etf") -> Schedule:
    """Earliest task first: repeatedly start the ready (forward, device) pair that starts first.

    Ties go to the higher ``priority`` (default: upward rank). With
    ``favourite`` (child unit -> parent unit, from m-SCT's rounded LP) a ready
    favourite child is held to its parent's device when it fits there.
    Devices run forwards back to back in start order (no insertion), as in
    Baechi's m-ETF; a forward only goes where its memory fits. Backwards then
    run as ``backward_pass`` says.

    Raises ``MemoryShortfall`` when a ready forward fits nowhere.
    Complexity: O(U x R x D) for the largest ready set R (vectorised per step).
    """
    U, D = sg.U, sg.D
    allowed = list(allowed)
    favourite = dict(favourite or {})
    prio = list(priority) if priority is not None else upward_ranks(sg, allowed)
    sched = _new_schedule(sg, algorithm)
    device, start, finish = sched.device, sched.start, sched.finish
    memory = _Memory(sg, capacity_bytes)
    links = _Links(sg.n_links)
    avail = np.zeros(D)
    barred = np.ones(D, dtype=bool)
    barred[allowed] = False
    indegree = [len(sg.pred[u]) for u in range(U)]
    # ready forwards: data-ready time per device (inf where barred), kept packed in rows[:m]
    rows = np.full((max(U, 1), D), np.inf)
    ready_ids: list[int] = []
    held: set[int] = set()  # favourite children held to their parent's device

    def fill(k: int, u: int, free: bool = False) -> None:
        row = rows[k]
        row[:] = np.inf
        if sg.pin[u] >= 0:
            targets = [sg.pin[u]]
        elif not free and u in favourite and memory.fits(u, device[favourite[u]], device):
            targets = [device[favourite[u]]]
            held.add(u)
        else:
            targets = allowed
            held.discard(u)
        for d in targets:
            row[d] = links.arrival(sg, u, d, finish, device)
        row[barred] = np.inf

    def make_ready(u: int) -> None:
        fill(len(ready_ids), u)
        ready_ids.append(u)

    for u in range(U):
        if indegree[u] == 0:
            make_ready(u)
    while ready_ids:
        m = len(ready_ids)
        est = np.maximum(rows[:m], avail[None, :])
        while True:  # the earliest start whose memory fits (memory rarely binds: check lazily)
            best = est.min(axis=1)
            first = best.min()
            if not np.isfinite(first):
                raise memory.shortfall(next(u for u in ready_ids if sg.pin[u] < 0) if any(
                    sg.pin[u] < 0 for u in ready_ids) else ready_ids[0], allowed, device)
            ties = np.flatnonzero(best <= first + EPS_MS)
            k = int(ties[0]) if len(ties) == 1 else int(
                max(ties, key=lambda i: (prio[ready_ids[i]], -ready_ids[i])))
            d = int(np.argmin(est[k]))
            if memory.fits(ready_ids[k], d, device):
                break
            if ready_ids[k] in held:  # the parent's device filled up: free the child
                fill(k, ready_ids[k], free=True)
                est[k] = np.maximum(rows[k], avail)
            else:
                est[k, d] = np.inf
        u = ready_ids[k]
        s = max(links.arrival(sg, u, d, finish, device, commit=True), float(avail[d]))
        memory.place(u, d, device)
        device[u] = d
        start[u], finish[u] = s, s + sg.fwd[u][d]
        avail[d] = finish[u]
        last = m - 1
        rows[k] = rows[last]
        ready_ids[k] = ready_ids[last]
        ready_ids.pop()
        for v, _ in sg.succ[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                make_ready(v)
    backward_pass(sched, links)
    return sched


# ------------------------------------------------------------- plan building
def plan_groups(sched: Schedule, *, merge_splits: bool = False
                ) -> tuple[list[Group], dict[str, tuple[str, ...]], list[str]]:
    """Groups, per-device order and notes of a schedule.

    Unsplit ops share one group per device (``sync: none``). Every split op is
    a group of that one op over its devices with its batch shares, AllReduce
    of its gradients when it has parameters, and a ``note`` saying how it was
    split; with ``merge_splits`` the ops split the same way share one group
    (one gradient synchronisation for all of them, as in data parallelism).
    """
    sg = sched.sg
    per_device: dict[int, list[str]] = {}
    by_split: dict[Split, list[str]] = {}
    for i, units in enumerate(sg.units_of_op):
        op_id = sg.op_ids[i]
        if op_id in sg.splits:
            by_split.setdefault(sg.splits[op_id], []).append(op_id)
        else:
            per_device.setdefault(sched.device[units[0]], []).append(op_id)
    groups = [Group(id=f"on:{sg.devices[j]}", ops=tuple(ops), devices=(sg.devices[j],),
                    sync=SyncMethod.NONE)
              for j, ops in sorted(per_device.items())]
    notes: list[str] = []
    for n, (split, ops) in enumerate(by_split.items()):
        k = len(split.devices)
        shares = ", ".join(f"{d}={s:.3g}" for d, s in zip(split.devices, split.shares))
        members = [ops] if merge_splits else [[op] for op in ops]
        for member in members:
            has_params = any(sg.param_bytes[sg.units_of_op[sg.cm.op_index[o]][0]] > 0 for o in member)
            if merge_splits:
                note = f"{len(member)} ops replicated {k}-way (data parallel); shares {shares}"
            else:
                note = f"op {member[0]!r} split {k}-way on the batch dimension; shares {shares}"
            groups.append(Group(
                id=f"replicated{n}" if merge_splits else f"split:{member[0]}", ops=tuple(member),
                devices=split.devices, batch_shares=split.shares,
                sync=SyncMethod.ALLREDUCE if has_params else SyncMethod.NONE, note=note))
            notes.append(note)
    return groups, sched.order(), notes


__all__ = [
    "MemoryShortfall", "Schedule", "Split", "StepGraph", "backward_pass", "cpop_pins",
    "downward_ranks", "etf_schedule", "list_schedule", "plan_groups", "upward_ranks",
]
