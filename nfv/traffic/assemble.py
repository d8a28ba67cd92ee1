"""Packets to flows to messages over columns: the flow table's array front end.

``assemble(cols, ...)`` groups the decoded packets of a ``PacketColumns`` into
flows and messages with the meaning of ``flows.FlowTable`` (which stays the
one flow table: every flow this module cannot prove clean goes through it,
packet by packet). For clean flows Python runs per flow and per message; its
only per-packet work is slicing each segment's payload for one ``bytes.join``:

1. **Keys** (``keys.py``): each packet's endpoints are read from the buffer as two 64-bit
   words per address; the 5-tuple, ordered so both directions agree, is
   grouped with one ``np.unique`` and the packets of a key ordered with one
   stable sort.
2. **Clean flows**, decided per key with array reductions: TCP; the first
   packet a SYN without ACK and each direction's first packet its only SYN;
   no RST; timestamps that never go back or pause longer than the idle
   timeout; every data segment starting exactly where the previous one of its
   direction ended (no retransmission, overlap, reordering or hole, so
   ``reassembly.Stream`` would deliver each segment whole, as it arrives);
   FINs at the end of their direction's data; nothing but empty, SYN-less
   packets after both directions completed; the client speaks first and
   starts with an HTTP request. These are the flows whose messages follow
   from the in-order streams alone.
3. **Messages** of a clean flow: each direction's stream is the
   concatenation of its segments; ``http.frame_whole`` frames it in one pass
   (the same framer the flow table uses). A message completes at the packet
   holding its last byte (found with ``np.searchsorted`` over the segments'
   end offsets), which gives its timestamp and its place in the trace's
   completion order; a close-delimited body completes when the flow does.
   Framing that would differ when fed packet by packet (a framing error, a
   header over ``MAX_HEADER_BYTES``, a chunk-size line over 1,023 bytes, a
   response whose request was not framed before it in capture order) sends
   the flow to the flow table instead.
4. **The rest** (UDP, non-HTTP TCP, reordered or retransmitted segments,
   re-used 5-tuples, resets, idle gaps) is fed to a ``FlowTable`` in capture
   order; its flows and messages are merged by the packet that created or
   completed them.

The result equals ``FlowTable`` fed every packet (flows, their ids and
counters, messages, their order, timestamps and packet counts, TCP and HTTP
statistics); the tests compare the two on real, generated and shuffled
traces. O(packets log packets + payload bytes).
"""

from __future__ import annotations

import mmap
from array import array
from collections import Counter, deque
from dataclasses import dataclass
from itertools import chain

import numpy as np

from .capture import release_freed, release_pages
from .columnar import OK, PacketColumns, http_starts
from .flows import FlowState, FlowTable, Message
from .http import REQUEST, RESPONSE, frame_whole
from .keys import key_table, row_hash
from .pcap import ACK, FIN, RST, SYN, TCP

SEQ_MOD = 1 << 32
RELEASE_STEP = 2 << 20  # capture bytes copied between two releases of its pages
GATHER_STEP = 8192  # segments copied per step (their offsets as Python ints)


@dataclass(slots=True)
class MessageColumns:
    """Messages as columns; message ``i``'s bytes are ``buffer[start[i]:start[i] + length[i]]``."""

    flow: np.ndarray  # int64, every column
    direction: np.ndarray
    start: np.ndarray
    length: np.ndarray
    header_len: np.ndarray
    kind: np.ndarray
    ts_us: np.ndarray
    packets: np.ndarray
    buffer: bytes

    @classmethod
    def of(cls, messages: list[Message]) -> MessageColumns:
        n = len(messages)

        def column(name: str) -> np.ndarray:
            return np.fromiter((getattr(m, name) for m in messages), dtype=np.int64, count=n)

        length = np.fromiter((len(m.payload) for m in messages), dtype=np.int64, count=n)
        return cls(flow=column("flow"), direction=column("direction"),
                   start=np.cumsum(length) - length, length=length,
                   header_len=column("header_len"), kind=column("kind"), ts_us=column("ts_us"),
                   packets=column("packets"), buffer=b"".join(m.payload for m in messages))

    def __len__(self) -> int:
        return int(self.flow.shape[0])


