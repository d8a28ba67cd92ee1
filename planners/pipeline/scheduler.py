"""Microbatch scheduling of a synchronous pipeline: fixed orders and a list scheduler.

Input: per stage the forward and backward time of one microbatch (the
slowest replica's, and of the backward the part that computes input
gradients), the time of each stage-to-stage transfer of one microbatch
(activations forward, their gradients backward, FIFO on a channel
per stage pair and direction, as links are in the simulator), the time of the
stage's gradient synchronisation and optimizer update after its last
backward, the AllReduce of each weight tied across stages (after the last
backward of the stages holding it, before any of them updates), and how many
microbatches each stage may hold in flight (memory).

``run`` times a schedule event by event and, for ``Policy.LIST``, builds it:
non-delay list scheduling in which every stage, whenever it is free, starts
the task that can start earliest; between tasks that can both start now it
takes the one with the longer remaining path to the end of the iteration
(forward first, so a bottleneck stage further down is fed), unless the
microbatch cap of the stage is reached or ``backward_first`` is set. The
caps come from memory and from the round trip of a microbatch through the
downstream stages: a stage needs about ``round_trip / (f + b) + 1`` microbatches
in flight not to idle while its gradients travel, which is more than 1F1B's
``stages - s`` when links are slow or stages uneven, and fewer than GPipe's
``m`` when memory is short. A split variant (``list-zb``) runs the backward of
every stage but the first as I (the input gradients, which the stage sends back)
and W (the weight gradients): the I as soon as its gradients arrive, the W
whenever no F or I could start as early, so the W's fill the stage's waits
(as zero-bubble pipeline schedules do) and the stage before gets its gradients
a W sooner. ``auto_schedule`` times GPipe, 1F1B and list variants and keeps the
fastest.

Complexity: O(stages^2 x microbatches) per run (each step scans the stages).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from heapq import heappop, heappush

from dl_nfv.artifacts import Action
from dl_nfv.planners.schedules import Schedule, actions, gpipe, one_f_one_b


class Policy(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    LIST = "list"


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per-microbatch times of a pipeline (all ms); see the module docstring."""

    f_ms: tuple[float, ...]
    b_ms: tuple[float, ...]
    send_ms: dict[tuple[int, int], float]  # (s, t), s < t: one microbatch's activations s -> t
    sync_ms: tuple[float, ...]  # gradient sync + optimizer update after the stage's last B
    caps: tuple[int, ...]  # most microbatches in flight per stage (memory)
    microbatches: int
    # (s, t, "F" | "B") -> the link capacities that transfer occupies (absent: its own channel)
    links: dict[tuple[int, int, str], frozenset] = field(default_factory=dict)
    # tied weights across stages: (the stages holding one, its AllReduce ms); it starts when
    # the last of their backwards ends, and their syncs start after it
    ties: tuple[tuple[tuple[int, ...], float], ...] = ()
    # tied weights summed by exchange: (owner stage, sharer stage, ms of the sharer's dense
    # gradient to the owner, sent when the sharer's last task ends, and the link capacities
    # it occupies; the same for the owner's rows back); each one's sync starts once what it
    # receives has arrived
    exchanges: tuple[tuple[int, int, float, frozenset, float, frozenset], ...] = ()
    # per stage, the part of b_ms that computes input gradients (the rest, weight gradients,
    # may wait: a split backward's I and W); empty where the backward cannot be split
    bi_ms: tuple[float, ...] = ()
    # what every schedule of these costs builds alike (``_channels``), kept once built
    plumbing: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def splittable(self) -> tuple[bool, ...]:
        """Per stage: whether splitting its backward can help (some weight-gradient time,
        and a stage before it to send the input gradients to: the first stage's whole
        backward may as well wait)."""
        if not self.bi_ms:
            return (False,) * self.stages
        return tuple(s > 0 and b - bi > 1e-9 * b + 1e-12
                     for s, (b, bi) in enumerate(zip(self.b_ms, self.bi_ms)))

    def channels(self, s: int, t: int, direction: str) -> tuple:
        """What the transfer ``s -> t`` (``F``) or ``t -> s`` (``B``) queues on: its links,
        shared with every other transfer crossing them, or a channel of its own."""
        return tuple(self.links.get((s, t, direction)) or ((s, t, direction),))

    @property
    def stages(self) -> int:
        return len(self.f_ms)


