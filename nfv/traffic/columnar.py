"""Columnar packet decoding: every frame of a capture decoded at once with numpy.

``read_columns`` takes a capture's bytes as one buffer (the frames where
``capture.spans`` finds them; ``decode_frames`` lays frames given as bytes back
to back) and decodes the link (Ethernet with up to two 802.1Q /
802.1ad tags, raw IP, Linux cooked SLL/SLL2, BSD loopback), network (IPv4,
IPv6) and transport (TCP, UDP) headers as array operations over the frames'
start offsets: a ``PacketColumns`` of 5-tuple fields, TCP flags and sequence
numbers, payload offsets and lengths into the shared buffer, and a skip reason
per frame. No Python runs per packet for the shapes it decodes.

The per-packet decoder ``pcap.decode`` (dpkt) is the reference and the
oracle: a frame whose outcome depends on what dpkt does beyond these headers
(IPv6 extension headers, IPv4 protocols other than TCP and UDP that dpkt
parses, a non-IP ethertype, an ethertype that disagrees with the IP version,
more VLAN tags than dpkt walks) goes to ``decode`` itself, and the columns
hold its answer; ``PacketColumns.fallback`` counts those frames. So the
columns equal the reference field by field on every frame, malformed reasons
included, which the tests check on real, generated and corrupted captures.

Complexity: O(frames + bytes) time, one copy of the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .capture import (
    DLT_EN10MB,
    DLT_IPV4,
    DLT_IPV6,
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    DLT_LOOP,
    DLT_NULL,
    DLT_RAW,
    mapped,
    spans,
)
from .http import METHODS
from .pcap import TCP, UDP, MalformedCounts, Packet, decode

PAD_BYTES = 128  # zeros after the last frame, so header gathers never index past the buffer
ETH_IP, ETH_IP6, ETH_8021Q = 0x0800, 0x86DD, 0x8100
VLAN_TYPES = (0x8100, 0x88A8, 0x9100, 0x9200)  # the tag types dpkt walks
OK = 0  # reason code of a decoded packet


@dataclass(slots=True)
class PacketColumns:
    """Decoded frames as columns; row ``i`` is the ``i``-th frame read.

    ``reason[i]`` indexes ``reasons`` (``reasons[0] == ""``: a TCP/UDP packet);
    address and payload offsets index ``buf`` (``blob`` as uint8). Addresses are
    ``addr_len`` (4 or 16) bytes; for skipped frames only ``ts_us``,
    ``wire_bytes`` and ``reason`` are meaningful.
    """

    ts_us: np.ndarray  # int64
    wire_bytes: np.ndarray  # int64, the captured frame length (``NARROW``: uint32)
    reason: np.ndarray  # int16
    proto: np.ndarray  # uint8: 6, 17 or 0
    addr_len: np.ndarray  # int64 (``NARROW``: uint8): 4, 16 or 0
    src_off: np.ndarray  # int64 (``NARROW_OFFSETS``: uint32)
    dst_off: np.ndarray  # int64 (``NARROW_OFFSETS``: uint32)
    sport: np.ndarray  # int64 (``NARROW``: uint16)
    dport: np.ndarray  # int64 (``NARROW``: uint16)
    flags: np.ndarray  # uint8
    seq: np.ndarray  # int64 (``NARROW``: uint32)
    payload_off: np.ndarray  # int64 (``NARROW_OFFSETS``: uint32)
    payload_len: np.ndarray  # int64 (``NARROW``: uint32)
    blob: bytes
    buf: np.ndarray  # uint8 view of blob
    reasons: list[str]
    fallback: int  # frames decoded by the reference decoder
    # per frame, where known: its payload starts like an HTTP request (``http_starts``), so
    # that flow building need not read the mapped capture for it
    http_start: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.ts_us.shape[0])

    def take(self, rows: np.ndarray) -> PacketColumns:
        """The columns of ``rows`` alone (copies), over the same buffer."""
        fields = {name: getattr(self, name)[rows] for name in ROW_FIELDS}
        return PacketColumns(**fields, blob=self.blob, buf=self.buf, reasons=self.reasons,
                             fallback=self.fallback,
                             http_start=None if self.http_start is None else self.http_start[rows])

    def malformed(self) -> MalformedCounts:
        """Skipped frames by reason."""
        counts = np.bincount(self.reason, minlength=len(self.reasons))
        return MalformedCounts({self.reasons[k]: int(c) for k, c in enumerate(counts.tolist())
                                if k != OK and c})

    def packet(self, i: int) -> Packet | str:
        """Row ``i`` as the reference decoder's ``Packet``, or its skip reason."""
        code = int(self.reason[i])
        if code != OK:
            return self.reasons[code]
        return next(self.packets(np.array([i])))

    def packets(self, rows: np.ndarray | None = None) -> Iterator[Packet]:
        """``Packet`` records of the decoded rows (all of them, in order, by default)."""
        if rows is None:
            rows = np.flatnonzero(self.reason == OK)
        blob = self.blob
        cols = (self.ts_us[rows].tolist(), self.proto[rows].tolist(),
                self.src_off[rows].tolist(), self.dst_off[rows].tolist(),
                self.addr_len[rows].tolist(), self.sport[rows].tolist(),
                self.dport[rows].tolist(), self.flags[rows].tolist(), self.seq[rows].tolist(),
                self.payload_off[rows].tolist(), self.payload_len[rows].tolist(),
                self.wire_bytes[rows].tolist())
        for ts, proto, s, d, alen, sport, dport, flags, seq, po, pl, wire in zip(*cols):
            yield Packet(ts, proto, blob[s:s + alen], sport, blob[d:d + alen], dport, flags, seq,
                         blob[po:po + pl], wire)