@dataclass(slots=True)
class Assembled:
    """Flows (ids in creation order) and messages (in completion order), as FlowTable's:
    the messages as columns over one buffer (where each lies in it, in no particular
    order; bytes of no message may lie between them)."""

    flows: list[FlowState]
    columns: MessageColumns
    stats: Counter
    clean_flows: int  # flows assembled by array operations; the rest by the flow table

    @property
    def messages(self) -> list[Message]:
        """The messages as the flow table's ``Message`` records."""
        c = self.columns
        buf = c.buffer
        return [Message(f, d, buf[a:a + n], h, k, t, p) for f, d, a, n, h, k, t, p in zip(
            c.flow.tolist(), c.direction.tolist(), c.start.tolist(), c.length.tolist(),
            c.header_len.tolist(), c.kind.tolist(), c.ts_us.tolist(), c.packets.tolist())]


def assemble(cols: PacketColumns, stats: Counter, *, idle_timeout_us: int = 60_000_000,
             window_bytes: int = 1 << 20, per_packet: bool = False,
             keys: tuple[np.ndarray, ...] | list[np.ndarray] | None = None) -> Assembled:
    """Flows and messages of the decoded packets of ``cols`` (see the module docstring).

    ``per_packet=True`` sends every packet through ``FlowTable`` (the reference).
    ``keys``: ``keys.key_table`` of the decoded rows and its ``keys.row_hash``, where the
    caller has them (as a list: handed over, emptied once the packets are grouped).
    """
    rows = np.flatnonzero(cols.reason == OK)
    if per_packet or len(rows) == 0:
        table = FlowTable(stats, idle_timeout_us=idle_timeout_us, window_bytes=window_bytes)
        for pkt in cols.packets(rows):
            table.add(pkt)
        table.close_all()
        return Assembled(table.flows, MessageColumns.of(table.messages), stats, 0)
    parts, clean_flows = assemble_parts(cols, rows, stats, idle_timeout_us, window_bytes, keys)
    return merge_parts(parts, stats, clean_flows)


def assemble_parts(cols: PacketColumns, rows: np.ndarray, stats: Counter, idle_timeout_us: int,
                   window_bytes: int,
                   keys: tuple[np.ndarray, ...] | list[np.ndarray] | None = None
                   ) -> tuple[list[Part], int]:
    """The parts ``merge_parts`` joins for the packets ``rows`` of ``cols`` (every packet of
    a 5-tuple among them, in capture order), and how many flows were clean. Their packet
    positions (``Part.flow_at``, ``Part.msg_at``) index ``rows``. ``keys``: ``key_table``
    of ``rows`` where the caller has it (and, third, its ``row_hash``; a list is emptied
    once the packets are grouped)."""
    p = _Packets(cols, rows, keys)
    clean, plan = _clean_keys(p, idle_timeout_us)
    part, rejected = _clean_flows(p, plan, clean)
    slow = ~clean | rejected
    parts = [part, *_table_parts(p, slow, stats, idle_timeout_us, window_bytes)]
    release_pages(cols.blob)
    return parts, len(part.flows)