@dataclass(frozen=True, slots=True)
class Timed:
    """A timed schedule: the makespan estimate and the order each stage ran."""

    makespan_ms: float
    schedule: Schedule
    label: str


def run(costs: StageCosts, policy: Policy, *, caps: Sequence[int] | None = None,
        backward_first: bool = False, split: bool = False) -> Timed:
    """Time (and for ``LIST`` build) a schedule; raises ``ValueError`` if it deadlocks.

    ``split`` (``LIST`` only) splits the backward of every stage where that can help
    (``StageCosts.splittable``) into I and W: the I first, as soon as its gradients
    arrive, and the W whenever the stage would otherwise wait (no F or I can start as
    early), with the stage's microbatches in flight counted until their W."""
    S, M = costs.stages, costs.microbatches
    if policy is Policy.LIST:
        cap = [max(1, min(c, M, k)) for c, k in zip(caps if caps is not None else [M] * S, costs.caps)]
        flags = costs.splittable() if split else (False,) * S
        name = "list-zb" if any(flags) else "list-bf" if backward_first else "list"
        label = name + f"(caps {','.join(map(str, cap))})"
        return _Sim(costs).list_schedule(cap, backward_first, label, flags)
    fixed = (gpipe if policy is Policy.GPIPE else one_f_one_b)(S, M)
    return _Sim(costs).fixed(fixed, policy.value)


def _channels(costs: StageCosts) -> tuple:
    """``_Sim``'s plumbing of ``costs``: per stage the stages it receives from and sends to,
    (stage, channels, ms) of each activation it sends forward and of each gradient it sends
    back, the tie exchanges each stage sends when its last task ends, and the number of
    channels (links shared by transfers, numbered once)."""
    S = costs.stages
    sources: list[list[int]] = [[] for _ in range(S)]
    sinks: list[list[int]] = [[] for _ in range(S)]
    for (s, t) in sorted(costs.send_ms):
        sources[t].append(s)
        sinks[s].append(t)
    ids: dict = {}

    def numbered(channels) -> tuple[int, ...]:
        return tuple(ids.setdefault(k, len(ids)) for k in channels)

    out_f = [[(t, numbered(costs.channels(s, t, "F")), costs.send_ms[(s, t)])
              for t in sinks[s]] for s in range(S)]
    out_b = [[(u, numbered(costs.channels(u, s, "B")), costs.send_ms[(u, s)])
              for u in sources[s]] for s in range(S)]
    exchange_sends: dict[int, list[tuple[int, tuple, float]]] = {}
    for k, (owner, sharer, dense, dense_links, rows, rows_links) in enumerate(costs.exchanges):
        exchange_sends.setdefault(sharer, []).append(
            (owner, numbered(tuple(dense_links) or (("tie", k, "dense"),)), dense))
        exchange_sends.setdefault(owner, []).append(
            (sharer, numbered(tuple(rows_links) or (("tie", k, "rows"),)), rows))
    return sources, sinks, out_f, out_b, exchange_sends, len(ids)


