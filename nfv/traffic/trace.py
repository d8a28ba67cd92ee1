"""A trace as the engines see it: flows and their messages in columnar arrays.

``load_trace`` reads a pcap/pcapng through the flow table and returns a
``Trace``: per-flow 5-tuples and counters, and per-message columns (flow,
direction, per-flow index, payload offset and length, HTTP header length,
kind, timestamp, packets) over one payload buffer, so that batches can be cut
and packed with vectorised numpy instead of per-message Python.
"""

from __future__ import annotations

import ipaddress
import mmap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .assemble import Assembled, assemble
from .capture import open_mapped, release_freed, release_pages, span_table
from .columnar import (
    NARROW,
    NARROW_OFFSETS,
    NARROW_OFFSETS_BELOW,
    OK,
    REASONS,
    ROW_FIELDS,
    PacketColumns,
    decode_records,
    http_starts,
)
from .keys import KEY_WIDTH, key_table, row_hash
from .pcap import RECORD_REASONS, TCP, MalformedCounts, address_text

DECODE_STEP = 16384  # records decoded at once: their pages and temporaries, a few MB

PROTO_NAMES = {6: "tcp", 17: "udp"}


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """One flow: client (initiator) and server ends, application, counters."""

    proto: str
    client: str
    client_port: int
    server: str
    server_port: int
    app: str
    packets: int
    wire_bytes: int
    first_ts_us: int
    last_ts_us: int
    established: bool = False  # TCP: the three-way handshake was seen

    def five_tuple(self) -> dict:
        return {"proto": self.proto, "src": self.client, "sport": self.client_port,
                "dst": self.server, "dport": self.server_port}


@dataclass(slots=True)
class Trace:
    """Flows and messages of one trace. Message arrays are in completion order."""

    source: str
    flows: list[FlowInfo]
    payload: np.ndarray  # uint8 view of ``blob``
    blob: bytes  # holds every message's bytes, message i at msg_offset[i] (in no set order)
    msg_flow: np.ndarray  # int64
    msg_dir: np.ndarray  # int8
    msg_index: np.ndarray  # int64, position of the message within its flow
    msg_offset: np.ndarray  # int64 into payload
    msg_len: np.ndarray  # int64
    msg_header_len: np.ndarray  # int64, 0 when not HTTP
    msg_kind: np.ndarray  # int8: 0 other, 1 request, 2 response
    msg_ts_us: np.ndarray  # int64
    msg_packets: np.ndarray  # int64
    packets: int
    wire_bytes: int
    malformed: dict[str, int]
    tcp: dict[str, int]
    addresses: np.ndarray | None = None  # [flows, 2 (client, server), 2 (hi, lo)] int64
    stages_s: dict[str, float] = field(default_factory=dict)  # read, decode, flows: seconds

    @property
    def n_messages(self) -> int:
        return int(self.msg_flow.shape[0])

    def message_bytes(self, i: int) -> bytes:
        start = int(self.msg_offset[i])
        return self.payload[start:start + int(self.msg_len[i])].tobytes()

    def flow_addresses(self) -> tuple[np.ndarray, np.ndarray]:
        """Client and server addresses as [flows, 2] int64 (IPv4 mapped into IPv6, hi/lo)."""
        if self.addresses is not None:
            return self.addresses[:, 0], self.addresses[:, 1]
        return _addresses([f.client for f in self.flows]), _addresses([f.server for f in self.flows])


def _addresses(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), 2), dtype=np.int64)
    for i, text in enumerate(texts):
        value = int(ip_as_v6(text))
        out[i, 0] = _signed(value >> 64)
        out[i, 1] = _signed(value & ((1 << 64) - 1))
    return out


def _raw_pair(addr: bytes) -> tuple[int, int]:
    value = int.from_bytes(addr, "big")
    if len(addr) == 4:
        value |= 0xFFFF << 32
    return _signed(value >> 64), _signed(value & ((1 << 64) - 1))


def _raw_pairs(addrs: list[bytes]) -> np.ndarray:
    """``_raw_pair`` of every address at once: [addresses, 2] int64 (IPv4 mapped)."""
    mapped = b"".join(a if len(a) == 16 else _V4_MAPPED + a for a in addrs)
    return np.frombuffer(mapped, dtype=">u8").astype(np.uint64).view(np.int64).reshape(-1, 2)


_V4_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def ip_as_v6(text: str) -> ipaddress.IPv6Address:
    addr = ipaddress.ip_address(text)
    if addr.version == 4:
        return ipaddress.IPv6Address((0xFFFF << 32) | int(addr))
    return addr