class _Packets:
    """The decoded packets, their 5-tuple keys and their order within each key."""

    def __init__(self, cols: PacketColumns, rows: np.ndarray,
                 keys: tuple[np.ndarray, ...] | list[np.ndarray] | None = None):
        self.cols, self.rows, self.n = cols, rows, len(rows)
        if keys is None:
            keys = key_table(cols, rows)
        elif isinstance(keys, list):  # handed over: emptied, so the table goes once grouped
            keys, handed = tuple(keys), keys
            handed.clear()
        table, src_low, *known = keys
        del keys
        first, inverse = _group_rows(table, *known)
        # number keys by their first packet (the flow table's order of first appearance)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        # per key, its first packet's address length and the endpoints' address words, and
        # whether that packet was sent by the lower endpoint (the key table is let go)
        by_rank = np.empty_like(first)
        by_rank[rank] = first
        self.ends = table[by_rank][:, [1, 2, 3, 5, 6]]
        self.ends_src_low = src_low[by_rank]
        self.key = rank[inverse.ravel()]
        self.n_keys = len(first)
        self.order = np.argsort(self.key, kind="stable")  # packets by key, capture order within
        counts = np.bincount(self.key, minlength=self.n_keys)
        self.bounds = np.zeros(self.n_keys + 1, dtype=np.int64)
        np.cumsum(counts, out=self.bounds[1:])
        self.src_low = src_low

        def take(column: np.ndarray) -> np.ndarray:  # every packet decoded: the column itself
            return column if self.n == len(cols) else column[rows]

        self.proto = take(cols.proto)
        self.flags = take(cols.flags).astype(np.int64)
        self.seq = take(cols.seq).astype(np.int64)  # (modular arithmetic below)
        self.ts = take(cols.ts_us)
        self.size = take(cols.payload_len).astype(np.int64, copy=False)
        self.wire = take(cols.wire_bytes).astype(np.int64, copy=False)


