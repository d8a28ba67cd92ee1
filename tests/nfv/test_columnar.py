"""The columnar decoder equals the per-packet reference decoder, packet by packet.

The reference is ``pcap.decode`` (dpkt), run here on every record the capture
reader yields; the columns must give the same ``Packet`` (every field: time,
protocol, addresses, ports, flags, sequence number, payload, wire bytes) or the
same skip reason, and the same malformed counts. Inputs: every capture in
``tests/data``, generated traces (pcap and pcapng, Zipf and uniform), frames of
every supported link type, VLAN and IPv6 frames, frames the fast path hands to
the reference (IPv6 extension headers, ICMP, ARP), seeded corruptions of good
frames, and the corrupt capture files of the fuzz suite.
"""

from __future__ import annotations

import random
import re
import struct
from collections import Counter

import dpkt
import numpy as np
import pytest

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.nfv.traffic.columnar import (
    REASONS,
    ROW_FIELDS,
    decode_frames,
    decode_records,
    http_starts,
    read_columns,
)
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from dl_nfv.nfv.traffic.http import METHODS, looks_like_http_request
from dl_nfv.nfv.traffic.keys import key_table, row_hash
from dl_nfv.nfv.traffic.pcap import (
    DLT_EN10MB,
    DLT_IPV6,
    DLT_LINUX_SLL,
    DLT_LINUX_SLL2,
    DLT_LOOP,
    DLT_NULL,
    DLT_RAW,
    MalformedCounts,
    decode,
    read_frames,
)
from dl_nfv.nfv.traffic.trace import decode_steps

from .helpers import DATA, tcp_frame
from .test_pcap_fuzz import PCAP_KINDS, PCAPNG_KINDS, pcap_case, pcapng_case

C4, S4 = bytes([10, 0, 0, 1]), bytes([10, 1, 0, 1])
C6, S6 = bytes(15) + b"\x01", bytes(15) + b"\x02"


def _reference(ts: int, frame: bytes, link: int):
    try:
        return decode(ts, frame, link)
    except Exception:  # the trace loader counts these as "undecodable"
        return "undecodable"


def assert_same(records: list[tuple[int, bytes, int]]) -> None:
    """Columns of ``records`` equal the reference decoder's answer on each of them."""
    cols = decode_frames([r[0] for r in records], [r[1] for r in records],
                         [r[2] for r in records])
    assert len(cols) == len(records)
    expected = Counter()
    for i, record in enumerate(records):
        ref = _reference(*record)
        assert cols.packet(i) == ref, (i, record[1].hex())
        if isinstance(ref, str):
            expected[ref] += 1
    assert cols.malformed() == expected
    decoded = [p for p in (_reference(*r) for r in records) if not isinstance(p, str)]
    assert list(cols.packets()) == decoded


def assert_same_file(path) -> int:
    """The file read as columns equals the reference walk; the number of records."""
    walked, counted = MalformedCounts(), MalformedCounts()
    records = list(read_frames(path, walked))
    cols = read_columns(path, counted)
    assert counted == walked
    assert len(cols) == len(records)
    assert_same(records)
    return len(records)


def test_every_capture_in_tests_data():
    paths = sorted(DATA.glob("*.pcap")) + sorted(DATA.glob("*.pcapng"))
    assert paths
    for path in paths:
        assert assert_same_file(path) > 0


@pytest.mark.parametrize("dist,suffix", [("zipf:1.2", ".pcap"), ("uniform", ".pcapng")])
def test_generated_traces(tmp_path, dist, suffix):
    path = tmp_path / f"g{suffix}"
    generate_trace(TraceSpec(flows=40, size_dist=dist, attack_rate=0.2, seed=3), path)
    assert assert_same_file(path) > 200


def _udp_v4(payload: bytes, ulen: int | None = None) -> bytes:
    udp = dpkt.udp.UDP(sport=53, dport=5353, data=payload)
    udp.ulen = len(udp) if ulen is None else ulen
    ip = dpkt.ip.IP(src=C4, dst=S4, p=dpkt.ip.IP_PROTO_UDP, data=udp)
    ip.len = 20 + len(bytes(udp))
    return bytes(ip)