# the fields whose every value fits a narrower type, as columns kept for long may store them
# (``trace.decode_steps``); readers convert before arithmetic that could leave that range.
# Offsets fit 32 bits in a buffer under ``NARROW_OFFSETS_BELOW`` bytes.
NARROW = {"addr_len": np.uint8, "sport": np.uint16, "dport": np.uint16, "seq": np.uint32,
          "wire_bytes": np.uint32, "payload_len": np.uint32}
NARROW_OFFSETS = ("src_off", "dst_off", "payload_off")
NARROW_OFFSETS_BELOW = (1 << 32) - (1 << 20)  # (a skipped frame's offsets may pass its end)
ROW_FIELDS = ("ts_us", "wire_bytes", "reason", "proto", "addr_len", "src_off", "dst_off",
               "sport", "dport", "flags", "seq", "payload_off", "payload_len")


def read_columns(path: str | Path, malformed: MalformedCounts) -> PacketColumns:
    """Every record of a pcap/pcapng file, decoded into columns.

    Unreadable records are counted in ``malformed`` (``capture.spans``);
    ``BadInput`` for a file that is not a capture. O(file size).
    """
    with mapped(path) as data:
        return decode_records(data, list(spans(path, data, malformed)))


def http_starts(cols: PacketColumns, rows: np.ndarray) -> np.ndarray:
    """``http.looks_like_http_request`` of the payload of each of ``rows``, over arrays:
    its first 8 bytes gathered at once as one big-endian 64-bit word, each method and
    its space compared as the word's leading bytes."""
    size = cols.payload_len[rows]
    at = np.minimum(cols.payload_off[rows][:, None] + np.arange(8), len(cols.buf) - 1)
    head = np.ascontiguousarray(cols.buf[at]).view(">u8").ravel().astype(np.uint64)
    out = np.zeros(len(rows), dtype=bool)
    for method in METHODS:
        word = method + b" "
        shift = np.uint64(8 * (8 - len(word)))
        out |= (size >= len(word)) & ((head >> shift) == np.uint64(int.from_bytes(word, "big")))
    return out