def _group_rows(table: np.ndarray, h: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, return_index=True, return_inverse=True)``'s index and inverse for
    the rows of the uint64 ``table``, (groups numbered in an order of their own): rows are
    grouped by a 64-bit hash (``h``: ``row_hash(table)``, where known) with an integer
    sort, and where two different rows share a hash (checked against each group's first
    row) by the rows themselves."""
    h = row_hash(table) if h is None else h
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if not (table == table[first[inverse]]).all():  # a hash shared by different rows
        keys = np.ascontiguousarray(table).view(np.dtype((np.void, table.shape[1] * 8)))
        _, first, inverse = np.unique(keys.ravel(), return_index=True, return_inverse=True)
    return first, inverse.ravel()


@dataclass(slots=True)
class Part:
    """Flows and messages of one source, with the packet that created / completed each."""

    flows: list[FlowState]
    flow_at: list[int]  # decoded-packet index that created each flow
    messages: MessageColumns  # flows by their ids in ``flows``
    msg_at: np.ndarray  # completion packet; close-at-end messages: n + the key's first packet


@dataclass(slots=True)
class _Plan:
    """Arrays over the packets in key order (``o``) and over the data segments of every
    (key, direction) group in stream order (``seg_*``), shared by the clean-flow steps."""

    o: np.ndarray  # key order -> decoded-packet index
    direction: np.ndarray  # per key-order position
    done: np.ndarray  # per key: key-order position where the flow completes (> n: never)
    seg_pos: np.ndarray  # key-order position of each data segment
    seg_group: np.ndarray  # 2 * key + direction
    seg_end: np.ndarray  # end offset in the concatenation of all streams
    seg_start: np.ndarray
    group_base: np.ndarray  # offset where each group's stream starts
    group_first: np.ndarray  # index of each group's first segment
    group_bytes: np.ndarray


def _clean_keys(p: _Packets, idle_timeout_us: int) -> tuple[np.ndarray, _Plan]:
    """Per key: True when its packets form one clean HTTP flow (see the module docstring)."""
    o = p.order
    key = p.key[o]
    pos = np.arange(p.n)
    first = p.bounds[:-1]
    start = np.zeros(p.n, dtype=bool)
    start[first] = True
    flags, ts, size = p.flags[o], p.ts[o], p.size[o]
    client_low = p.src_low[o][first]
    direction = (p.src_low[o] != client_low[key]).astype(np.int64)
    bad = (p.proto[o] != TCP) | ((flags & RST) != 0)
    bad[first] |= (flags[first] & (SYN | ACK)) != SYN
    gap = np.diff(ts, prepend=ts[:1])
    bad |= ~start & ((gap < 0) | (gap > idle_timeout_us))
    # each (key, direction) group in capture order: g_order maps to key-order positions
    group = key * 2 + direction
    g_order = np.argsort(group, kind="stable")
    g_sorted = group[g_order]
    g_start = np.ones(p.n, dtype=bool)
    g_start[1:] = g_sorted[1:] != g_sorted[:-1]
    syn = (flags & SYN) != 0
    bad[g_order] |= syn[g_order] != g_start  # a SYN first in each direction, and only there
    bad |= syn & (size > 0)
    # contiguity: each data segment starts where the direction's data so far ends
    head = np.maximum.accumulate(np.where(g_start, pos, 0))
    seq = p.seq[o][g_order]
    sz = size[g_order]
    before = np.cumsum(sz) - sz
    before -= before[head]
    offset = (seq - (seq[head] + 1)) % SEQ_MOD
    fin = (flags[g_order] & FIN) != 0
    total = np.bincount(g_sorted, weights=sz, minlength=2 * p.n_keys).astype(np.int64)
    bad[g_order] |= ((sz > 0) & (offset != before)) | (fin & (offset + sz != total[g_sorted]))
    # completion: both directions have their FIN and all their data; then only empty packets
    fin_key = np.empty(p.n, dtype=bool)
    fin_key[g_order] = fin
    first_fin = np.full(2 * p.n_keys, p.n + 1, dtype=np.int64)
    np.minimum.at(first_fin, group, np.where(fin_key, pos, p.n + 1))
    last_data = np.full(2 * p.n_keys, -1, dtype=np.int64)
    np.maximum.at(last_data, group, np.where(size > 0, pos, -1))
    fin_at = np.maximum(first_fin, last_data)
    done = np.maximum(fin_at[0::2], fin_at[1::2])
    bad |= (pos > done[key]) & ((size > 0) | syn)
    # the client speaks first, with an HTTP request
    first_data = np.full(p.n_keys, p.n, dtype=np.int64)
    np.minimum.at(first_data, key, np.where(size > 0, pos, p.n))
    clean = (np.bincount(key, weights=bad, minlength=p.n_keys) == 0) & (first_data < p.n)
    fd = np.minimum(first_data, p.n - 1)
    clean &= direction[fd] == 0
    cols = p.cols
    rows = p.rows[o[fd]]
    # known from decoding where it was done in parts (the mapping is not read again)
    clean[clean] &= (cols.http_start[rows[clean]] if cols.http_start is not None
                     else http_starts(cols, rows[clean]))
    data = sz > 0
    seg_len = sz[data]
    seg_end = np.cumsum(seg_len)
    seg_group = g_sorted[data]
    group_first = np.searchsorted(seg_group, np.arange(2 * p.n_keys), side="left")
    seg_start = seg_end - seg_len
    group_base = np.append(seg_start, seg_end[-1:] if len(seg_end) else [0])[group_first]
    plan = _Plan(o=o, direction=direction, done=done, seg_pos=g_order[data],
                 seg_group=seg_group, seg_end=seg_end, seg_start=seg_start,
                 group_base=group_base, group_first=group_first, group_bytes=total)
    return clean, plan


def _clean_flows(p: _Packets, plan: _Plan, clean: np.ndarray) -> tuple[Part, np.ndarray]:
    """Flows and messages of the clean keys; the keys whose framing must run packet by packet
    after all (returned as a mask)."""
    cols, o = p.cols, plan.o
    candidates = np.flatnonzero(clean)
    # the flow records of every clean key (those framing rejects are dropped after), from
    # the key table's addresses: then the per-packet columns no later step reads are let
    # go, before the streams take their room
    states = _flow_states(p, plan, candidates, _endpoints(p, clean))
    del p.flags, p.wire, p.seq, p.size, p.proto, p.src_low, p.ends, plan.direction
    keep = clean[plan.seg_group // 2]
    # offsets of each clean group's stream within ``streams``
    kept_len = np.bincount(plan.seg_group[keep], weights=plan.seg_end[keep] - plan.seg_start[keep],
                           minlength=len(plan.group_bytes)).astype(np.int64)
    local_base = np.cumsum(kept_len) - kept_len
    streams = _gather(cols, p.rows[o[plan.seg_pos[keep]]])
    del keep, plan.seg_group
    rejected, framed, groups, counts = _frame(streams, candidates, local_base, kept_len,
                                              len(clean))
    if not framed:
        return Part([], [], MessageColumns.of([]), np.zeros(0, dtype=np.int64)), rejected
    table = np.frombuffer(framed, dtype=np.int64).reshape(-1, 4)
    group = np.repeat(np.asarray(groups, dtype=np.int64), counts)
    key, d = group // 2, group % 2
    start, length, header = table[:, 0], table[:, 1], table[:, 2]
    closing = table[:, 3].astype(bool)
    packets, when, ts, header_pos = _completions(p, plan, key, d, start, length, header,
                                                 closing)
    at = local_base[group] + start  # each message in ``streams``
    del group
    digit = np.frombuffer(streams, dtype=np.uint8)[np.minimum(at + 9, max(len(streams) - 1, 0))]
    rejected |= _unpaired(key, d, closing, header_pos, digit, len(rejected))
    del header_pos, digit
    order = np.lexsort((start, d, closing, when))
    order = order[~rejected[key][order]]
    keys = np.flatnonzero(clean & ~rejected)
    flows = [flow for flow, bad in zip(states, rejected[candidates].tolist()) if not bad]
    for flow_id, flow in enumerate(flows):
        flow.id = flow_id
    fid = np.full(len(clean), -1, dtype=np.int64)
    fid[keys] = np.arange(len(keys))
    # each column taken in message order as the one before it is let go
    flow_of = fid[key[order]]
    del fid, key
    direction = d[order]
    del d
    at = at[order]
    ts, packets, when = ts[order], packets[order], when[order]
    messages = MessageColumns(flow=flow_of, direction=direction, start=at,
                              length=length[order], header_len=header[order],
                              kind=np.where(direction == 0, REQUEST, RESPONSE), ts_us=ts,
                              packets=packets, buffer=streams)
    return Part(flows, o[p.bounds[keys]].tolist(), messages, when), rejected


def _frame(streams, candidates: np.ndarray, local_base: np.ndarray, kept_len: np.ndarray,
           n_keys: int) -> tuple[np.ndarray, array, list[int], list[int]]:
    """``http.frame_whole`` over both streams of each key of ``candidates`` (the request
    stream first): the keys it rejects (a mask over ``n_keys``); (start, length,
    header_len, closing) per message framed, flat; per (key, direction) framed, in order,
    ``2 * key + direction`` and its number of messages."""
    rejected = np.zeros(n_keys, dtype=bool)
    framed = array("q")  # flat: no tuple kept per message
    groups: list[int] = []
    counts: list[int] = []
    for k, base0, n0, base1, n1 in zip(candidates.tolist(), local_base[2 * candidates].tolist(),
                                       kept_len[2 * candidates].tolist(),
                                       local_base[2 * candidates + 1].tolist(),
                                       kept_len[2 * candidates + 1].tolist()):
        methods: deque = deque()
        requests = frame_whole(streams, REQUEST, methods, base0, base0 + n0)
        responses = None if requests is None else frame_whole(streams, RESPONSE, methods,
                                                              base1, base1 + n1)
        if responses is None:
            rejected[k] = True
            continue
        framed.extend(chain.from_iterable(requests))
        framed.extend(chain.from_iterable(responses))
        groups += (2 * k, 2 * k + 1)
        counts += (len(requests), len(responses))
    return rejected, framed, groups, counts


def _completions(p: _Packets, plan: _Plan, key, d, start, length, header, closing
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per framed message (its key, direction, place in its stream, header length and
    whether its body is close-delimited): the packets it spans (not counted by an earlier
    message), the decoded-packet position that completes it (``n`` + the key's first
    packet for a close-delimited body of a flow that never ends), its timestamp, and the
    key-order position of the packet holding its header's last byte."""
    o, n = plan.o, p.n
    group = 2 * key + d
    end = plan.group_base[group] + start + length  # in the concatenation of all streams
    # the packet holding each message's last byte, and its header's last byte
    last_pos = plan.seg_pos[np.minimum(np.searchsorted(plan.seg_end, end - 1, side="right"),
                                       len(plan.seg_pos) - 1)]
    header_pos = plan.seg_pos[np.minimum(
        np.searchsorted(plan.seg_end, end - length + np.maximum(header, 1) - 1, side="right"),
        len(plan.seg_pos) - 1)]
    # packets: the segments starting before the message's end, not counted by an earlier one
    emit = np.lexsort((start, closing, d, key))  # per (key, direction), in emission order
    upto = np.searchsorted(plan.seg_start, end, side="left")[emit]
    del end
    prev = np.empty_like(upto)
    prev[1:] = upto[:-1]
    group = group[emit]
    first_of_group = np.r_[True, group[1:] != group[:-1]]
    prev[first_of_group] = plan.group_first[group[first_of_group]]
    del group, first_of_group
    packets = np.empty_like(upto)
    packets[emit] = upto - prev
    del emit, upto, prev
    # when each message completes: its last packet, or the flow's end
    done = plan.done[key]
    ended = done < n
    when = np.where(closing, np.where(ended, o[np.minimum(done, n - 1)], n + o[p.bounds[key]]),
                    o[last_pos])
    ts = p.ts[o[np.where(closing, np.where(ended, done, p.bounds[key + 1] - 1), last_pos)]]
    return packets, when, ts, header_pos


