"""TCP reassembly and HTTP/1.1 framing: order independence, retransmits, overlaps, framing."""

from __future__ import annotations

import random
from collections import Counter, deque

from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.traffic import load_trace
from dl_nfv.nfv.traffic.http import RAW, REQUEST, RESPONSE, Framer
from dl_nfv.nfv.traffic.reassembly import Stream

from .helpers import http_connection, tcp_frame, write_pcap

C4, S4 = bytes([10, 0, 0, 1]), bytes([10, 1, 0, 1])


def _segments(data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [(a, data[a:b]) for a, b in zip(points, points[1:]) if b > a]


def _reassemble(segments, isn: int) -> bytes:
    stream = Stream(Counter())
    out = bytearray()
    stream.add(isn - 1, b"", syn=True)
    for offset, data in segments:
        for _, chunk in stream.add((isn + offset) % 2**32, data):
            out += chunk
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=1, max_size=600), cuts=st.lists(st.integers(0, 10**6), max_size=20),
       seed=st.integers(0, 2**31), isn=st.integers(0, 2**32 - 1),
       dup=st.lists(st.tuples(st.integers(0, 599), st.integers(1, 80)), max_size=6))
def test_stream_does_not_depend_on_segment_order(data, cuts, seed, isn, dup):
    segments = _segments(data, cuts)
    # retransmissions and overlapping re-sends of consistent data
    for start, size in dup:
        start %= len(data)
        segments.append((start, data[start:start + size]))
    random.Random(seed).shuffle(segments)
    assert _reassemble(segments, isn) == data


def test_retransmit_overlap_and_gap_counters():
    stats = Counter()
    s = Stream(stats)
    s.add(99, b"", syn=True)
    assert s.add(100, b"abcd") == [(0, b"abcd")]
    assert s.add(100, b"abcd") == []  # retransmission
    assert s.add(102, b"cdef") == [(4, b"ef")]  # overlap trimmed
    assert s.add(110, b"XY") == []  # out of order: hole at 6..10
    missing, chunks = s.flush()
    assert missing == 4 and chunks == [(10, b"XY")]
    assert stats["tcp_retransmissions"] == 1 and stats["tcp_overlaps"] == 1
    assert stats["tcp_out_of_order"] == 1 and stats["tcp_gaps"] == 1


def _frame(side: int, chunks: list[bytes], requests: deque | None = None) -> list[bytes]:
    framer = Framer(side, requests if requests is not None else deque(), Counter())
    out = []
    for c in chunks:
        out += [m[1] for m in framer.feed(c)]
    out += [m[1] for m in framer.finish()]
    return out


def test_http_framing_lengths_chunked_pipelined():
    r1 = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
    r2 = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    r3 = b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n"
    r4 = (b"PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
          b"4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: t\r\n\r\n")
    stream = r1 + r2 + r3 + r4
    requests: deque = deque()
    for size in (1, 7, len(stream)):  # byte-at-a-time, small pieces, all at once
        requests.clear()
        pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
        assert _frame(REQUEST, pieces, requests) == [r1, r2, r3, r4]
    assert list(requests) == [b"GET", b"POST", b"HEAD", b"PUT"]
    s1 = b"HTTP/1.1 100 Continue\r\n\r\n"
    s2 = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    s3 = b"HTTP/1.1 204 No Content\r\n\r\n"
    s4 = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"  # answer to HEAD: no body
    s5 = b"HTTP/1.1 200 OK\r\n\r\nread until the connection closes"
    got = _frame(RESPONSE, [s1 + s2 + s3 + s4 + s5], deque([b"GET", b"POST", b"HEAD", b"GET"]))
    assert got == [s1, s2, s3, s4, s5]