class _Sim:
    """Event bookkeeping shared by the fixed-order and list-scheduling passes.

    Tasks start in global time order. A transfer queues FIFO on every link it
    crosses (``StageCosts.channels``), shared with the other stage pairs' transfers
    over those links, as in the simulator: its arrival is ``max(send end, the
    links' last arrival) + duration``. Channels are numbered once and each stage's
    sends listed with theirs, so that a transfer costs a few list lookups (this loop
    is most of a plan's time).
    """

    def __init__(self, costs: StageCosts):
        S, M = costs.stages, costs.microbatches
        self.costs, self.S, self.M = costs, S, M
        if "channels" not in costs.plumbing:  # the same for every schedule of ``costs``
            costs.plumbing["channels"] = _channels(costs)
        sources, sinks, self.out_f, self.out_b, self.exchange_sends, count = \
            costs.plumbing["channels"]
        self.ready_f = [[0.0 if not sources[s] else -1.0] * M for s in range(S)]
        self.wait_f = [[len(sources[s])] * M for s in range(S)]
        self.ready_b = [[-1.0] * M for _ in range(S)]
        self.wait_b = [[len(sinks[s]) + 1] * M for s in range(S)]
        self.arrive_f = [[0.0] * M for _ in range(S)]
        self.arrive_b = [[0.0] * M for _ in range(S)]
        self.free = [0.0] * S
        # split backwards: the I's part of each stage's backward, the W's, and when each I ended
        self.bi_ms = costs.bi_ms or costs.b_ms
        self.w_ms = [b - bi for b, bi in zip(costs.b_ms, self.bi_ms)]
        self.i_end = [[0.0] * M for _ in range(S)]
        self.tasks = [2 * M] * S  # per stage: its tasks (3 per microbatch where split)
        # tie exchanges: what each stage sends when its last task ends, and their arrivals
        self.done = [0] * S
        self.received = [0.0] * S
        self.chan = [0.0] * count  # per channel: when its last transfer arrives

    def send(self, channels: tuple[int, ...], ready: float, duration: float) -> float:
        """A transfer ready at ``ready`` waits for every channel it needs (FIFO); its arrival."""
        chan = self.chan
        start = ready
        for k in channels:
            if chan[k] > start:
                start = chan[k]
        arrive = start + duration
        for k in channels:
            chan[k] = arrive
        return arrive

    def complete(self, s: int, op: str, m: int, start: float) -> list[int]:
        """Record ``op`` of microbatch ``m`` on stage ``s``; return the stages it made ready."""
        touched = []
        if op == "F":  # activations go to the stages after, gradients to the ones before
            end = start + self.costs.f_ms[s]
            sends, arrived, waiting, ready = self.out_f[s], self.arrive_f, self.wait_f, self.ready_f
        elif op == "W":  # a split backward's weight gradients: nothing to send
            end = start + self.w_ms[s]
            sends = ()
        else:
            end = start + (self.costs.b_ms[s] if op == "B" else self.bi_ms[s])
            sends, arrived, waiting, ready = self.out_b[s], self.arrive_b, self.wait_b, self.ready_b
            if op == "I":
                self.i_end[s][m] = end
        for t, channels, ms in sends:
            arrive = self.send(channels, end, ms)
            row = arrived[t]
            if arrive > row[m]:
                row[m] = arrive
            waits = waiting[t]
            waits[m] -= 1
            if waits[m] == 0:
                ready[t][m] = row[m]
                touched.append(t)
        if op == "F":  # and the stage's own backward of ``m`` waits for this forward
            row = self.arrive_b[s]
            if end > row[m]:
                row[m] = end
            waits = self.wait_b[s]
            waits[m] -= 1
            if waits[m] == 0:
                self.ready_b[s][m] = row[m]
        self.free[s] = end
        self.done[s] += 1
        if self.done[s] == self.tasks[s]:
            for dst, channels, ms in self.exchange_sends.get(s, ()):
                self.received[dst] = max(self.received[dst], self.send(channels, end, ms))
        return touched

    def makespan(self) -> float:
        ready = list(self.free)
        for stages, ms in self.costs.ties:
            end = max(self.free[s] for s in stages) + ms
            for s in stages:
                ready[s] = max(ready[s], end)
        for s in self.exchange_sends:
            ready[s] = max(ready[s], self.received[s])
        return max(r + sync for r, sync in zip(ready, self.costs.sync_ms))

    def fixed(self, schedule: Schedule, label: str) -> Timed:
        """Time a fixed per-stage order, tasks started in global time order (transfers
        queue on shared links in the order they are sent)."""
        S = self.S
        pos = [0] * S
        orders = schedule.orders
        self.tasks = [len(order) for order in orders]
        version = [0] * S
        heap: list[tuple] = []

        ready_f, ready_b, free = self.ready_f, self.ready_b, self.free

        def push(s: int) -> None:
            version[s] += 1
            if pos[s] < len(orders[s]):
                a = orders[s][pos[s]]
                if a.op == "W":
                    r = self.i_end[s][a.microbatch]  # (its I runs earlier in the order)
                else:
                    r = (ready_f if a.op == "F" else ready_b)[s][a.microbatch]
                if r >= 0:
                    heappush(heap, (r if r > free[s] else free[s], s, version[s]))

        for s in range(S):
            push(s)
        done = 0
        while heap:
            start, s, v = heappop(heap)
            if v != version[s]:
                continue
            a = orders[s][pos[s]]
            touched = self.complete(s, a.op, a.microbatch, start)
            pos[s] += 1
            done += 1
            push(s)
            for t in touched:
                if t != s:
                    push(t)
        if done < sum(self.tasks):
            raise ValueError("the schedule deadlocks")
        return Timed(self.makespan(), schedule, label)

    def list_schedule(self, cap: list[int], backward_first: bool, label: str,
                      split: Sequence[bool] = ()) -> Timed:
        """Non-delay list scheduling in global time order (see the module docstring).

        Each stage's next choice (earliest start, then priority) sits in a heap and is
        recomputed only when the stage finishes a task or receives an input. A stage
        flagged in ``split`` runs I and W for its backward (``run``).
        """
        S, M = self.S, self.M
        split = tuple(split) or (False,) * S
        nf, nb, nw = [0] * S, [0] * S, [0] * S  # (nw: the backwards whose W has run)
        orders: list[list[Action]] = [[] for _ in range(S)]
        version = [0] * S
        heap: list[tuple] = []
        ready_f, ready_b, free, i_end = self.ready_f, self.ready_b, self.free, self.i_end
        f_rank, b_rank = (1, 0) if backward_first else (0, 1)
        back = ["I" if x else "B" for x in split]
        self.tasks = [3 * M if x else 2 * M for x in split]
        table = actions(S, M, "FBIW")
        acts = dict(zip("FBIW", table))

        def push(s: int) -> None:
            version[s] += 1
            at = free[s]
            f, b, w = nf[s], nb[s], nw[s]
            start = -1.0  # none yet (every start is >= 0)
            if f < M and f - w < cap[s]:
                r = ready_f[s][f]
                if r >= 0:
                    start, rank, op = (r if r > at else at), f_rank, "F"
            if b < f:
                r = ready_b[s][b]
                if r >= 0:
                    t = r if r > at else at
                    if start < 0 or t < start or (t == start and b_rank < rank):
                        start, rank, op = t, b_rank, back[s]
            if w < b and split[s]:  # a W only where nothing else could start as early
                r = i_end[s][w]
                t = r if r > at else at
                if start < 0 or t < start:
                    start, rank, op = t, 2, "W"
            if start >= 0:
                heappush(heap, (start, s, rank, op, version[s]))

        for s in range(S):
            push(s)
        total, done = sum(self.tasks), 0
        while done < total:
            while heap and heap[0][4] != version[heap[0][1]]:
                heappop(heap)
            if not heap:
                raise ValueError("the schedule deadlocks")
            start, s, _, op, _ = heappop(heap)
            if op == "F":
                m = nf[s]
                nf[s] += 1
            elif op == "W":
                m = nw[s]
                nw[s] += 1
            else:
                m = nb[s]
                nb[s] += 1
                if op == "B":
                    nw[s] += 1
            touched = self.complete(s, op, m, start)
            orders[s].append(acts[op][s][m])
            done += 1
            push(s)
            for t in touched:
                if t != s:
                    push(t)
        schedule = Schedule(microbatches=M, orders=tuple(tuple(o) for o in orders))
        return Timed(self.makespan(), schedule, label)