def _frames_by_link() -> list[tuple[int, bytes, int]]:
    """Good and odd frames of every link type, and frames only the reference decodes."""
    v4 = tcp_frame(C4, S4, 1234, 80, 7, 0x18, b"GET / HTTP/1.1\r\n\r\n")
    v6 = tcp_frame(C6, S6, 1234, 80, 2**32 - 3, 0x12, b"x" * 30, v6=True)
    ip4, ip6 = v4[14:], v6[14:]
    hop = dpkt.ip6.IP6(src=C6, dst=S6, nxt=0, hlim=64,
                       data=b"\x06\x00" + bytes(6) + ip6[40:])  # hop-by-hop, then TCP
    hop.plen = len(hop.data)
    icmp = bytes(dpkt.ip.IP(src=C4, dst=S4, p=1, data=dpkt.icmp.ICMP(type=8, data=b"ping")))
    arp = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(28)
    sll = b"\x00\x00\x00\x01\x00\x06" + bytes(8)
    frames = [
        (DLT_EN10MB, v4), (DLT_EN10MB, v6), (DLT_EN10MB, v4 + bytes(20)),
        (DLT_EN10MB, tcp_frame(C4, S4, 1, 2, 3, 0x02, vlan=5)),
        (DLT_EN10MB, v4[:12] + b"\x88\xa8\x00\x07\x81\x00\x00\x05" + v4[12:]),  # QinQ
        (DLT_EN10MB, v4[:12] + b"\x81\x00\x00\x07\x81\x00\x00\x05\x81\x00\x00\x03" + v4[12:]),
        (DLT_EN10MB, v4[:14] + _udp_v4(b"hello")), (DLT_EN10MB, v4[:14] + _udp_v4(b"hi", 4)),
        (DLT_EN10MB, v4[:14] + _udp_v4(b"hi", 90)), (DLT_EN10MB, v4[:14] + icmp),
        (DLT_EN10MB, v4[:12] + b"\x86\xdd" + bytes(hop)), (DLT_EN10MB, arp),
        (DLT_EN10MB, v4[:12] + b"\x86\xdd" + ip4), (DLT_EN10MB, v6[:12] + b"\x08\x00" + ip6),
        (DLT_EN10MB, v4[:13]), (DLT_EN10MB, v4[:14]), (DLT_EN10MB, v4[:30]),
        (DLT_RAW, ip4), (DLT_RAW, ip6), (DLT_IPV6, ip6), (DLT_RAW, b""), (DLT_RAW, b"\x50" * 30),
        (DLT_LINUX_SLL, sll + b"\x08\x00" + ip4), (DLT_LINUX_SLL, sll + b"\x86\xdd" + ip6),
        (DLT_LINUX_SLL, sll + b"\x08\x06" + ip4), (DLT_LINUX_SLL, sll[:10]),
        (DLT_LINUX_SLL2, b"\x08\x00" + bytes(18) + ip4), (DLT_LINUX_SLL2, b"\x08\x00" + bytes(5)),
        (DLT_NULL, b"\x02\x00\x00\x00" + ip4), (DLT_LOOP, b"\x00\x00\x00\x18" + ip6),
        (DLT_NULL, b"\x02\x00"),
    ]
    # IPv4 header cases: options, a bad header length, a bad total length, fragments, cuts
    opts = bytearray(ip4[:20] + b"\x01" * 4 + ip4[20:])
    opts[0] = 0x46
    struct.pack_into("!H", opts, 2, len(opts))
    for edit in (lambda b: b, lambda b: b.__setitem__(0, 0x44), lambda b: b.__setitem__(0, 0x4F),
                 lambda b: struct.pack_into("!H", b, 2, 12), lambda b: struct.pack_into("!H", b, 2, 0),
                 lambda b: struct.pack_into("!H", b, 2, 4000), lambda b: struct.pack_into("!H", b, 6, 0x2000),
                 lambda b: struct.pack_into("!H", b, 6, 0x0010), lambda b: b.__setitem__(9, 50),
                 lambda b: b.__setitem__(36, 0x30), lambda b: b.__setitem__(36, 0xF0)):
        frame = bytearray(opts)
        edit(frame)
        frames.append((DLT_RAW, bytes(frame)))
    return [(1_000 + i, frame, link) for i, (link, frame) in enumerate(frames)]


def test_every_link_type_and_the_frames_left_to_the_reference():
    records = _frames_by_link()
    assert_same(records)
    cols = decode_frames(*zip(*((t, f, lt) for t, f, lt in records)))
    assert cols.fallback >= 4  # extension header, ICMP, ARP, three VLAN tags at least
    assert set(cols.malformed()) >= {"truncated_link_header", "non_ip", "truncated_ip",
                                     "bad_ip_header", "bad_ip_length", "ip_fragment",
                                     "truncated_tcp", "bad_tcp_header", "bad_udp_length",
                                     "truncated_udp"}


def test_corrupted_frames():
    """Seeded cuts, byte changes and random bytes over good frames of every link type."""
    assert_same(_corrupted_records(random.Random(11), 4000))


def _corrupted_records(rng: random.Random, n: int) -> list[tuple[int, bytes, int]]:
    """``n`` good frames of every link type, each cut, changed in a few bytes or replaced
    by random bytes (seeded)."""
    good = _frames_by_link()
    records = []
    for k in range(n):
        ts, frame, link = good[rng.randrange(len(good))]
        roll = rng.random()
        if roll < 0.3:
            frame = frame[:rng.randrange(len(frame) + 1)]
        elif roll < 0.9 and frame:
            b = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            frame = bytes(b)
        else:
            frame = bytes(rng.randrange(256) for _ in range(rng.randrange(80)))
        records.append((ts + k, frame, link))
    return records


