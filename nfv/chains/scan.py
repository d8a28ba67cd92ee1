"""Segments of a flow-sorted batch, and the segmented scan that runs a state machine.

A batch is sorted by flow, then by arrival (``engine._flow_order``), so each flow's
packets form one *segment* in arrival order. ``Segments`` numbers them and
places every packet in its segment.

``fsm_scan`` runs a per-flow state machine over every segment at once. The
state a packet finds is the one left by its flow's previous packet (after the
time-out: a state whose idle time-out is shorter than the gap to the flow's
previous packet counts as NONE), by one of two methods. By rounds, GPUNFV's
thread per flow walking its packets (``Segments.rounds``): round ``r`` steps the
``r``-th packet of every flow, one vector operation over all flows (also how the
rate limiter's token bucket runs). To a fixed point over state changes: most
packets leave the state as it was, so whole-batch passes propagate only the
changes (``scan_to_fixed_point``); the pass count does not grow with flow length.
Packets of one flow are applied in arrival order and flows are independent, so
both are exactly the packet-by-packet result for any interleaving of flows.

Complexity: rounds take O(n) work in L vector steps, L the longest segment, each
over one packet per flow; the fixed point takes O(n) work per pass and C + 1
passes, C the most
state changes in one flow (a TCP flow's handshake and teardown: about 6, however
many packets it carries). (The associative form, a Hillis–Steele scan over the
packets' transition functions, needs O(n W log L) work with W the number of states;
its [n, W] gathers measured slower on a CPU.)

Monitor counters are plain segmented sums (``index_add_`` over segment ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .ops import on_host, put, put_columns, stable_order, take, take_columns

ROUND_STEPS_PER_PASS = 12  # rounds while the longest segment is under this per 8k packets


@dataclass(slots=True)
class Segments:
    """Packets of a flow-sorted batch grouped by flow."""

    index: object  # [n] segment of each packet, 0..count-1
    first: object  # [count] position of each segment's first packet
    last: object  # [count] position of its last packet
    cached_pos: object = None
    cached_order: tuple | None = None
    cached_ends: tuple | None = None  # (mask, ends_of(mask))
    cached_lengths: object = None  # numpy's, on a CPU (``spread``)

    @property
    def count(self) -> int:
        return int(self.first.shape[0])

    @property
    def pos(self):
        """[n] position of each packet within its segment (computed once, when asked)."""
        if self.cached_pos is None and on_host(self.index):
            index = self.index.numpy()
            self.cached_pos = torch.from_numpy(np.arange(index.shape[0])
                                               - self.first.numpy()[index])
        elif self.cached_pos is None:
            self.cached_pos = torch.arange(self.index.shape[0], device=self.index.device) \
                - take(self.first, self.index)
        return self.cached_pos

    @property
    def longest(self) -> int:
        """The most packets in one segment."""
        return int((self.last - self.first).max()) + 1 if self.first.numel() else 0

    def spread(self, values):
        """``values`` per segment ([rows, count]) for every packet ([rows, n]): a gather by
        ``index``; on a CPU numpy's repeat by the segments' lengths (they are contiguous
        runs), which moves the same values without reading an index per packet."""
        numpy = isinstance(values, np.ndarray)  # numpy's in, numpy's out
        if numpy or on_host(values):
            if self.cached_lengths is None:  # by numpy: torch's steps cost more on a few hundred
                self.cached_lengths = self.last.numpy() - self.first.numpy() + 1
            got = np.repeat(values if numpy else values.numpy(), self.cached_lengths, axis=1)
            return got if numpy else torch.from_numpy(got)
        return take_columns(values, self.index)

    def ends_of(self, mask):
        """Per segment, the positions of its first and last packets marked in ``mask`` (n and
        -1 where none is): segmented minima and maxima (numpy's reduce over the contiguous
        runs on a CPU)."""
        if self.cached_ends is None or self.cached_ends[0] is not mask:
            self.cached_ends = (mask, self._ends_of(mask))
        return self.cached_ends[1]

    def _ends_of(self, mask):
        n = int(mask.shape[0])
        if on_host(mask) and n:
            m, first, last = mask.numpy(), self.first.numpy(), self.last.numpy()
            marked = np.add.reduceat(m.view(np.uint8), first, dtype=np.int64)
            if ((marked == 0) | (marked == last - first + 1)).all():  # each all or none
                return (torch.from_numpy(np.where(marked > 0, first, n)),
                        torch.from_numpy(np.where(marked > 0, last, -1)))
            pos = np.arange(n)
            return (torch.from_numpy(np.minimum.reduceat(np.where(m, pos, n), first)),
                    torch.from_numpy(np.maximum.reduceat(np.where(m, pos, -1), first)))
        pos = torch.arange(n, device=mask.device)
        ends = torch.stack([torch.full((self.count,), n, device=mask.device),
                            torch.full((self.count,), -1, device=mask.device)])
        return (ends[0].scatter_reduce_(0, self.index, torch.where(mask, pos, n), "amin"),
                ends[1].scatter_reduce_(0, self.index, torch.where(mask, pos, -1), "amax"))

    def round_order(self) -> tuple:
        """(positions sorted by place in their flow, packets per place), computed once."""
        if self.cached_order is None:
            order = stable_order(self.pos, max(int(self.pos.shape[0]), 1))
            counts = torch.bincount(self.pos).tolist() if self.pos.numel() else []
            self.cached_order = (order, counts)
        return self.cached_order

    def rounds(self):
        """Packet positions by their place in their flow: round ``r`` holds every flow's
        ``r``-th packet (one per flow), rounds in order (computed once per segmentation)."""
        order, counts = self.round_order()
        return list(torch.split(order, counts)) if counts else []

    @classmethod
    def of(cls, k1, k2=None) -> Segments:
        """The runs of equal keys (``k1``, or the pairs ``k1``, ``k2``) of a sorted batch."""
        n = k1.shape[0]
        start = torch.ones(n, dtype=torch.bool, device=k1.device)
        if n > 1:
            start[1:] = k1[1:] != k1[:-1]
            if k2 is not None:
                start[1:] |= k2[1:] != k2[:-1]
        return cls.starting(start)

    @classmethod
    def starting(cls, start) -> Segments:
        """The segments whose first packets are marked in ``start`` (``start[0]`` set)."""
        n = start.shape[0]
        index = torch.cumsum(start, 0, dtype=torch.int64) - 1
        first = torch.nonzero(start).squeeze(1)
        last = torch.cat([first[1:], first.new_full((1,), n)]) - 1 if n else first
        return cls(index=index, first=first, last=last)


def previous_gap(ts, seg: Segments, last_seen, existed):
    """Gap to the flow's previous packet (the table's last-seen time for a segment's first
    packet of a known flow; 0 for a new one)."""
    gap = torch.empty_like(ts)
    if ts.shape[0]:
        gap[0] = 0
        gap[1:] = ts[1:] - ts[:-1]  # the previous packet of the flow, except at heads
    head = seg.first
    put(gap, head, (take(ts, head) - last_seen) * existed)
    return gap


def quiet_rows(next_table, data_rows):
    """Rows of ``next_table`` that keep every state the ``data_rows`` keep (for TCP: a
    plain ACK keeps every state but the half-open one and NONE): packets of such rows
    seldom change their flow's state."""
    width = next_table.shape[1]
    states = torch.arange(width, device=next_table.device)
    kept = (next_table == states).all(0) if not data_rows else \
        (next_table[data_rows] == states).all(0)
    return ((next_table == states) | ~kept).all(1)