def _gather(cols: PacketColumns, rows: np.ndarray) -> bytes | mmap.mmap:
    """The payloads of the packets ``rows``, back to back (one copy of each byte). Over a
    mapped capture they are copied in file order into an anonymous mapping, the capture's
    pages released behind the copy (``capture.release_pages``), so that the capture and
    its streams are never resident together; Python per segment either way."""
    off, size = cols.payload_off[rows], cols.payload_len[rows]
    total = int(size.sum())
    if not isinstance(cols.blob, mmap.mmap) or total == 0:
        view = memoryview(cols.blob)
        return b"".join([view[a:a + n] for a, n in zip(off.tolist(), size.tolist())])
    dest = np.cumsum(size) - size
    order = np.argsort(off, kind="stable")
    release_pages(cols.blob)
    release_freed()  # the flow analysis' temporaries, before the streams take their room
    # private: a page the NFs are done with is freed by dropping it (``runner.PayloadRelease``)
    out = mmap.mmap(-1, total, **({"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE")
                                  else {}))
    view = memoryview(cols.blob)
    release = RELEASE_STEP
    for at in range(0, len(order), GATHER_STEP):  # Python ints for a step of segments at once
        step = order[at:at + GATHER_STEP]
        for a, n, d in zip(off[step].tolist(), size[step].tolist(), dest[step].tolist()):
            if a > release:
                release_pages(cols.blob, a)
                release = a + RELEASE_STEP
            out[d:d + n] = view[a:a + n]
    view.release()
    release_pages(cols.blob)
    return out