def load_trace(path: str | Path, *, idle_timeout_s: float = 60.0, per_packet: bool = False,
               workers: int = 1) -> Trace:
    """Read ``path`` (pcap or pcapng) into a ``Trace``.

    Raises ``BadInput`` when the file is not a pcap/pcapng; malformed packets
    are counted in ``Trace.malformed`` by reason, and ``Trace.packets`` counts
    every packet record of the file, read or not. Frames are decoded as columns
    (``columnar.py``) and assembled into flows over arrays (``assemble.py``);
    ``per_packet=True`` feeds every packet to the flow table instead (the
    reference the tests compare with). ``Trace.stages_s`` has the seconds spent
    reading the records, decoding them and building flows and messages.
    ``workers > 1`` builds the flows in that many processes, the packets sharded
    by 5-tuple (``shards.py``; the same ``Trace``). O(packets log packets +
    payload bytes).
    """
    stats: Counter = Counter()
    capture = read_capture(path)
    t2 = time.perf_counter()
    idle_us = int(idle_timeout_s * 1_000_000)
    if workers > 1 and not per_packet:
        from .shards import assemble_sharded  # (its fork machinery: only here)

        table = assemble_sharded(capture.cols, stats, workers, idle_timeout_us=idle_us)
    else:
        keys, capture.keys = capture.keys, None  # handed over: grouping lets the table go
        table = assemble(capture.cols, stats, idle_timeout_us=idle_us, per_packet=per_packet,
                         keys=keys)
    # the packet columns (and with them the mapped capture) go before the trace is built
    packets, wire, malformed, stages = (capture.packets, capture.wire_bytes, capture.malformed,
                                        capture.stages_s)
    del capture
    release_freed()
    trace = trace_of(str(path), table, packets, wire, malformed, stats)
    trace.stages_s = {**stages, "flows": time.perf_counter() - t2}
    return trace


@dataclass(slots=True)
class Capture:
    """A capture's records decoded into columns over its mapped file, before flows."""

    cols: PacketColumns
    malformed: MalformedCounts  # per record and per packet reasons
    packets: int  # every record of the file: the frames read, and those never yielded
    wire_bytes: int
    stages_s: dict[str, float]  # read, decode: seconds
    # where known: the decoded rows' ``keys.key_table`` (table, source is lower) and its
    # ``keys.row_hash``, a list that flow building empties once it has grouped the packets
    keys: list[np.ndarray] | None = None


def read_capture(path: str | Path) -> Capture:
    """Map ``path``, walk its records (``capture.span_table``) and decode their headers as
    columns over the mapping itself (no copy of the file), with each decoded packet's
    5-tuple key and whether its payload starts like an HTTP request (``decode_steps``).
    ``BadInput`` when it is not a pcap/pcapng."""
    malformed = MalformedCounts()
    t0 = time.perf_counter()
    data, records = walk_capture(path, malformed)
    t1 = time.perf_counter()
    decoded = decode_steps(data, records)
    cols, keys = decoded if decoded is not None else (decode_records(data, records, copy=False),
                                                      None)
    del records, data
    capture = capture_of(cols, malformed, {"read": t1 - t0, "decode": time.perf_counter() - t1})
    capture.keys = keys
    return capture