def flush_estimate_ms(costs: StageCosts) -> float:
    """Closed-form estimate of a flushed pipeline, for screening layouts (O(stages)).

    ``sum over stages (f + b + 2 c) + (m - 1) x bottleneck + the largest sync``, where the
    bottleneck is the slowest stage or link per microbatch (a link's time summed over
    every transfer crossing it): exact for equal stages and free links, close for the
    layouts the DP produces.
    """
    S, M = costs.stages, costs.microbatches
    chain = sum(costs.f_ms) + sum(costs.b_ms) + 2 * sum(costs.send_ms.values())
    busy: dict = defaultdict(float)  # per microbatch, on every channel
    for (s, t), ms in costs.send_ms.items():
        for direction in "FB":
            for k in costs.channels(s, t, direction):
                busy[k] += ms
    bottleneck = max(max(f + b for f, b in zip(costs.f_ms, costs.b_ms)),
                     max(busy.values(), default=0.0))
    tail = list(costs.sync_ms)
    for stages, ms in costs.ties:
        for s in stages:
            tail[s] += ms
    for _, sharer, _, _, rows, _ in costs.exchanges:  # (the dense one goes during the drain)
        tail[sharer] += rows
    return chain + (M - 1) * bottleneck + max(tail, default=0.0) if S else 0.0