def _unpaired(key, d, closing, header_pos, status_digit, n_keys: int) -> np.ndarray:
    """Keys where a response was framed before its request in capture order (the flow
    table pairs responses with requests as it frames them): the ``j``-th response of a
    key (1xx not counted) pairs with its ``j``-th request. Messages grouped by key, each
    direction in stream order."""
    out = np.zeros(n_keys, dtype=bool)
    req = np.flatnonzero(~closing & (d == 0))
    resp = np.flatnonzero(~closing & (d == 1) & (status_digit != ord("1")))
    if len(req) == 0 or len(resp) == 0:
        return out
    req = req[np.argsort(key[req], kind="stable")]
    resp = resp[np.argsort(key[resp], kind="stable")]
    req_count = np.bincount(key[req], minlength=n_keys)
    resp_count = np.bincount(key[resp], minlength=n_keys)
    k = key[resp]
    j = np.arange(len(resp)) - (np.cumsum(resp_count) - resp_count)[k]
    paired = j < req_count[k]
    request = req[np.minimum((np.cumsum(req_count) - req_count)[k] + j, len(req) - 1)]
    out[k[paired & (header_pos[request] >= header_pos[resp])]] = True
    return out


def _endpoints(p: _Packets, keys: np.ndarray) -> dict[int, tuple[bytes, bytes]]:
    """Per key of the mask ``keys``: the source and destination address of its first packet,
    from its key's address words (``key_table``), not from the mapped capture."""
    picked = np.flatnonzero(keys)
    ends = p.ends[picked]
    low = ends[:, 1:3].astype(">u8").tobytes()
    high = ends[:, 3:5].astype(">u8").tobytes()
    out = {}
    for j, (k, n, src_low) in enumerate(zip(picked.tolist(), ends[:, 0].tolist(),
                                            p.ends_src_low[picked].tolist())):
        lo, hi = low[16 * j:16 * j + n], high[16 * j:16 * j + n]
        out[k] = (lo, hi) if src_low else (hi, lo)
    return out


