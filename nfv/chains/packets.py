"""Packets of an L3/L4 chain as columns, their flow keys, hashes, checksums and output.

``ChainPackets`` holds IPv4 TCP/UDP packets as int64 columns (timestamps,
addresses as unsigned 32-bit values, ports, protocol, TCP flags, wire bytes,
the IPv4 and TCP/UDP checksums as captured) plus where each header lies in its
frame, so the chain's rewrites can be written back. ``load_packets`` builds it
from a capture with dl-nfv's reader (``traffic.capture.spans`` and
``traffic.columnar.decode_records``); frames that are not IPv4 TCP/UDP are
counted by reason and not forwarded.

The flow key is direction-free: the lower (address, port) endpoint first, so
both directions of a conversation share it; ``dir`` says which side sent the
packet. ``key_pair`` packs it into two int64 words (``k1``: the two addresses,
``k2``: the two ports and the protocol, never negative).

``hash32`` is the 32-bit integer mix used for table slots and Maglev flow
hashing. It only multiplies 32-bit values by a 28-bit constant, so Python
integers and torch int64 tensors give the same bits without overflow.

Checksums follow RFC 1624 (eqn. 3): ``HC' = ~(~HC + ~m + m')`` over every
16-bit word that changed, so a rewrite costs O(1) per packet and a checksum
that was wrong on capture (e.g. loopback checksum offload) stays wrong by
the same amount. A UDP checksum of 0 (none) stays 0; a computed 0 is sent
as 0xFFFF.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..traffic.capture import mapped, spans
from ..traffic.columnar import OK, decode_records
from ..traffic.pcap import TCP, UDP, MalformedCounts

MASK32 = 0xFFFFFFFF
HASH_MUL = 0x45D9F3B
NO_CSUM = -1  # a UDP packet sent without a checksum


@dataclass(slots=True)
class ChainPackets:
    """IPv4 TCP/UDP packets as int64 columns; row ``i`` is the ``i``-th forwarded candidate.
    The columns are not reassigned once built (``rows`` may hold them as one array)."""

    ts_us: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    proto: np.ndarray
    flags: np.ndarray
    wire_bytes: np.ndarray
    ip_csum: np.ndarray
    l4_csum: np.ndarray  # NO_CSUM for UDP without a checksum
    # the columns as the rows of one [columns, packets] array, where they are (``packed`` and
    # its slices); None: unknown
    rows: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.ts_us.shape[0])

    def slice(self, start: int, stop: int) -> ChainPackets:
        return ChainPackets(**{name: getattr(self, name)[start:stop] for name in _FIELDS},
                            rows=None if self.rows is None else self.rows[:, start:stop])

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _FIELDS}

    def block(self) -> np.ndarray:
        """Every column as one [columns, packets] array, rows in field order (the tensor
        engine moves a batch to its device in one transfer): ``rows`` where known, else a
        view where the columns are consecutive rows, at one offset, of one 2-D array, else
        a copy."""
        if self.rows is not None:
            return self.rows
        cols = [getattr(self, name) for name in _FIELDS]
        first, base = cols[0], cols[0].base
        if isinstance(base, np.ndarray) and base.ndim == 2 and base.shape[0] == len(cols) \
                and base.dtype == np.int64 and base.strides[1] == 8 \
                and all(c.base is base and c.strides == (8,) and c.shape == first.shape
                        for c in cols):
            origin, row = base.ctypes.data, base.strides[0]
            at, rest = divmod(first.ctypes.data - origin, 8)
            if rest == 0 and 0 <= at and at + len(first) <= base.shape[1] \
                    and all(c.ctypes.data == origin + k * row + 8 * at
                            for k, c in enumerate(cols)):
                return base[:, at:at + len(first)]
        return np.stack(cols)

    def packed(self) -> ChainPackets:
        """The same packets with every column a row of one [columns, packets] array, so that
        ``block`` of it and of its slices is a view."""
        block = np.stack([getattr(self, name) for name in _FIELDS])
        return ChainPackets(*block, rows=block)


_FIELDS = tuple(f.name for f in fields(ChainPackets) if f.name != "rows")


@dataclass(slots=True)
class Capture:
    """A capture's chain packets and what is needed to write them back."""

    packets: ChainPackets
    blob: np.ndarray  # uint8: the file's bytes
    frame_start: np.ndarray  # per chain packet
    frame_len: np.ndarray
    ip_off: np.ndarray  # absolute offsets into blob
    l4_off: np.ndarray
    linktype: int
    frames: int  # every record of the file
    ingress_drops: dict[str, int]  # frames not forwarded, by reason


