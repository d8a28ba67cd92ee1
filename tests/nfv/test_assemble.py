"""Flows and messages by array operations equal the flow table fed packet by packet.

``load_trace(path, per_packet=True)`` sends every packet through
``FlowTable`` (the reference); the default path assembles clean flows over
columns and hands the rest to the same table. Every field of the two traces
must agree: flows (ids, ends, counters, handshake), messages (order, flow,
direction, bytes, header length, kind, timestamp, packets) and the TCP and
HTTP statistics. Inputs mix clean flows with every reason a flow is not
clean: reordered and retransmitted segments, resets, re-used ports, idle gaps,
UDP, non-HTTP TCP, server-first data, framing errors, responses to HEAD and
1xx, pipelining, close-delimited bodies, flows without FIN, data after close.
"""

from __future__ import annotations

import random

import dpkt
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.traffic import load_trace
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace

from .helpers import DATA, http_connection, tcp_frame, write_pcap

C4, S4 = bytes([10, 0, 0, 1]), bytes([10, 1, 0, 1])
C6, S6 = bytes(15) + b"\x01", bytes(15) + b"\x02"
REQ = b"GET /a HTTP/1.1\r\nHost: x.test\r\n\r\n"
RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
FIELDS = ("msg_flow", "msg_dir", "msg_index", "msg_len", "msg_header_len",
          "msg_kind", "msg_ts_us", "msg_packets", "addresses")


def assert_same_trace(path) -> int:
    """The array path equals the per-packet path on ``path``; the number of messages."""
    fast, ref = load_trace(path), load_trace(path, per_packet=True)
    assert fast.flows == ref.flows
    for name in FIELDS:
        assert np.array_equal(getattr(fast, name), getattr(ref, name)), name
    # the bytes of every message (where each lies in the trace's buffer may differ)
    assert [fast.message_bytes(i) for i in range(fast.n_messages)] == \
        [ref.message_bytes(i) for i in range(ref.n_messages)]
    assert (fast.packets, fast.wire_bytes, fast.malformed, fast.tcp) == \
        (ref.packets, ref.wire_bytes, ref.malformed, ref.tcp)
    return ref.n_messages


def test_real_and_generated_traces(tmp_path):
    for path in sorted(DATA.glob("*.pcap")):
        assert assert_same_trace(path) > 0
    for dist, suffix in (("zipf:1.2", ".pcap"), ("uniform", ".pcapng"), ("pareto:1.5", ".pcap")):
        path = tmp_path / f"g{suffix}"
        generate_trace(TraceSpec(flows=60, size_dist=dist, attack_rate=0.1, seed=9), path)
        assert assert_same_trace(path) > 100


def _udp(src: bytes, dst: bytes, sport: int, dport: int, data: bytes) -> bytes:
    udp = dpkt.udp.UDP(sport=sport, dport=dport, data=data)
    udp.ulen = len(udp)
    ip = dpkt.ip.IP(src=src, dst=dst, p=dpkt.ip.IP_PROTO_UDP, data=udp)
    ip.len = len(bytes(ip))
    return bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=0x0800, data=ip))