def fragile_states(next_table, quiet):
    """Per state, whether some ``quiet`` row of ``next_table`` changes it: a packet of a quiet
    row can leave its flow's state only from one of these (for TCP the half-open one)."""
    states = torch.arange(next_table.shape[1], device=next_table.device)
    return ((next_table != states) & quiet.unsqueeze(1)).any(0)


def fsm_scan(next_table, timeouts, cls, gap, seg: Segments, s0, quiet=None, fragile=None):
    """Run the machine ``next_table`` ([classes, W]) over the segments from states ``s0``.

    Returns (state each packet finds after time-outs, state after each packet,
    whether the packet found its flow timed out). ``gap`` None: no packet can find its
    flow timed out (the caller has checked), and ``timeouts`` is not read.

    Only the packets that may change their flow's state are stepped (``candidates``):
    each flow's first packet, packets whose gap could pass a time-out and packets of
    rows not ``quiet``. Every other packet finds the state its flow's latest candidate
    left, one vectorised pass. That holds if each of them keeps the state it finds; the
    ones that do not (a plain ACK finding a half-open TCP flow) join the candidates and
    the candidates are stepped again, until none is left: the first such packet of each
    flow is right after one more step, so this ends, and then every packet's state is
    exactly the packet-by-packet one. The candidates are stepped by the cheaper of
    rounds and the fixed point (``_step``). ``fragile`` (``fragile_states`` of ``quiet``;
    on a CPU) narrows that check to the packets left in a state a quiet row changes."""
    n = int(cls.shape[0])
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=cls.device)
        return empty, empty, empty.bool()
    if on_host(cls):  # the same steps by numpy (``ops.HOST``)
        return _fsm_scan_on_host(next_table, timeouts, cls, gap, seg, s0, quiet, fragile)
    flat = next_table.reshape(-1)
    base = cls * next_table.shape[1]
    start = torch.zeros(n, dtype=torch.bool, device=cls.device).index_fill_(0, seg.first, True)
    lapse = None
    if quiet is None:
        cand = torch.ones_like(start)
    else:
        moves = ~take(quiet, cls)
        cand = start | moves
        if gap is not None:  # only these packets may find their flow timed out
            lapse = gap > timeouts[1:].min()
            cand |= lapse
        cand[1:] |= moves[:-1]  # e.g. the ACK after a SYN+ACK
    # no packet may find its flow timed out: the steps skip the time-out check
    limits = None if gap is None else \
        timeouts if lapse is None or bool(lapse.any()) else None
    while True:
        rows = torch.nonzero(cand).squeeze(1)
        if rows.numel() == n:
            found, after = _step(next_table, limits, cls, gap, seg, s0)
            break
        sub = Segments.starting(start[rows])  # every flow's first packet is a candidate
        c_found, c_after = _step(next_table, limits, take(cls, rows),
                                 None if gap is None else take(gap, rows), sub, s0)
        rank = torch.cumsum(cand, 0) - 1  # the latest candidate at or before each packet
        after = take(c_after, rank)
        found = after.clone()
        put(found, rows, c_found)
        wrong = ~cand & (take(flat, base + after) != after)
        if not bool(wrong.any()):
            break
        cand |= wrong
    if limits is None:
        return found, after, torch.zeros_like(start)
    timed_out = (found != 0) & (gap > take(timeouts, found))
    return found * ~timed_out, after, timed_out