def test_http_framing_errors_are_counted_and_the_bytes_delivered_raw():
    stats = Counter()
    f = Framer(REQUEST, deque(), stats)
    bad = b"GET / HTTP/1.1\r\nContent-Length: x1\r\n\r\n"
    assert f.feed(bad) == [(0, bad, 0, RAW)]
    assert stats["http_bad_content_length"] == 1 and f.broken
    assert f.feed(b"more", len(bad)) == [(len(bad), b"more", 0, RAW)]  # and everything after
    assert stats["http_unframed_bytes"] == len(bad) + 4
    stats = Counter()
    f = Framer(RESPONSE, deque([b"GET"]), stats)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert f.feed(head + b"zz\r\n") == [(0, head + b"zz\r\n", 0, RAW)]
    assert stats["http_bad_chunk"] == 1
    stats = Counter()
    f = Framer(REQUEST, deque(), stats)
    assert f.feed(b"NOT HTTP AT ALL\r\n\r\n") == [(0, b"NOT HTTP AT ALL\r\n\r\n", 0, RAW)]
    assert stats["http_bad_start_line"] == 1
    # a partial message at the end of the stream, and the bytes before a hole
    stats = Counter()
    f = Framer(REQUEST, deque(), stats)
    ok = b"GET /a HTTP/1.1\r\n\r\n"
    assert f.feed(ok + b"GET /b HT") == [(0, ok, len(ok), REQUEST)]
    assert f.finish() == [(len(ok), b"GET /b HT", 0, RAW)] and stats["http_incomplete"] == 1
    f = Framer(REQUEST, deque(), Counter())
    assert f.feed(b"GET /c") == [] and f.gap() == [(0, b"GET /c", 0, RAW)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), window=st.integers(2, 8))
def test_flow_messages_do_not_depend_on_packet_order_within_window(tmp_path_factory, seed, window):
    """Shuffle each connection's data packets within windows; messages stay the same."""
    msgs = [(0, b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i) for i in range(3)]
    msgs = [m for i, r in enumerate(msgs) for m in
            (r, (1, b"HTTP/1.1 200 OK\r\nContent-Length: 150\r\n\r\n" + bytes([65 + i]) * 150))]
    frames = http_connection(C4, S4, 5000, msgs, mss=40)
    rng = random.Random(seed)
    head, body, tail = frames[:3], frames[3:-2], frames[-2:]
    shuffled = list(body)
    for side in (C4, S4):  # each direction's segments, shuffled within windows
        slots = [i for i, f in enumerate(body) if f[26:30] == side]
        for i in range(0, len(slots), window):
            part = slots[i:i + window]
            moved = [body[j] for j in part]
            rng.shuffle(moved)
            for j, f in zip(part, moved):
                shuffled[j] = f
    tail = tail[::-1] if rng.random() < 0.5 else tail
    # a FIN may even overtake the last data segments
    order = head + (shuffled[:-1] + tail[:1] + shuffled[-1:] + tail[1:] if rng.random() < 0.5
                    else shuffled + tail)
    d = tmp_path_factory.mktemp("w")
    a = load_trace(write_pcap(d / "a.pcap", frames))
    b = load_trace(write_pcap(d / "b.pcap", order))
    got = [(int(b.msg_dir[i]), b.message_bytes(i)) for i in range(b.n_messages)]
    want = [(int(a.msg_dir[i]), a.message_bytes(i)) for i in range(a.n_messages)]
    assert sorted(got) == sorted(want) == sorted(msgs)
    per_dir = lambda t, d: [t.message_bytes(i) for i in range(t.n_messages) if t.msg_dir[i] == d]  # noqa: E731
    assert per_dir(a, 0) == per_dir(b, 0) and per_dir(a, 1) == per_dir(b, 1)


def test_data_after_a_flow_ended_is_counted(tmp_path):
    frames = http_connection(C4, S4, 5100, [(0, b"GET / HTTP/1.1\r\n\r\n")])
    late = tcp_frame(C4, S4, 5100, 80, 5000, 0x18, b"sneaky")  # after both FINs
    trace = load_trace(write_pcap(tmp_path / "late.pcap", frames + [late]))
    assert trace.tcp["tcp_bytes_after_close"] == len(b"sneaky")
    assert trace.flows[0].established and len(trace.flows) == 1