def _connections(rng: random.Random) -> list[list[bytes]]:
    """Connections of every kind, each a list of frames in its own order."""
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n3;x=1\r\nabc\r\n0\r\n\r\n")
    close = b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    conns = [
        http_connection(C4, S4, 4000, [(0, REQ), (1, RESP)] * 3, mss=9),
        http_connection(C4, S4, 4001, [(0, REQ + REQ), (1, RESP + chunked)], mss=17),
        http_connection(C6, S6, 4002, [(0, REQ), (1, close)], v6=True, mss=11),
        http_connection(C4, S4, 4003, [(0, REQ), (1, RESP)], vlan=3),
        http_connection(C4, S4, 4004, [(0, b"HEAD / HTTP/1.1\r\n\r\n"),
                                       (1, b"HTTP/1.1 100 Continue\r\n\r\n"),
                                       (1, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"),
                                       (0, REQ), (1, RESP)]),
        http_connection(C4, S4, 4005, [(0, b"HELLO there\r\n"), (1, b"hi back"), (0, b"bye")]),
        http_connection(C4, S4, 4006, [(1, b"220 server speaks first\r\n"), (0, REQ)]),
        http_connection(C4, S4, 4007, [(0, b"GET / HTTP/1.1\r\nbad header\r\n\r\n"), (1, RESP)]),
        http_connection(C4, S4, 4008, [(0, REQ), (1, b"HTTP/1.1 200 OK\r\nContent-Length: 99"
                                                     b"\r\n\r\nshort")]),
        http_connection(C4, S4, 4009, [(0, REQ), (1, RESP)])[:-2],  # no FINs
        # a response before its request's header is complete: paired as the table frames them
        http_connection(C4, S4, 4010, [(0, b"HEAD / HTTP/1.1\r\n"), (1, RESP), (0, b"\r\n"),
                                       (1, RESP)]),
    ]
    shuffled = http_connection(C4, S4, 4011, [(0, REQ), (1, RESP)] * 2, mss=7)
    body = shuffled[3:-2]
    rng.shuffle(body)
    conns.append(shuffled[:3] + body + shuffled[-2:])
    retrans = http_connection(C4, S4, 4012, [(0, REQ), (1, RESP)], mss=10)
    conns.append(retrans[:5] + retrans[3:5] + retrans[5:])
    reset = http_connection(C4, S4, 4013, [(0, REQ), (1, RESP)], mss=10)
    conns.append(reset[:6] + [tcp_frame(C4, S4, 4013, 80, 1001 + len(REQ), 0x14)])
    late = http_connection(C4, S4, 4014, [(0, REQ)])
    conns.append(late + [tcp_frame(C4, S4, 4014, 80, 5000, 0x18, b"late")])
    reuse = http_connection(C4, S4, 4015, [(0, REQ), (1, RESP)])
    conns.append(reuse + http_connection(C4, S4, 4015, [(0, REQ), (1, RESP)]))
    conns.append([_udp(C4, S4, 53, 5353, b"query %d" % i) for i in range(3)])
    return conns


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_kind_of_flow_interleaved(tmp_path, seed):
    rng = random.Random(seed)
    conns = _connections(rng)
    frames = []
    queues = [list(c) for c in conns]
    while any(queues):  # interleave connections at random, each in its own order
        q = rng.choice([q for q in queues if q])
        frames.append(q.pop(0))
    assert assert_same_trace(write_pcap(tmp_path / "mix.pcap", frames)) > 20


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31))
def test_random_subsets_drops_duplicates_and_clock_jumps(tmp_path, seed):
    """Any mix of the connections, with a frame dropped or duplicated here and there and
    timestamps that stall, go back or jump past the idle timeout."""
    from dl_nfv.nfv.traffic.pcap import PcapWriter

    rng = random.Random(seed)
    queues = [list(c) for c in _connections(rng) if rng.random() < 0.7]
    for q in queues:
        if rng.random() < 0.2 and len(q) > 4:
            del q[rng.randrange(3, len(q))]
        if rng.random() < 0.2 and len(q) > 4:
            i = rng.randrange(len(q))
            q.insert(i, q[i])
    path = tmp_path / f"r{seed}.pcap"
    with PcapWriter(path) as w:
        t = 1_000_000
        while any(queues):
            t += rng.choice([0, 1, 5, 1000]) if rng.random() < 0.98 else \
                rng.choice([-10, 61_000_000])
            w.write(rng.choice([q for q in queues if q]).pop(0), t)
    assert_same_trace(path)


def test_idle_gap_and_timestamps_going_back(tmp_path):
    from dl_nfv.nfv.traffic.pcap import PcapWriter

    frames = http_connection(C4, S4, 4100, [(0, REQ), (1, RESP)] * 2)
    path = tmp_path / "idle.pcap"
    with PcapWriter(path) as w:
        for i, frame in enumerate(frames):
            w.write(frame, 1_000_000 + i + (120_000_000 if i >= 5 else 0) - (50 if i == 3 else 0))
    assert assert_same_trace(path) > 0


def test_clean_flows_take_the_array_path_and_the_rest_the_table(tmp_path):
    from collections import Counter

    from dl_nfv.nfv.traffic.assemble import assemble
    from dl_nfv.nfv.traffic.columnar import read_columns
    from dl_nfv.nfv.traffic.pcap import MalformedCounts

    conns = _connections(random.Random(0))
    path = write_pcap(tmp_path / "all.pcap", [f for c in conns for f in c])
    result = assemble(read_columns(path, MalformedCounts()), Counter())
    # clean: 4000-4004 (HTTP in order, chunked, close-delimited, VLAN, HEAD and 1xx) and
    # 4009 (no FINs); the rest are reordered, retransmitted, reset, re-used, late, not
    # HTTP, server-first, badly framed, incomplete, answered early, or UDP
    assert result.clean_flows == 6
    assert len(result.flows) == len(conns) + 1  # the re-used 5-tuple is two flows


def test_rows_grouped_by_hash_as_by_value():
    """``_group_rows`` puts two rows in one group exactly when they are equal (as
    ``np.unique`` over the rows does), whatever order it numbers the groups in."""
    from dl_nfv.nfv.traffic.assemble import _group_rows

    rng = np.random.default_rng(3)
    for width in (1, 4, 8):
        table = rng.integers(0, 3, size=(500, width)).astype(np.uint64)
        table[::7, 0] = np.uint64(2**64 - 1)
        first, inverse = _group_rows(table)
        _, ref_first, ref_inverse = np.unique(table, axis=0, return_index=True,
                                              return_inverse=True)
        assert len(first) == len(ref_first)
        assert (table == table[first[inverse]]).all()
        # the same partition: equal rows share a group, different rows do not
        pairs = {(int(a), int(b)) for a, b in zip(inverse, ref_inverse.ravel())}
        assert len(pairs) == len(first)