def _u16(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (buf[pos].astype(np.int64) << 8) | buf[pos + 1]


def load_packets(path: str | Path) -> Capture:
    """The IPv4 TCP/UDP packets of a pcap/pcapng file as ``ChainPackets``.

    Frames of other kinds (IPv6, other protocols, malformed) are counted in
    ``ingress_drops`` by the reader's reason. ``BadInput`` for a file that is
    not a capture. O(file size).
    """
    malformed = MalformedCounts()
    with mapped(path) as data:
        records = list(spans(path, data, malformed))
        cols = decode_records(data, records)
    table = np.array(records, dtype=np.int64).reshape(len(records), 4)
    drops: Counter = Counter(malformed)
    for name, count in cols.malformed().items():
        drops[name] += count
    ok = cols.reason == OK
    v6 = ok & (cols.addr_len != 4)
    drops["not_ipv4"] += int(v6.sum())
    rows = np.flatnonzero(ok & (cols.addr_len == 4))
    buf = cols.buf
    ip = cols.src_off[rows] - 12
    body = ip + (buf[ip].astype(np.int64) & 0x0F) * 4
    proto = cols.proto[rows].astype(np.int64)
    l4_csum = np.where(proto == TCP, _u16(buf, body + 16), _u16(buf, body + 6))
    l4_csum = np.where((proto == UDP) & (l4_csum == 0), NO_CSUM, l4_csum)
    src = np.frombuffer(buf[(cols.src_off[rows][:, None] + np.arange(4)).ravel()].tobytes(),
                        dtype=">u4").astype(np.int64)
    dst = np.frombuffer(buf[(cols.dst_off[rows][:, None] + np.arange(4)).ravel()].tobytes(),
                        dtype=">u4").astype(np.int64)
    packets = ChainPackets(
        ts_us=cols.ts_us[rows], src=src, dst=dst, sport=cols.sport[rows].astype(np.int64),
        dport=cols.dport[rows].astype(np.int64), proto=proto,
        flags=cols.flags[rows].astype(np.int64), wire_bytes=cols.wire_bytes[rows].astype(np.int64),
        ip_csum=_u16(buf, ip + 10), l4_csum=l4_csum)
    links = set(table[rows, 3].tolist()) if len(rows) else {1}
    return Capture(packets=packets.packed(), blob=buf, frame_start=table[rows, 1], frame_len=table[rows, 2],
                   ip_off=ip, l4_off=body, linktype=int(min(links)), frames=len(records),
                   ingress_drops={k: int(v) for k, v in drops.items() if v})


def key_pair(src, sport, dst, dport, proto):
    """(k1, k2, dir) of packets given as ints or int64 arrays/tensors: the direction-free
    flow key and 1 where the packet runs from the higher endpoint to the lower."""
    swap = (src > dst) | ((src == dst) & (sport > dport))
    if isinstance(swap, bool):
        lo_ip, hi_ip = (dst, src) if swap else (src, dst)
        lo_port, hi_port = (dport, sport) if swap else (sport, dport)
        k1 = (lo_ip << 32) | hi_ip
        k1 = k1 - (1 << 64) if k1 >= 1 << 63 else k1
        return k1, (lo_port << 24) | (hi_port << 8) | proto, int(swap)
    # the lower address is the key's first whichever way the ports go (equal addresses:
    # either); the ports follow ``swap``, the higher one the sum less the lower
    if isinstance(swap, np.ndarray):
        lo_ip, hi_ip = np.minimum(src, dst), np.maximum(src, dst)
        lo_port = np.where(swap, dport, sport)
    else:  # tensors (torch loads only with them: ``nfv/actors`` keys ints)
        from .ops import pick

        lo_ip, hi_ip = src.minimum(dst), src.maximum(dst)
        lo_port = pick(swap, dport, sport)
    hi_port = sport + dport - lo_port
    return (lo_ip << 32) | hi_ip, (lo_port << 24) | (hi_port << 8) | proto, swap.long() \
        if hasattr(swap, "long") else swap.astype(np.int64)


def endpoint_pair(src, sport, dst, dport, proto):
    """(lo, hi, dir) of packets as int64 arrays: the lower (address, port) endpoint as
    ``address << 16 | port``, the higher one with the protocol below it (``<< 8 | proto``),
    and ``key_pair``'s ``dir`` (bool). A pair determines the flow key (``endpoint_keys``) in
    fewer steps than ``key_pair``'s words: the endpoints compare as ``key_pair`` orders them
    (address, then port), so one minimum and one maximum place both."""
    a = src << 16
    a |= sport
    b = dst << 16
    b |= dport
    swap = a > b
    lo = np.minimum(a, b)
    hi = np.maximum(a, b, out=b)
    hi <<= 8
    hi |= proto
    return lo, hi, swap


def endpoint_keys(lo, hi):
    """``key_pair``'s (k1, k2) of ``endpoint_pair``'s (lo, hi)."""
    k1 = (lo >> 16) << 32
    k1 |= hi >> 24
    k2 = (lo & 0xFFFF) << 24
    k2 |= hi & 0xFFFFFF
    return k1, k2


def flow_count(packets: ChainPackets) -> int:
    """How many distinct flow keys ``packets`` hold (host numpy, one sort)."""
    k1, k2, _ = key_pair(packets.src, packets.sport, packets.dst, packets.dport, packets.proto)
    keys = np.unique(np.stack([k1, k2], axis=1).view(np.dtype((np.void, 16))))
    return int(keys.shape[0])


def hash32(x):
    """A 32-bit integer mix of ``x`` (an int in 0..2^32-1 or an int64 array/tensor of them)."""
    x = (((x >> 16) ^ x) * HASH_MUL) & MASK32
    x = (((x >> 16) ^ x) * HASH_MUL) & MASK32
    return ((x >> 16) ^ x) & MASK32


MIX_MUL = (0x9E3779B97F4A7C15 - (1 << 64), 0xC2B2AE3D27D4EB4F - (1 << 64))  # odd, as int64


def mix_hash(k1, k2, bits: int):
    """A ``bits``-bit hash of flow keys (int64 tensors or numpy arrays) for table slots and
    the flow sort: multiply, add, multiply and take the high bits (int64 products wrap) — a
    few vector steps where ``flow_hash`` takes dozens. Not the LB's hash (``flow_hash``)."""
    if isinstance(k1, np.ndarray):  # the same steps in place: no temporaries
        mixed = k1 * MIX_MUL[0]
        mixed += k2
        mixed *= MIX_MUL[1]
        mixed >>= 64 - bits
        mixed &= (1 << bits) - 1
        return mixed
    mixed = (k1 * MIX_MUL[0] + k2) * MIX_MUL[1]
    return (mixed >> (64 - bits)) & ((1 << bits) - 1)


def flow_hash(k1, k2):
    """The 32-bit hash of a flow key (``key_pair``); equal for ints, int64 tensors and int64
    numpy arrays (``_flow_hash_words``)."""
    if isinstance(k1, np.ndarray):
        return _flow_hash_words(k1, k2)
    h = hash32((k1 >> 32) & MASK32)
    h = hash32(h ^ (k1 & MASK32))
    h = hash32(h ^ (k2 & MASK32))
    return hash32(h ^ ((k2 >> 32) & MASK32))


def _mix32(h):
    """``hash32`` in place over a uint32 array, whose products wrap at 2^32 as the masked
    int64 ones do: no masks, no temporaries but the shifts."""
    for _ in range(2):
        h ^= h >> 16
        h *= np.uint32(HASH_MUL)
    h ^= h >> 16
    return h


def _flow_hash_words(k1, k2):
    """``flow_hash`` over int64 numpy arrays: the keys' 32-bit words as uint32 (a cast keeps
    the low 32 bits), mixed in place; a third of the masked int64 form's steps (the LB
    hashes a batch's new flows, a few hundred, where each step's fixed cost dominates)."""
    h = _mix32((k1 >> 32).astype(np.uint32))
    h ^= k1.astype(np.uint32)
    h = _mix32(h)
    h ^= k2.astype(np.uint32)
    h = _mix32(h)
    h ^= (k2 >> 32).astype(np.uint32)
    return _mix32(h).astype(np.int64)


def _fold(s):
    s = (s & 0xFFFF) + (s >> 16)
    return (s & 0xFFFF) + (s >> 16)


def _word_sum(v):
    """The sum of a 32-bit value's two 16-bit words."""
    return (v >> 16) + (v & 0xFFFF)


def rewrite_checksums(old: dict, new: dict, ip_csum, l4_csum, proto):
    """New (IPv4, TCP/UDP) checksums after ``old`` -> ``new`` (src, dst, sport, dport).

    RFC 1624 eqn. 3 over the 16-bit words that may change, ``HC' = ~(~HC + sum(~m + m'))``,
    with the sum gathered: for a 16-bit word ``~w & 0xFFFF == 0xFFFF - w``, so the sum over
    the address words is the words' sums of ``new`` minus those of ``old`` plus 4 * 0xFFFF
    (a handful of vector steps), shared by the IP header and the pseudo-header."""
    addr = (_word_sum(new["src"]) + _word_sum(new["dst"]) - _word_sum(old["src"])
            - _word_sum(old["dst"]) + 4 * 0xFFFF)
    ports = new["sport"] + new["dport"] - old["sport"] - old["dport"] + 2 * 0xFFFF
    ip_new = 0xFFFF - _fold(_fold(0xFFFF - ip_csum + addr))
    l4_new = 0xFFFF - _fold(_fold(0xFFFF - l4_csum + addr + ports))
    if isinstance(proto, int):
        if l4_csum == NO_CSUM:
            return ip_new, NO_CSUM
        return ip_new, (0xFFFF if proto == UDP and l4_new == 0 else l4_new)
    udp_zero = (proto == UDP) & (l4_new == 0)
    l4_new = l4_new + udp_zero * 0xFFFF
    keep = l4_csum == NO_CSUM
    return ip_new, l4_new * ~keep + NO_CSUM * keep


def _word_totals(old, new, csums):
    """``rewrite_checksums``' sums before the fold, as [2, n] (IPv4, TCP/UDP): the 16-bit
    words' one's complement sum, never negative."""
    def words(v):
        return ((v >> 16) + (v & 0xFFFF)).sum(0)

    total = (0xFFFF - csums) + (words(new[:2]) - words(old[:2]) + 4 * 0xFFFF)
    total[1] += (new[2:] - old[2:]).sum(0) + 2 * 0xFFFF
    return total


def rewrite_checksum_rows(old, new, csums, proto):
    """``rewrite_checksums`` over tensors or numpy arrays of packets, the fields as rows:
    ``old`` and ``new`` [4, n] (src, dst, sport, dport), ``csums`` [2, n] (IPv4, TCP/UDP as
    captured); the new [2, n], of ``old``'s kind.

    The fold of a sum ``x >= 0`` is 0 for ``x == 0`` and else the value in 1..0xFFFF equal
    to ``x`` modulo 0xFFFF, and a 16-bit word's sum of a 32-bit value equals the value
    modulo 0xFFFF (2^16 = 1): so the checksum is ``0xFFFE - (d - csum - 1) mod 0xFFFF``,
    ``d`` the plain difference of the new and old fields, without splitting words or
    folding. That is 0 both where ``x`` is a positive multiple of 0xFFFF (right) and where
    ``x == 0`` (the fold's 0xFFFF), which needs ``csum == 0xFFFF`` (``x >= 0xFFFF - csum``):
    the few packets with both are recomputed by the words' sums to tell them apart."""
    d = new - old
    if d.shape[1] == 0:
        return d[:2]
    d_addr = d[0] + d[1] - 1
    total = d_addr - csums
    total[1] += d[2] + d[3]
    # 0xFFFE - total mod 0xFFFF (Python's modulus, never negative, for both kinds), the
    # modulus as total - floor(total / 0xFFFF) * 0xFFFF: numpy divides by a constant with a
    # multiply, about twice as fast as its remainder; in place, without temporaries
    out = total // 0xFFFF
    out *= 0xFFFF
    out -= total
    out += 0xFFFE
    # the rare cases, each looked for with one reduction before any work over the batch (a
    # captured checksum is at most 0xFFFF and at least NO_CSUM, ``out`` in 0..0xFFFE)
    if int(csums.max()) == 0xFFFF:  # x >= 0xFFFF - csum: a zero sum needs 0xFFFF
        zero = ((out == 0) & (csums == 0xFFFF)).any(0)
        if bool(zero.any()):
            at = zero.nonzero()
            at = at[0] if isinstance(at, tuple) else at.squeeze(1)
            sums = _word_totals(old[:, at], new[:, at], csums[:, at])
            out[:, at] = 0xFFFF - _fold(_fold(sums))
    l4 = out[1]
    if int(l4.min()) == 0:  # UDP sends a computed 0 as 0xFFFF
        l4 += ((proto == UDP) & (l4 == 0)) * 0xFFFF
    if int(csums[1].min()) == NO_CSUM:
        keep = csums[1] == NO_CSUM
        out[1] = l4 + (NO_CSUM - l4) * keep
    return out


def _put16(blob: np.ndarray, pos: np.ndarray, value: np.ndarray) -> None:
    blob[pos] = (value >> 8) & 0xFF
    blob[pos + 1] = value & 0xFF


def _put32(blob: np.ndarray, pos: np.ndarray, value: np.ndarray) -> None:
    for k in range(4):
        blob[pos + k] = (value >> (24 - 8 * k)) & 0xFF


def write_output(path: str | Path, capture: Capture, rows: np.ndarray,
                 fields_out: dict[str, np.ndarray]) -> int:
    """Write the forwarded packets ``rows`` of ``capture`` with the chain's header fields
    ``fields_out`` (src, dst, sport, dport, ip_csum, l4_csum: one value per row) as a
    classic pcap (microseconds) of the capture's link type. Returns the packets written."""
    blob = capture.blob.copy()
    ip, l4 = capture.ip_off[rows], capture.l4_off[rows]
    tcp = capture.packets.proto[rows] == TCP
    _put32(blob, ip + 12, fields_out["src"])
    _put32(blob, ip + 16, fields_out["dst"])
    _put16(blob, ip + 10, fields_out["ip_csum"])
    _put16(blob, l4, fields_out["sport"])
    _put16(blob, l4 + 2, fields_out["dport"])
    csum = np.where(fields_out["l4_csum"] == NO_CSUM, 0, fields_out["l4_csum"])
    _put16(blob, np.where(tcp, l4 + 16, l4 + 6), csum)
    ts = capture.packets.ts_us[rows]
    length = capture.frame_len[rows]
    header = np.zeros((len(rows), 4), dtype="<u4")
    header[:, 0], header[:, 1] = ts // 1_000_000, ts % 1_000_000
    header[:, 2] = header[:, 3] = length
    out = Path(path)
    with out.open("wb") as fh:
        fh.write(np.array([0xA1B2C3D4], "<u4").tobytes() + np.array([2, 4], "<u2").tobytes()
                 + np.array([0, 0, 262_144, capture.linktype], "<u4").tobytes())
        starts = capture.frame_start[rows]
        for k in range(len(rows)):
            fh.write(header[k].tobytes())
            fh.write(blob[starts[k]:starts[k] + length[k]].tobytes())
    return len(rows)
