"""Traffic layer: the real loopback trace, pcap/pcapng, link types, malformed input."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.nfv.traffic import load_trace
from dl_nfv.nfv.traffic.generate import TraceSpec, flow_sizes, generate_trace, parse_size_dist
from dl_nfv.nfv.traffic.pcap import decode

from .helpers import REAL_TRACE, http_connection, tcp_frame, write_pcap

C4, S4 = bytes([10, 0, 0, 1]), bytes([10, 1, 0, 1])
C6, S6 = bytes(15) + b"\x01", bytes(15) + b"\x02"
REQ = b"GET /a HTTP/1.1\r\nHost: x.test\r\n\r\n"
RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


def test_real_loopback_trace_counts():
    trace = load_trace(REAL_TRACE)
    assert len(trace.flows) == 12
    assert all(f.app == "http" and f.server_port == 80 for f in trace.flows)
    assert trace.malformed == {}
    kinds = trace.msg_kind.tolist()
    assert kinds.count(1) == kinds.count(2) == 29  # every request answered
    # each flow alternates requests (index even) and responses, except pipelined ones
    first = [trace.message_bytes(i) for i in range(trace.n_messages) if trace.msg_index[i] == 0]
    assert all(m.split(b" ", 1)[0] in (b"GET", b"POST", b"HEAD") for m in first)
    # a chunked response is framed whole: it ends with the zero chunk
    chunked = [trace.message_bytes(i) for i in range(trace.n_messages)
               if b"Transfer-Encoding: chunked" in trace.message_bytes(i)[:300]]
    assert chunked and all(m.endswith(b"0\r\n\r\n") for m in chunked)


def test_vlan_ipv6_and_pcapng_give_the_same_messages(tmp_path):
    msgs = [(0, REQ), (1, RESP), (0, REQ.replace(b"/a", b"/b")), (1, RESP)]
    plain = load_trace(write_pcap(tmp_path / "a.pcap", http_connection(C4, S4, 4000, msgs)))
    vlan = load_trace(write_pcap(tmp_path / "b.pcap", http_connection(C4, S4, 4000, msgs, vlan=7)))
    v6 = load_trace(write_pcap(tmp_path / "c.pcapng", http_connection(C6, S6, 4000, msgs, v6=True)))
    for t in (plain, vlan, v6):
        assert t.n_messages == 4
        assert [t.message_bytes(i) for i in range(4)] == [m for _, m in msgs]
        assert t.msg_dir.tolist() == [0, 1, 0, 1]
    assert v6.flows[0].client == "::1" and v6.flows[0].server == "::2"


def test_generated_trace_pcap_and_pcapng_agree(tmp_path):
    spec = TraceSpec(flows=30, size_dist="zipf:1.2", seed=3)
    s1 = generate_trace(spec, tmp_path / "g.pcap")
    generate_trace(spec, tmp_path / "g.pcapng")
    a, b = load_trace(tmp_path / "g.pcap"), load_trace(tmp_path / "g.pcapng")
    assert len(a.flows) == 30 and a.packets == s1["packets"] == b.packets
    assert a.n_messages == 2 * s1["exchanges"]
    assert np.array_equal(a.payload, b.payload) and np.array_equal(a.msg_flow, b.msg_flow)
    assert (tmp_path / "g.pcap").read_bytes() == (generate_trace(spec, tmp_path / "h.pcap")
                                                   and (tmp_path / "h.pcap").read_bytes())


def test_size_distributions_mean_and_skew():
    rng = np.random.default_rng(0)
    for dist in ("uniform", "zipf:0.8", "zipf:1.6", "pareto:1.2"):
        sizes = flow_sizes(5000, dist, 4.0, 5000, rng)
        assert sizes.min() >= 1 and abs(sizes.mean() - 4.0) < 0.5, dist
    top = [np.sort(flow_sizes(5000, f"zipf:{s}", 4.0, 5000, rng))[-50:].sum() for s in (0.8, 1.6)]
    assert top[1] > top[0]  # more skew: the top 1% of flows carry more
    with pytest.raises(BadInput, match="size-dist"):
        parse_size_dist("zipf")


def test_not_a_pcap_is_bad_input(tmp_path):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture file at all")
    with pytest.raises(BadInput, match="not a pcap or pcapng"):
        load_trace(junk)


def _flip(frame: bytes, rng: random.Random) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 80))
def test_fuzzed_frames_never_raise(seed, cut):
    rng = random.Random(seed)
    good = tcp_frame(C4, S4, 1234, 80, 1, 0x18, b"GET / HTTP/1.1\r\n\r\n")
    for frame in (good[:cut], _flip(good, rng), bytes(rng.randrange(256) for _ in range(cut))):
        result = decode(0, frame, 1)
        assert isinstance(result, str) or result.proto in (6, 17)


def test_malformed_packets_are_counted_not_fatal(tmp_path):
    good = http_connection(C4, S4, 4000, [(0, REQ), (1, RESP)])
    bad_len = bytearray(good[3])
    bad_len[16:18] = (4000).to_bytes(2, "big")  # IP total length beyond the capture
    bad_off = bytearray(good[3])
    bad_off[14 + 20 + 12] = 0x20  # TCP data offset 8 bytes
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    frames = good[:3] + [good[3][:30], bytes(bad_len), bytes(bad_off), arp] + good[3:]
    trace = load_trace(write_pcap(tmp_path / "m.pcap", frames))
    assert trace.malformed == {"bad_tcp_header": 1, "non_ip": 1, "truncated_ip": 2}
    assert [trace.message_bytes(i) for i in range(trace.n_messages)] == [REQ, RESP]


def test_truncated_file_is_counted(tmp_path):
    path = write_pcap(tmp_path / "t.pcap", http_connection(C4, S4, 4000, [(0, REQ), (1, RESP)]))
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the file ends 7 bytes short of its last packet
    trace = load_trace(path)
    assert trace.malformed == {"truncated_file": 1}
    assert trace.packets == len(http_connection(C4, S4, 4000, [(0, REQ), (1, RESP)]))


def _record_offsets(data: bytes) -> list[int]:
    out, pos = [], 24
    while pos < len(data):
        out.append(pos)
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    return out


def test_oversized_record_is_counted_and_the_rest_read(tmp_path):
    data = bytearray(REAL_TRACE.read_bytes())
    offsets = _record_offsets(bytes(data))
    struct.pack_into("<I", data, offsets[3] + 8, 0x7FFFFFFF)  # record 4: caplen 2 GB
    path = tmp_path / "huge.pcap"
    path.write_bytes(bytes(data))
    trace = load_trace(path)
    assert trace.malformed == {"oversized_record": 1}
    assert trace.packets == len(offsets)
    intact = load_trace(REAL_TRACE)
    # record 4 carries the first connection's first request; every other connection is
    # read as if nothing had happened
    assert len(trace.flows) == len(intact.flows)

    def others(t):
        return sorted(t.message_bytes(i) for i in range(t.n_messages) if t.msg_flow[i] != 0)

    assert others(trace) == others(intact) and others(trace)


def test_a_stop_is_reported_not_silent(tmp_path):
    data = bytearray(REAL_TRACE.read_bytes())
    last = _record_offsets(bytes(data))[-1]
    caplen = struct.unpack_from("<I", data, last + 8)[0]
    struct.pack_into("<I", data, last + 8, 0xFFFFFFFF)  # nothing after it to resynchronise to
    path = tmp_path / "stop.pcap"
    path.write_bytes(bytes(data))
    trace = load_trace(path)
    assert trace.malformed == {"oversized_record": 1, "unreadable_bytes": caplen}


def test_record_longer_than_its_original_length_is_skipped(tmp_path):
    data = bytearray(REAL_TRACE.read_bytes())
    offsets = _record_offsets(bytes(data))
    caplen = struct.unpack_from("<I", data, offsets[10] + 8)[0]
    struct.pack_into("<I", data, offsets[10] + 12, caplen - 1)
    path = tmp_path / "orig.pcap"
    path.write_bytes(bytes(data))
    trace = load_trace(path)
    assert trace.malformed["bad_record_header"] == 1 and trace.packets == len(offsets)


def _block(kind: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    return struct.pack("<II", kind, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def test_pcapng_timestamp_resolution_and_bad_block_length(tmp_path):
    frame = tcp_frame(C4, S4, 4000, 80, 1, 0x02)
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    tsresol = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)  # nanoseconds
    idb = _block(1, struct.pack("<HHI", 1, 0, 65535) + tsresol)
    ns = 1_700_000_000_123_456_789
    epb = _block(6, struct.pack("<IIIII", 0, ns >> 32, ns & 0xFFFFFFFF, len(frame), len(frame))
                 + frame)
    path = tmp_path / "ns.pcapng"
    path.write_bytes(shb + idb + epb + epb)
    trace = load_trace(path)
    assert trace.packets == 2 and trace.malformed == {}
    assert trace.flows[0].first_ts_us == (ns + 500) // 1000
    bad = bytearray(shb + idb + epb + epb)
    struct.pack_into("<I", bad, len(shb) + len(idb) + 4, 0x7FFFFFFF)
    path.write_bytes(bytes(bad))
    with pytest.raises(BadInput) as err:
        load_trace(path)
    assert str(err.value) == (f"{path}: pcapng block at offset {len(shb) + len(idb)}: bad block "
                              f"length 2147483647 ({2 * len(epb)} bytes left in the file)")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzzed_trace_files_load_without_raising(tmp_path_factory, seed):
    """Random truncations and byte flips in every frame of a real connection."""
    rng = random.Random(seed)
    frames = http_connection(C4, S4, 4000, [(0, REQ), (1, RESP), (0, REQ), (1, RESP)], mss=20)
    mutated = []
    for frame in frames:
        roll = rng.random()
        if roll < 0.3:
            frame = frame[:rng.randrange(len(frame) + 1)]
        elif roll < 0.6:
            frame = _flip(frame, rng)
        mutated.append(frame)
    path = write_pcap(tmp_path_factory.mktemp("fuzz") / "f.pcap", mutated)
    trace = load_trace(path)
    assert trace.packets == len(frames)
    assert sum(trace.malformed.get(k, 0) for k in trace.malformed
               if not k.startswith("http_")) <= len(frames)
