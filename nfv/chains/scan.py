"""Segments of a flow-sorted batch, and the segmented scan that runs a state machine.

A batch is sorted by flow key, then by arrival (two stable sorts), so each flow's
packets form one *segment* in arrival order. ``Segments`` numbers them and
places every packet in its segment.

``fsm_scan`` runs a per-flow state machine over every segment at once, the way
GPUNFV's kernel gives each flow a thread that walks its packets: round ``r``
takes the ``r``-th packet of every flow (one vector operation over all flows),
looks up the state its flow is in, applies the time-out (a state whose idle
time-out is shorter than the gap to the flow's previous packet counts as NONE)
and the machine's table for the packet's class, and writes the flow's new state.
Packets of one flow are applied in arrival order and flows are independent, so
this is exactly the packet-by-packet result for any interleaving of flows.

Complexity: O(n) work in L rounds, L the longest segment. (The associative form,
a Hillis–Steele scan over the packets' transition functions, needs O(n W log L)
work with W the number of states; its [n, W] gathers measured slower on a CPU.)

Monitor counters are plain segmented sums (``index_add_`` over segment ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Segments:
    """Packets of a flow-sorted batch grouped by flow."""

    index: object  # [n] segment of each packet, 0..count-1
    first: object  # [count] position of each segment's first packet
    last: object  # [count] position of its last packet
    pos: object  # [n] position of the packet within its segment
    longest: int
    cached_order: tuple | None = None

    @property
    def count(self) -> int:
        return int(self.first.shape[0])

    def round_order(self) -> tuple:
        """(positions sorted by place in their flow, packets per place), computed once."""
        if self.cached_order is None:
            order = torch.sort(self.pos, stable=True).indices
            counts = torch.bincount(self.pos).tolist() if self.pos.numel() else []
            self.cached_order = (order, counts)
        return self.cached_order

    def rounds(self):
        """Packet positions by their place in their flow: round ``r`` holds every flow's
        ``r``-th packet (one per flow), rounds in order (computed once per segmentation)."""
        order, counts = self.round_order()
        return list(torch.split(order, counts)) if counts else []

    @classmethod
    def of(cls, k1, k2) -> Segments:
        n = k1.shape[0]
        start = torch.ones(n, dtype=torch.bool, device=k1.device)
        if n > 1:
            start[1:] = (k1[1:] != k1[:-1]) | (k2[1:] != k2[:-1])
        index = torch.cumsum(start.long(), 0) - 1
        first = torch.nonzero(start).squeeze(1)
        last = torch.empty_like(first)
        if first.numel():
            last[:-1] = first[1:] - 1
            last[-1] = n - 1
        pos = torch.arange(n, device=k1.device) - first[index]
        longest = int((last - first).max()) + 1 if first.numel() else 0
        return cls(index=index, first=first, last=last, pos=pos, longest=longest)


def previous_gap(ts, seg: Segments, last_seen, existed):
    """Gap to the flow's previous packet (the table's last-seen time for a segment's first
    packet of a known flow; 0 for a new one)."""
    gap = torch.zeros_like(ts)
    inner = seg.pos > 0
    idx = torch.nonzero(inner).squeeze(1)
    gap[idx] = ts[idx] - ts[idx - 1]
    head = seg.first
    gap[head] = torch.where(existed, ts[head] - last_seen, torch.zeros_like(last_seen))
    return gap


def fsm_scan(next_table, timeouts, cls, gap, seg: Segments, s0):
    """Run the machine ``next_table`` ([classes, W]) over the segments from states ``s0``.

    Returns (state each packet finds after time-outs, state after each packet,
    whether the packet found its flow timed out)."""
    width = next_table.shape[1]
    flat = next_table.reshape(-1)
    order, sizes = seg.round_order()
    # per round, contiguous slices of these (views): no gathers inside the loop
    flows = torch.split(seg.index[order], sizes)
    gaps = torch.split(gap[order], sizes)
    rows = torch.split(cls[order] * width, sizes)
    found_r = torch.empty_like(order)
    after_r = torch.empty_like(order)
    found_parts = torch.split(found_r, sizes)
    after_parts = torch.split(after_r, sizes)
    cur = s0.clone()
    for at, g, base, found_out, after_out in zip(flows, gaps, rows, found_parts, after_parts):
        state = cur[at]
        found_out.copy_(state)
        state = torch.where(g > timeouts[state], 0, state)
        nxt = flat[base + state]
        after_out.copy_(nxt)
        cur[at] = nxt
    found = torch.empty_like(found_r)
    after = torch.empty_like(after_r)
    found[order] = found_r
    after[order] = after_r
    timed_out = (found != 0) & (gap > timeouts[found])
    found_eff = torch.where(timed_out, torch.zeros_like(found), found)
    return found_eff, after, timed_out


def last_marked(mask, seg: Segments):
    """For each packet, the position of the latest marked packet at or before it in its
    segment, or -1."""
    n = mask.shape[0]
    marks = torch.where(mask, torch.arange(n, device=mask.device),
                        torch.full((n,), -1, dtype=torch.int64, device=mask.device))
    latest = torch.cummax(marks, 0).values if n else marks
    return torch.where(latest >= seg.first[seg.index], latest, torch.full_like(latest, -1))