def round_trip_caps(costs: StageCosts) -> list[int]:
    """Per stage: microbatches in flight that hide the downstream round trip (>= 1F1B's)."""
    S = costs.stages
    caps = []
    for s in range(S):
        trip = 0.0
        for t in range(s + 1, S):
            trip += costs.f_ms[t] + costs.b_ms[t] + 2 * costs.send_ms.get((t - 1, t), 0.0)
        per = costs.f_ms[s] + costs.b_ms[s]
        need = S - s if per <= 0 else max(S - s, math.ceil(trip / per) + 1)
        caps.append(min(need, costs.microbatches))
    return caps


def auto_schedule(costs: StageCosts, allowed: Sequence[Policy] = tuple(Policy)) -> Timed:
    """The fastest of GPipe, 1F1B and list-scheduled variants that fit the memory caps.

    Ties go to the schedule with fewer microbatches in flight. Deterministic.
    """
    return schedule_options(costs, allowed)[0]


def schedule_options(costs: StageCosts, allowed: Sequence[Policy] = tuple(Policy), *,
                     wide: bool = False) -> list[Timed]:
    """GPipe, 1F1B and the list-scheduled variants that fit the memory caps, fastest first
    (ties: fewer microbatches in flight), distinct schedules only.

    ``wide`` also builds the list variants as if every stage pair had links of its own
    (the orders differ where pairs share a link), each then timed on the shared links:
    more candidates for a caller that compares them on the simulator.
    """
    options: list[Timed] = []
    fits_all = all(c >= costs.microbatches for c in costs.caps)
    fits_1f1b = all(c >= min(costs.stages - s, costs.microbatches) for s, c in enumerate(costs.caps))
    if Policy.GPIPE in allowed and fits_all:
        options.append(run(costs, Policy.GPIPE))
    if Policy.ONE_F_ONE_B in allowed and fits_1f1b:
        options.append(run(costs, Policy.ONE_F_ONE_B))
    if Policy.LIST in allowed:
        trip = round_trip_caps(costs)
        seen = set()
        for caps in (trip, list(costs.caps)):
            for bf in (False, True):
                key = (tuple(min(c, k) for c, k in zip(caps, costs.caps)), bf)
                if key in seen:
                    continue
                seen.add(key)
                options.append(run(costs, Policy.LIST, caps=caps, backward_first=bf))
                if wide and costs.links:
                    built = run(replace(costs, links={}), Policy.LIST, caps=caps, backward_first=bf)
                    options.append(_Sim(costs).fixed(built.schedule, built.label))
        if any(costs.splittable()):  # split backwards, I first, within the memory caps
            options.append(run(costs, Policy.LIST, backward_first=True, split=True))
            if wide and costs.links:
                built = run(replace(costs, links={}), Policy.LIST, backward_first=True, split=True)
                options.append(_Sim(costs).fixed(built.schedule, built.label))
    if not options:
        raise ValueError("no schedule fits the memory of every stage")
    options.sort(key=lambda t: (round(t.makespan_ms, 9), sum(t.schedule.max_in_flight())))
    seen_orders: set = set()
    distinct = []
    for t in options:
        if t.schedule.orders not in seen_orders:
            seen_orders.add(t.schedule.orders)
            distinct.append(t)
    return distinct