def decode_steps(data, records: np.ndarray, step: int = DECODE_STEP
                 ) -> tuple[PacketColumns, list[np.ndarray]] | None:
    """``columnar.decode_records(data, records, copy=False)`` a ``step`` of records at a
    time, each step's decoded rows keyed (``keys.key_table``, ``keys.row_hash``) and their
    HTTP starts read (``columnar.http_starts``) while its pages are resident, which are
    then released (``capture.release_pages``): flow building reads the mapped capture
    again only for payloads. The columns and the keys of the decoded rows, equal to one
    decoding's; None for no records, or where the reference decoder's fields need bytes
    appended to the buffer (then only one decoding of all records can hold them). The
    columns of ``columnar.NARROW`` are stored as its narrower types (their values fit), and
    the offsets as 32 bits in a capture under 4 GiB."""
    n = len(records)
    if n == 0:
        return None
    columns: dict[str, np.ndarray] = {}
    narrow = dict(NARROW)
    if len(data) < NARROW_OFFSETS_BELOW:
        narrow.update(dict.fromkeys(NARROW_OFFSETS, np.uint32))
    reasons = list(REASONS)
    http = np.zeros(n, dtype=bool)
    key = np.empty((n, KEY_WIDTH), dtype=np.uint64)  # pages past the decoded rows: untouched
    src_low = np.empty(n, dtype=bool)
    hashes = np.empty(n, dtype=np.uint64)
    decoded = fallback = 0
    for start in range(0, n, step):
        stop = min(start + step, n)
        cols = decode_records(data, records[start:stop], copy=False)
        if cols.blob is not data:
            return None
        if len(cols.reasons) > len(REASONS):  # the reference decoder's own reasons, renumbered
            for reason in cols.reasons[len(REASONS):]:
                if reason not in reasons:
                    reasons.append(reason)
            codes = np.array([reasons.index(r) for r in cols.reasons], dtype=np.int16)
            cols.reason = codes[cols.reason]
        for name in ROW_FIELDS:
            value = getattr(cols, name)
            if name not in columns:
                columns[name] = np.empty(n, dtype=narrow.get(name, value.dtype))
            columns[name][start:stop] = value
        fallback += cols.fallback
        ok = np.flatnonzero(cols.reason == OK)
        table, low = key_table(cols, ok)
        end = decoded + len(ok)
        key[decoded:end], src_low[decoded:end], hashes[decoded:end] = table, low, row_hash(table)
        http[start + ok] = http_starts(cols, ok)
        decoded = end
        del cols, table
        release_pages(data, int(records[stop - 1, 1] + records[stop - 1, 2]))
    cols = PacketColumns(**columns, blob=data, buf=np.frombuffer(data, dtype=np.uint8),
                         reasons=reasons, fallback=fallback, http_start=http)
    return cols, [key[:decoded], src_low[:decoded], hashes[:decoded]]


def walk_capture(path: str | Path, malformed: MalformedCounts) -> tuple[mmap.mmap, np.ndarray]:
    """The mapped capture and its records (``capture.span_table``); the records it could
    not read counted in ``malformed``."""
    data = open_mapped(path)
    return data, span_table(path, data, malformed)


def capture_of(cols: PacketColumns, malformed: MalformedCounts, stages_s: dict) -> Capture:
    """The ``Capture`` of decoded ``cols`` (``malformed``: the record reasons so far, the
    packet reasons of ``cols`` added)."""
    malformed.update(cols.malformed())
    packets = len(cols) + sum(malformed[reason] for reason in RECORD_REASONS)
    return Capture(cols, malformed, packets, int(cols.wire_bytes.sum()), stages_s)


def trace_of(source: str, table: Assembled, packets: int, wire: int, malformed: Counter,
             stats: Counter) -> Trace:
    """The ``Trace`` of assembled flows and messages (``malformed``: the packet reasons,
    joined here with the HTTP framing ones of ``stats``)."""
    msgs = table.columns
    blob = msgs.buffer
    payload = np.frombuffer(blob, dtype=np.uint8)
    msg_flow = msgs.flow
    # each message's place within its flow: its rank among the flow's messages
    by_flow = np.argsort(msg_flow, kind="stable")
    firsts = np.zeros(len(table.flows) + 1, dtype=np.int64)
    np.cumsum(np.bincount(msg_flow, minlength=len(table.flows)), out=firsts[1:])
    index = np.empty(len(msg_flow), dtype=np.int64)
    index[by_flow] = np.arange(len(msg_flow)) - firsts[msg_flow[by_flow]]
    flows = [FlowInfo(proto=PROTO_NAMES.get(f.proto, str(f.proto)),
                      client=address_text(f.client[0]), client_port=f.client[1],
                      server=address_text(f.server[0]), server_port=f.server[1],
                      app=f.app or ("tcp" if f.proto == TCP else "udp"), packets=f.packets,
                      wire_bytes=f.wire_bytes, first_ts_us=f.first_ts_us,
                      last_ts_us=f.last_ts_us, established=f.handshake == 3)
             for f in table.flows]
    tcp = {k: v for k, v in stats.items() if k.startswith("tcp_")}
    http_errors = {k: v for k, v in stats.items() if k.startswith("http_")}
    bad = dict(malformed)
    bad.update(http_errors)
    return Trace(
        source=source, flows=flows, payload=payload, blob=blob, msg_flow=msg_flow,
        msg_dir=msgs.direction.astype(np.int8), msg_index=index, msg_offset=msgs.start,
        msg_len=msgs.length, msg_header_len=msgs.header_len, msg_kind=msgs.kind.astype(np.int8),
        msg_ts_us=msgs.ts_us, msg_packets=msgs.packets,
        packets=packets, wire_bytes=wire, malformed=dict(sorted(bad.items())),
        tcp=dict(sorted(tcp.items())),
        addresses=_raw_pairs([a for f in table.flows for a in (f.client[0], f.server[0])]
                             ).reshape(len(table.flows), 2, 2))