def _flow_states(p: _Packets, plan: _Plan, keys: np.ndarray,
                 ends: dict[int, tuple[bytes, bytes]]) -> list[FlowState]:
    """The flow records of the clean ``keys``, ids in order: counters by segment reductions
    over the key-ordered packets; the handshake as the flow table's state machine reads it
    (a clean flow opens with the client's SYN and each side's only SYN is its first packet,
    so: the server's SYN with ACK, then a client ACK after it)."""
    o, starts = plan.o, p.bounds[:-1]
    wire = np.add.reduceat(p.wire[o], starts)[keys]
    last_ts = np.maximum.reduceat(p.ts[o], starts)[keys]
    key = p.key[o]
    pos = np.arange(p.n)
    flags = p.flags[o]
    server_first = np.full(p.n_keys, p.n, dtype=np.int64)
    np.minimum.at(server_first, key, np.where(plan.direction == 1, pos, p.n))
    syn_ack = (server_first < p.n) & ((flags[np.minimum(server_first, p.n - 1)] & ACK) != 0)
    acked = (plan.direction == 0) & ((flags & ACK) != 0) & (pos > server_first[key])
    state = (1 + syn_ack + (syn_ack & (np.bincount(key, weights=acked, minlength=p.n_keys) > 0))
             )[keys]
    cols = p.cols
    rows = p.rows[o[starts[keys]]]
    flows = []
    for flow_id, (row, k, w, last, hs) in enumerate(zip(
            rows.tolist(), keys.tolist(), wire.tolist(), last_ts.tolist(), state.tolist())):
        src, dst = ends[k]
        flow = FlowState(flow_id, TCP, (src, int(cols.sport[row])),
                         (dst, int(cols.dport[row])), int(cols.ts_us[row]), last)
        flow.packets = int(p.bounds[k + 1] - p.bounds[k])
        flow.wire_bytes, flow.app, flow.closed, flow.handshake = w, "http", True, hs
        flows.append(flow)
    return flows