def test_corrupt_capture_files(tmp_path):
    """The fuzz suite's corrupt files: records and malformed counts as the reference walk."""
    gen = tmp_path / "g.pcap"
    spec = TraceSpec(flows=6, mean_exchanges=2, size_dist="zipf:1.2", attack_rate=0.1, seed=4)
    generate_trace(spec, gen)
    generate_trace(spec, tmp_path / "g.pcapng")
    rng = random.Random(5)
    cases = 0
    for base, make, kinds in ((DATA / "loopback-http.pcap", pcap_case, PCAP_KINDS),
                              (gen, pcap_case, PCAP_KINDS),
                              (tmp_path / "g.pcapng", pcapng_case, PCAPNG_KINDS)):
        data = base.read_bytes()
        for kind in kinds:
            for _ in range(6):
                corrupt, _ = make(data, rng, kind)
                path = tmp_path / f"c{cases}{base.suffix}"
                path.write_bytes(corrupt)
                cases += 1
                try:
                    list(read_frames(path, MalformedCounts()))
                except BadInput as exc:  # both readers refuse the file alike
                    with pytest.raises(BadInput, match=re.escape(str(exc))):
                        read_columns(path, MalformedCounts())
                    continue
                assert_same_file(path)
    assert cases >= 100


def test_http_starts_equal_the_per_payload_check():
    """``http_starts`` over arrays is ``looks_like_http_request`` of each payload: methods,
    their prefixes, wrong case, a missing space, payloads shorter than the method."""
    rng = random.Random(3)
    pieces = [m + b" " for m in METHODS] + [b"GET", b"get ", b"GETX ", b"HEAD/", b"PO", b"",
                                             b"OPTIONS", b"PATCH  ", b"\x00GET "]
    payloads = [rng.choice(pieces)[:rng.randrange(0, 10)] + bytes(rng.randrange(0, 3))
                for _ in range(600)]
    frames = [tcp_frame(b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 1000 + i, 80, 1, 0x18, p)
              for i, p in enumerate(payloads)]
    cols = decode_frames(range(len(frames)), frames, [1] * len(frames))
    rows = np.arange(len(frames))
    assert (cols.reason == 0).all()
    got = http_starts(cols, rows)
    assert got.tolist() == [looks_like_http_request(p) for p in payloads]
    assert 50 < got.sum() < 550


def test_take_keeps_the_rows_packets():
    """``PacketColumns.take(rows)`` holds exactly those rows: the same ``Packet`` records and
    skip reasons as the whole columns give for them, over the same buffer."""
    cols = read_columns(DATA / "loopback-http.pcap", MalformedCounts())
    rng = np.random.default_rng(5)
    rows = np.sort(rng.choice(len(cols), size=len(cols) // 3, replace=False))
    part = cols.take(rows)
    assert len(part) == len(rows) and part.blob is cols.blob
    ok = np.flatnonzero(part.reason == 0)
    assert list(part.packets(ok)) == list(cols.packets(rows[ok]))
    assert [part.packet(i) for i in range(len(part))] == [cols.packet(int(r)) for r in rows]
    assert part.malformed() + cols.take(np.setdiff1d(np.arange(len(cols)), rows)).malformed() \
        == cols.malformed()


def test_decoding_by_steps_equals_one_decoding():
    """``trace.decode_steps`` a few records at a time (the pages of each step released
    after it) gives one decoding's columns, skip reasons (the reference decoder's own,
    met in another order by each step, numbered in one list), 5-tuple keys with their
    hashes and HTTP starts: over frames of every link type, seeded corruptions of them,
    and HTTP requests."""
    records = _corrupted_records(random.Random(12), 1500)
    records += [(9_000 + i, tcp_frame(C4, S4, 2000 + i % 7, 80, i, 0x18, b"GET / HTTP/1.1\r\n"
                                      if i % 3 else b"data"), DLT_EN10MB) for i in range(60)]
    random.Random(13).shuffle(records)
    frames = [frame for _, frame, _ in records]
    data = b"".join(frames)
    starts = np.cumsum([0] + [len(f) for f in frames])[:-1]
    table = np.array([(ts, at, len(f), link) for (ts, f, link), at in zip(records, starts)],
                     dtype=np.int64)
    one = decode_records(data, table, copy=False)
    ok = np.flatnonzero(one.reason == 0)
    key, src_low = key_table(one, ok)
    for step in (1, 7, 64, 5000):
        stepped = decode_steps(data, table, step)
        if one.blob is not data:  # bytes appended for the reference's fields: not by steps
            assert stepped is None
            continue
        cols, keys = stepped
        assert len(cols.reasons) > len(REASONS) and cols.fallback == one.fallback
        assert [cols.reasons[c] for c in cols.reason.tolist()] == \
            [one.reasons[c] for c in one.reason.tolist()]
        assert cols.malformed() == one.malformed()
        for name in ROW_FIELDS:
            if name != "reason":
                assert np.array_equal(getattr(cols, name), getattr(one, name)), name
        assert list(cols.packets()) == list(one.packets())
        assert np.array_equal(keys[0], key) and np.array_equal(keys[1], src_low)
        assert np.array_equal(keys[2], row_hash(key))
        assert np.array_equal(np.flatnonzero(cols.http_start), ok[http_starts(one, ok)])
    assert one.http_start is None and 0 < len(ok) < len(records)