def decode_records(data, records: list[tuple[int, int, int, int]] | np.ndarray, *,
                   copy: bool = True) -> PacketColumns:
    """Decode the frames of the mapped capture ``data`` that ``records`` (``capture.spans``:
    timestamp, offset, length, link type) locate. The columns' buffer is one copy of the
    file, the frames where they lie in it: no per-frame objects. ``copy=False`` keeps
    ``data`` itself as the buffer (no copy of the file; the mapping must then stay open
    while the columns are used) unless frames the reference decoder rewrote need bytes
    appended."""
    table = np.asarray(records, dtype=np.int64).reshape(len(records), 4)
    blob = b"".join((data, bytes(PAD_BYTES))) if copy else data
    return _decode(blob, table[:, 1], table[:, 2], table[:, 0], table[:, 3])


def decode_frames(ts_us: Iterable[int], frames: list[bytes], linktypes: Iterable[int]
                  ) -> PacketColumns:
    """Decode ``frames`` (with their timestamps and link types) into ``PacketColumns``."""
    n = len(frames)
    lengths = np.fromiter(map(len, frames), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(lengths[:-1], out=starts[1:])
    return _decode(b"".join(frames) + bytes(PAD_BYTES), starts, lengths, ts_us, linktypes)


def _decode(blob: bytes, starts: np.ndarray, lengths: np.ndarray, ts_us: Iterable[int],
            linktypes: Iterable[int]) -> PacketColumns:
    """The columns of the frames at ``starts``/``lengths`` of ``blob``; frames the fast path
    leaves go to the reference decoder."""
    n = len(starts)
    cols = _Decoder(np.frombuffer(blob, dtype=np.uint8), starts, lengths,
                    np.fromiter(linktypes, dtype=np.int64, count=n)).run()
    ts = np.fromiter(ts_us, dtype=np.int64, count=n)
    starts = np.ascontiguousarray(starts)
    lengths = np.ascontiguousarray(lengths)
    rows = np.flatnonzero(cols["fallback"])
    extra: list[bytes] = []
    size = len(blob)
    reasons = list(REASONS)
    for i in rows.tolist():
        start = int(starts[i])
        frame = blob[start:start + int(lengths[i])]
        try:
            pkt = decode(int(ts[i]), frame, int(cols["link"][i]))
        except Exception:  # dpkt can fail in ways it does not document; never fatal
            pkt = "undecodable"
        if isinstance(pkt, str):
            if pkt not in reasons:
                reasons.append(pkt)
            cols["reason"][i] = reasons.index(pkt)
            continue
        cols["reason"][i] = OK
        cols["proto"][i], cols["addr_len"][i] = pkt.proto, len(pkt.src)
        cols["sport"][i], cols["dport"][i] = pkt.sport, pkt.dport
        cols["flags"][i], cols["seq"][i] = pkt.flags, pkt.seq
        for name, part in (("src_off", pkt.src), ("dst_off", pkt.dst),
                           ("payload_off", pkt.payload)):
            at = frame.find(part)  # the same bytes inside the frame serve as well
            if at >= 0:
                cols[name][i] = start + at
                continue
            cols[name][i] = size
            extra.append(part)
            size += len(part)
        cols["payload_len"][i] = len(pkt.payload)
    if extra:  # (a mapped file's bytes are copied here: bytes cannot be appended to it)
        blob = b"".join((blob, *extra))
    cols["addr_len"][cols["reason"] != OK] = 0
    return PacketColumns(
        ts_us=ts, wire_bytes=lengths, reason=cols["reason"], proto=cols["proto"],
        addr_len=cols["addr_len"], src_off=cols["src_off"], dst_off=cols["dst_off"],
        sport=cols["sport"], dport=cols["dport"], flags=cols["flags"], seq=cols["seq"],
        payload_off=cols["payload_off"], payload_len=cols["payload_len"], blob=blob,
        buf=np.frombuffer(blob, dtype=np.uint8), reasons=reasons, fallback=len(rows))


REASONS = ("", "truncated_link_header", "non_ip", "truncated_ip", "bad_ip_header",
            "bad_ip_length", "ip_fragment", "truncated_tcp", "bad_tcp_header", "truncated_udp",
            "bad_udp_length")
_CODE = {name: k for k, name in enumerate(REASONS)}


class _Decoder:
    """One pass of array operations per header layer over the frames' offsets."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 links: np.ndarray):
        self.buf, self.starts, self.ends, self.links = buf, starts, starts + lengths, links
        self.last = max(len(buf) - 1, 0)
        n = len(starts)
        self.reason = np.zeros(n, dtype=np.int16)
        self.fallback = np.zeros(n, dtype=bool)
        self.open = np.ones(n, dtype=bool)  # still being decoded by the fast path

    def u8(self, pos: np.ndarray) -> np.ndarray:
        # a frame's header fields are read only where its length allows; a position past
        # the buffer (a short last frame) is read as its last byte, never used
        return self.buf[np.minimum(pos, self.last)].astype(np.int64)

    def u16(self, pos: np.ndarray) -> np.ndarray:
        return (self.u8(pos) << 8) | self.u8(pos + 1)

    def u32(self, pos: np.ndarray) -> np.ndarray:
        return (self.u16(pos) << 16) | self.u16(pos + 2)

    def skip(self, mask: np.ndarray, reason: str) -> None:
        mask = mask & self.open
        self.reason[mask] = _CODE[reason]
        self.open &= ~mask

    def to_reference(self, mask: np.ndarray) -> None:
        mask = mask & self.open
        self.fallback |= mask
        self.open &= ~mask

    def run(self) -> dict[str, np.ndarray]:
        ip, version = self._link()
        body, body_end, proto, addr_len, src, dst = self._network(ip, version)
        out = self._transport(body, body_end, proto)
        out.update(link=self.links, reason=self.reason, fallback=self.fallback,
                   addr_len=np.where(self.reason == OK, addr_len, 0), src_off=src, dst_off=dst)
        return out

    def _link(self) -> tuple[np.ndarray, np.ndarray]:
        """Start of the IP header and its expected version (0: from the version nibble)."""
        s, e, link = self.starts, self.ends, self.links
        size = e - s
        ip = np.zeros_like(s)
        expect = np.zeros_like(s)  # Ethernet: the version its ethertype names
        eth = link == DLT_EN10MB
        # frames dpkt's Ethernet parser rejects or reads beyond these headers: the reference
        self.to_reference(eth & (size < 14))
        etype = np.where(eth & (size >= 14), self.u16(np.where(size >= 14, s + 12, s)), 0)
        tags = np.zeros_like(s)
        inner = etype.copy()
        vlan = eth & np.isin(etype, VLAN_TYPES)
        self.to_reference(vlan & (size < 18))
        one = vlan & (size >= 18)
        inner = np.where(one, self.u16(np.where(one, s + 16, s)), inner)
        tags[one] = 1
        two = one & (inner == ETH_8021Q)
        self.to_reference(two & (size < 22))
        two &= size >= 22
        inner = np.where(two, self.u16(np.where(two, s + 20, s)), inner)
        tags[two] = 2
        self.to_reference(eth & ~np.isin(inner, (ETH_IP, ETH_IP6)))
        ip = np.where(eth, s + 14 + 4 * tags, ip)
        expect = np.where(eth, np.where(inner == ETH_IP, 4, 6), 0)
        sll, sll2 = link == DLT_LINUX_SLL, link == DLT_LINUX_SLL2
        loop = (link == DLT_NULL) | (link == DLT_LOOP)
        self.skip(sll & (size < 16), "truncated_link_header")
        self.skip(sll2 & (size < 20), "truncated_link_header")
        self.skip(loop & (size < 4), "truncated_link_header")
        proto = np.where(sll, self.u16(s + 14), np.where(sll2, self.u16(s), ETH_IP))
        self.skip((sll | sll2) & ~np.isin(proto, (ETH_IP, ETH_IP6)), "non_ip")
        ip = np.where(sll, s + 16, np.where(sll2, s + 20, np.where(loop, s + 4, ip)))
        raw = np.isin(link, (DLT_RAW, DLT_IPV4, DLT_IPV6))
        ip = np.where(raw, s, ip)
        self.skip(ip >= e, "truncated_ip")
        nibble = self.u8(np.minimum(ip, e)) >> 4
        # Ethernet: an ethertype that disagrees with the version leads dpkt elsewhere
        self.to_reference(eth & (nibble != expect))
        self.skip(~eth & ~np.isin(nibble, (4, 6)), "non_ip")
        return ip, nibble

    def _network(self, ip: np.ndarray, version: np.ndarray):
        e = self.ends
        raw_len = e - ip
        v4 = self.open & (version == 4)
        v6 = self.open & (version == 6)
        self.skip(v4 & (raw_len < 20), "truncated_ip")
        self.skip(v6 & (raw_len < 40), "truncated_ip")
        v4 &= self.open
        v6 &= self.open
        hl = (self.u8(ip) & 0x0F) * 4
        self.skip(v4 & (hl < 20), "bad_ip_header")
        v4 &= self.open
        total = self.u16(ip + 2)
        frag = self.u16(ip + 6)
        offset, more = frag & 0x1FFF, frag & 0x2000
        proto4 = self.u8(ip + 9)
        # dpkt parses the payload of protocols it knows (not only TCP/UDP): the reference
        self.to_reference(v4 & ~np.isin(proto4, (TCP, UDP)) & (offset == 0))
        v4 &= self.open
        self.skip(v4 & (total > 0) & (total < hl), "bad_ip_length")
        self.skip(v4 & (total > 0) & (raw_len < total), "truncated_ip")
        self.skip(v4 & ((offset != 0) | (more != 0)), "ip_fragment")
        nxt = self.u8(ip + 6)
        plen = self.u16(ip + 4)
        self.to_reference(v6 & ~np.isin(nxt, (TCP, UDP)))
        v6 &= self.open
        self.skip(v6 & (raw_len < 40 + plen), "truncated_ip")
        body = np.where(version == 4, ip + hl, ip + 40)
        end4 = np.where(total > 0, ip + total, e)
        end6 = np.where(plen > 0, ip + 40 + plen, e)
        body_end = np.maximum(np.where(version == 4, end4, end6), body)
        proto = np.where(version == 4, proto4, nxt)
        addr_len = np.where(version == 4, 4, 16)
        src = np.where(version == 4, ip + 12, ip + 8)
        dst = np.where(version == 4, ip + 16, ip + 24)
        return body, body_end, proto, addr_len, src, dst

    def _transport(self, body: np.ndarray, body_end: np.ndarray, proto: np.ndarray
                   ) -> dict[str, np.ndarray]:
        size = body_end - body
        tcp = self.open & (proto == TCP)
        udp = self.open & (proto == UDP)
        self.skip(tcp & (size < 20), "truncated_tcp")
        tcp &= self.open
        offset = (self.u8(body + 12) >> 4) * 4
        self.skip(tcp & (offset < 20), "bad_tcp_header")
        self.skip(tcp & (size < offset), "truncated_tcp")
        self.skip(udp & (size < 8), "truncated_udp")
        udp &= self.open
        ulen = self.u16(body + 4)
        self.skip(udp & (ulen < 8), "bad_udp_length")
        self.skip(udp & (ulen > size), "truncated_udp")
        tcp &= self.open
        udp &= self.open
        payload = np.where(tcp, body + offset, body + 8)
        payload_end = np.where(tcp, body_end, body + ulen)
        keep = tcp | udp
        return {"proto": np.where(tcp, TCP, np.where(udp, UDP, 0)).astype(np.uint8),
                "sport": np.where(keep, self.u16(body), 0),
                "dport": np.where(keep, self.u16(body + 2), 0),
                "flags": np.where(tcp, self.u8(body + 13), 0).astype(np.uint8),
                "seq": np.where(tcp, self.u32(body + 4), 0),
                "payload_off": np.where(keep, payload, 0),
                "payload_len": np.where(keep, payload_end - payload, 0)}