def _table_parts(p: _Packets, slow: np.ndarray, stats: Counter, idle_timeout_us: int,
                 window_bytes: int) -> list[Part]:
    """The flows of the ``slow`` keys through the flow table, in capture order."""
    picked = np.flatnonzero(slow[p.key])
    if len(picked) == 0:
        return []
    table = FlowTable(stats, idle_timeout_us=idle_timeout_us, window_bytes=window_bytes)
    flow_at, msg_at, flow_key = [], [], []
    for i, pkt in zip(picked.tolist(), p.cols.packets(p.rows[picked])):
        n_flows, n_msgs = len(table.flows), len(table.messages)
        table.add(pkt)
        if len(table.flows) > n_flows:
            flow_at.append(i)
            flow_key.append(int(p.key[i]))
        msg_at.extend([i] * (len(table.messages) - n_msgs))
    n_msgs = len(table.messages)
    table.close_all()
    key_first = p.order[p.bounds[:-1]]
    msg_at.extend(p.n + int(key_first[flow_key[m.flow]]) for m in table.messages[n_msgs:])
    return [Part(table.flows, flow_at, MessageColumns.of(table.messages),
                  np.asarray(msg_at, dtype=np.int64))]


def merge_parts(parts: list[Part], stats: Counter, clean_flows: int,
                placed: tuple[bytes, np.ndarray] | None = None) -> Assembled:
    """One flow list in creation order and one message list in completion order (ties,
    within one part, in the part's order) over one buffer: the parts' buffers joined, or
    ``placed``: one buffer already holding part ``k``'s at offset ``placed[1][k]``."""
    created = np.asarray([at for part in parts for at in part.flow_at], dtype=np.int64)
    flows = [flow for part in parts for flow in part.flows]
    new_of = np.empty(len(flows), dtype=np.int64)
    new_of[np.argsort(created, kind="stable")] = np.arange(len(flows))
    renamed, first = [], 0
    for part in parts:  # each part's flow ids, as the merged list numbers them
        ids = np.asarray([flow.id for flow in part.flows], dtype=np.int64)
        local = np.zeros(int(ids.max(initial=-1)) + 1, dtype=np.int64)
        local[ids] = new_of[first:first + len(ids)]
        renamed.append(local)
        first += len(ids)
    for flow, new in zip(flows, new_of.tolist()):
        flow.id = new
    out_flows = [None] * len(flows)
    for flow in flows:
        out_flows[flow.id] = flow
    which = np.concatenate([np.full(len(part.messages), k, dtype=np.int64)
                            for k, part in enumerate(parts)])
    rank = np.concatenate([np.arange(len(part.messages)) for part in parts])
    when = np.concatenate([part.msg_at for part in parts])
    order = np.lexsort((rank, when))

    def column(name: str) -> np.ndarray:  # (one part: taken in order without a joined copy)
        arrays = [getattr(part.messages, name) for part in parts]
        return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays))[order]

    flow = np.concatenate([renamed[k][part.messages.flow] for k, part in enumerate(parts)])
    # the parts' buffers as they are (one of them: no copy), each message where it lies
    used = [k for k, part in enumerate(parts) if len(part.messages)]
    base = np.zeros(len(parts), dtype=np.int64)
    if placed is not None:
        payload, base = placed
    elif len(used) == 1:
        payload = parts[used[0]].messages.buffer
    else:
        sizes = [len(part.messages.buffer) if k in used else 0 for k, part in enumerate(parts)]
        base[1:] = np.cumsum(sizes)[:-1]
        payload = b"".join(parts[k].messages.buffer for k in used)
    start = column("start") + base[which[order]]
    columns = MessageColumns(flow=flow[order], direction=column("direction"),
                             start=start, length=column("length"),
                             header_len=column("header_len"), kind=column("kind"),
                             ts_us=column("ts_us"), packets=column("packets"), buffer=payload)
    return Assembled(out_flows, columns, stats, clean_flows)