def _step(next_table, timeouts, cls, gap, seg: Segments, s0):
    """(found, after) by rounds or the fixed point, whichever a cost estimate says is
    cheaper: rounds cost a few small vector steps per packet of the longest segment, a
    fixed-point pass a dozen steps over the whole batch (about six passes for TCP
    flows), and a step's fixed cost is worth about 8k packets of work on one core."""
    n = int(cls.shape[0])
    if seg.longest <= ROUND_STEPS_PER_PASS * (1 + n // 8192):
        return scan_by_rounds(next_table, timeouts, cls, gap, seg, s0)
    return scan_to_fixed_point(next_table, timeouts, cls, gap, seg, s0)


def scan_by_rounds(next_table, timeouts, cls, gap, seg: Segments, s0):
    """(found, after) by rounds: round ``r`` steps every flow's ``r``-th packet
    (``timeouts`` None: no packet can find its flow timed out)."""
    width = next_table.shape[1]
    flat = next_table.reshape(-1)
    order, sizes = seg.round_order()
    if order.device.type == "cpu":
        return _rounds_on_host(flat, timeouts, cls * width, gap, seg, s0, order, sizes)
    # per round, contiguous slices of these (views): no gathers inside the loop
    flows = torch.split(take(seg.index, order), sizes)
    gaps = torch.split(take(gap, order), sizes) if timeouts is not None else [None] * len(sizes)
    rows = torch.split(take(cls, order) * width, sizes)
    by_round = torch.empty((2, order.shape[0]), dtype=order.dtype, device=order.device)
    found_parts = torch.split(by_round[0], sizes)
    after_parts = torch.split(by_round[1], sizes)
    cur = s0.clone()
    for at, g, base, found_out, after_out in zip(flows, gaps, rows, found_parts, after_parts):
        state = torch.index_select(cur, 0, at, out=found_out)
        if timeouts is not None:
            state = state * (g <= take(timeouts, state))
        put(cur, at, torch.index_select(flat, 0, base + state, out=after_out))
    back = torch.empty_like(by_round)
    put_columns(back, order, by_round)
    return back[0], back[1]


def _rounds_on_host(flat, timeouts, base, gap, seg: Segments, s0, order, sizes):
    """``scan_by_rounds``' loop on a CPU by numpy over the tensors' memory: a round's steps
    are vectors of one packet per flow (a few hundred), where numpy's cost per call is a
    fraction of torch's; the same gathers and scatters in the same order."""
    found, after = _rounds_np(flat.numpy(), None if timeouts is None else timeouts.numpy(),
                              base.numpy(), None if timeouts is None else gap.numpy(),
                              seg.index.numpy(), s0.numpy(), order.numpy(), sizes)
    return torch.from_numpy(found), torch.from_numpy(after)


def _rounds_np(flat, limit, base, gaps, index, s0, order, sizes):
    """(found, after) by rounds over numpy arrays (``limit`` None: no time-out check):
    ``order`` the positions by their place in their flow, ``sizes`` the rounds' lengths."""
    flows, rows = index.take(order), base.take(order)
    gaps = gaps.take(order) if limit is not None else None
    found_all = np.empty(order.shape[0], dtype=np.int64)
    after_all = np.empty(order.shape[0], dtype=np.int64)
    cur = s0.copy()
    end = 0
    for size in sizes:
        begin, end = end, end + size
        at, found = flows[begin:end], found_all[begin:end]
        cur.take(at, out=found)
        state = found if limit is None else found * (gaps[begin:end] <= limit[found])
        after = after_all[begin:end]
        flat.take(rows[begin:end] + state, out=after)
        cur[at] = after
    found_back = np.empty_like(found_all)
    after_back = np.empty_like(after_all)
    found_back[order] = found_all
    after_back[order] = after_all
    return found_back, after_back


def _fsm_scan_on_host(next_table, timeouts, cls, gap, seg: Segments, s0, quiet, fragile):
    """``fsm_scan`` by numpy over the tensors' memory (CPU): the same candidates, steps and
    checks, in the same order, so the same result."""
    width = next_table.shape[1]
    flat = next_table.numpy().reshape(-1)
    cls = cls.numpy()
    n = cls.shape[0]
    g = None if gap is None else gap.numpy()
    start = np.zeros(n, dtype=bool)
    start[seg.first.numpy()] = True
    lapse = None
    if quiet is None:
        cand = np.ones(n, dtype=bool)
    else:
        moves = ~quiet.numpy().take(cls)
        cand = start | moves
        if g is not None:  # only these packets may find their flow timed out
            lapse = g > timeouts.numpy()[1:].min()
            cand |= lapse
        cand[1:] |= moves[:-1]  # e.g. the ACK after a SYN+ACK
    limits = None if g is None else \
        timeouts.numpy() if lapse is None or lapse.any() else None
    s0 = s0.numpy()
    fragile = None if fragile is None else fragile.numpy()
    while True:
        rows = cand.nonzero()[0]
        if rows.shape[0] == n:
            found, after = _step_np(next_table, flat, limits, cls * width, g, start, s0)
            break
        c_found, c_after = _step_np(next_table, flat, limits, cls.take(rows) * width,
                                    None if g is None else g.take(rows), start.take(rows), s0)
        rank = np.cumsum(cand) - 1  # the latest candidate at or before each packet
        after = c_after.take(rank)
        found = after.copy()
        found[rows] = c_found
        if fragile is None:
            wrong = (~cand & (flat.take(cls * width + after) != after)).nonzero()[0]
        else:  # the packets not stepped that are left in a fragile state (``a > b``: a, not b)
            maybe = (fragile.take(after) > cand).nonzero()[0]
            state = after.take(maybe)
            wrong = maybe[flat.take(cls.take(maybe) * width + state) != state]
        if not wrong.shape[0]:
            break
        cand[wrong] = True
    if limits is None:
        return (torch.from_numpy(found), torch.from_numpy(after),
                torch.from_numpy(np.zeros(n, dtype=bool)))
    timed_out = (found != 0) & (g > limits[found])
    return (torch.from_numpy(found * ~timed_out), torch.from_numpy(after),
            torch.from_numpy(timed_out))


def _step_np(next_table, flat, limits, base, gap, start, s0):
    """``_step`` over numpy arrays: segments marked by ``start``; the fixed point (seldom
    the cheaper on a CPU) by its torch form over the same memory."""
    n = base.shape[0]
    index = np.cumsum(start) - 1
    first = start.nonzero()[0]
    pos = np.arange(n) - first.take(index)
    if int(pos.max()) + 1 <= ROUND_STEPS_PER_PASS * (1 + n // 8192):
        shift = max(n - 1, 1).bit_length()
        order = np.sort((pos << shift) | np.arange(n)) & ((1 << shift) - 1)
        return _rounds_np(flat, limits, base, gap, index, s0, order,
                          np.bincount(pos).tolist())
    seg = Segments.starting(torch.from_numpy(start))
    found, after = scan_to_fixed_point(
        next_table, None if limits is None else torch.from_numpy(limits),
        torch.from_numpy(base // next_table.shape[1]),
        None if gap is None else torch.from_numpy(gap), seg, torch.from_numpy(s0))
    return found.numpy(), after.numpy()


def scan_to_fixed_point(next_table, timeouts, cls, gap, seg: Segments, s0):
    """(found, after) by passes over state changes.

    A packet finds the state left by the latest packet before it in
    its flow that *changed* the state (``s0`` if none). Starting from every packet
    finding ``s0``, each pass applies every packet's step to the state it is given,
    marks the changes and gives every packet the result of the latest change before it
    (a running maximum of change positions). A pass makes every packet up to and
    including the first wrong one in each flow right, so passes stop, at the exact
    packet-by-packet result, after (most state changes in one flow) + 1 passes, at most
    the longest segment; each pass is O(n) vector work. ``timeouts`` None: no packet can
    find its flow timed out."""
    n = cls.shape[0]
    width = next_table.shape[1]
    flat = next_table.reshape(-1)
    base = cls * width
    head_state = s0[seg.index]
    start = seg.first[seg.index]
    idx = torch.arange(n, device=cls.device)
    found = head_state
    marks = torch.empty_like(idx)
    while True:
        if timeouts is None:
            after = take(flat, base + found)
        else:
            after = take(flat, base + found * (gap <= take(timeouts, found)))
        changed = after != found
        marks[:1] = -1
        if n > 1:
            marks[1:] = torch.where(changed[:-1], idx[:-1], -1)
        latest = torch.cummax(marks, 0).values if n else marks
        inside = latest >= start
        nxt = torch.where(inside, after[torch.clamp(latest, min=0)], head_state)
        if torch.equal(nxt, found):
            break
        found = nxt
    return found, after


def last_marked(mask, seg: Segments):
    """For each packet, the position of the latest marked packet at or before it in its
    segment, or -1 (tensors, or numpy arrays)."""
    n = mask.shape[0]
    if isinstance(mask, np.ndarray):
        latest = np.maximum.accumulate(np.where(mask, np.arange(n), -1)) if n else \
            np.zeros(0, dtype=np.int64)
        return np.where(latest >= seg.first.numpy()[seg.index.numpy()], latest, -1)
    marks = torch.where(mask, torch.arange(n, device=mask.device),
                        torch.full((n,), -1, dtype=torch.int64, device=mask.device))
    latest = torch.cummax(marks, 0).values if n else marks
    return torch.where(latest >= seg.first[seg.index], latest, torch.full_like(latest, -1))
