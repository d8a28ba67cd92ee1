"""The whole-block and whole-stream fast paths equal their message-by-message references.

* ``http.frame_whole`` (clean flows' streams framed over offsets) against ``http.Framer``
  fed the same stream: the same messages where the framer counts nothing, and None
  wherever it would count something or frame differently packet by packet.
* ``Firewall.cpu_block``, ``Ids.cpu_block`` and ``Monitor.cpu_block`` (a worker's block at once, one Hyperscan
  scan per matcher) against ``cpu`` called message by message: the same alerts, monitor
  rows and per-flow state (tails and patterns seen), over several blocks, with patterns
  split across messages and blocks, both directions interleaved and messages dropped
  before the NF.
"""

from __future__ import annotations

import random
from collections import Counter, deque

import numpy as np
import pytest

from dl_nfv.nfv.nfs import ids as ids_module
from dl_nfv.nfv.nfs.base import FlowTable, Outputs
from dl_nfv.nfv.nfs.chain import Block, MessageContext
from dl_nfv.nfv.nfs.firewall import Firewall
from dl_nfv.nfv.nfs.ids import Ids
from dl_nfv.nfv.nfs.monitor import Monitor
from dl_nfv.nfv.nfs.snort import parse_rules
from dl_nfv.nfv.run import load_config
from dl_nfv.nfv.traffic.http import (
    MAX_CHUNK_LINE,
    MAX_HEADER_BYTES,
    REQUEST,
    RESPONSE,
    Framer,
    frame_whole,
)

from .helpers import EXAMPLES

# framing -------------------------------------------------------------------------------

_REQUESTS = [
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /p HTTP/1.1\r\ncontent-length : 3\r\nContent-Length: 3\r\n\r\nabc",
    b"PUT /c HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\n\r\n",
    b"GET /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-T: 1\r\n\r\n",
    b"GET /bad HTTP/1.1\r\nno colon here\r\n\r\n",  # framing error
    b"get /lower HTTP/1.1\r\n\r\n",  # bad start line
    b"POST /p HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /cut HTTP/1.1\r\nContent-Length: 50\r\n\r\nshort",  # incomplete
    b"GET /x HTTP/1.1\r\nX:" + b"a" * (MAX_HEADER_BYTES + 10) + b"\r\n\r\n",  # header too long
]
_RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"1" + b" " * (MAX_CHUNK_LINE + 5) + b"\r\nx\r\n0\r\n\r\n",  # chunk-size line too long
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk
    b"HTTP/1.0 404\r\nContent-Length: 2\r\n\r\nno",
    b"HTTP/1.1 200 OK\r\nServer: s\r\n\r\nuntil the close",  # close-delimited
]


def _framer(stream: bytes, side: int, requests: deque):
    """What the array path must reproduce: ``Framer``'s messages and whether it counted
    anything (or framed a header or chunk line the packet-by-packet path may not)."""
    stats: Counter = Counter()
    framer = Framer(side, requests, stats)
    msgs = [(m[0], m[1], m[2], False) for m in (framer.feed(stream, 0) if stream else [])]
    msgs += [(m[0], m[1], m[2], True) for m in framer.finish()]
    odd = (stats or framer.longest_chunk_line > MAX_CHUNK_LINE
           or any(m[2] > MAX_HEADER_BYTES for m in msgs))
    return None if odd else msgs


@pytest.mark.parametrize("seed", range(4))
def test_frame_whole_equals_the_framer(seed):
    rng = random.Random(seed)
    for _ in range(400):
        reqs = b"".join(rng.choice(_REQUESTS[:6] if rng.random() < 0.7 else _REQUESTS)
                        for _ in range(rng.randrange(0, 4)))
        resps = b"".join(rng.choice(_RESPONSES[:6] if rng.random() < 0.7 else _RESPONSES)
                         for _ in range(rng.randrange(0, 4)))
        if rng.random() < 0.2:  # cut anywhere
            resps = resps[:rng.randrange(0, len(resps) + 1)]
        pad = bytes(rng.randrange(0, 5))  # the streams sit inside a larger buffer
        buf = pad + reqs + pad + resps + pad
        ref_q, fast_q = deque(), deque()
        ref = [_framer(reqs, REQUEST, ref_q)]
        fast = [frame_whole(buf, REQUEST, fast_q, len(pad), len(pad) + len(reqs))]
        if ref[0] is not None:
            ref.append(_framer(resps, RESPONSE, ref_q))
            start = 2 * len(pad) + len(reqs)
            fast.append(frame_whole(buf, RESPONSE, fast_q, start, start + len(resps)))
        for side, (r, f) in enumerate(zip(ref, fast)):
            if r is None:
                assert f is None, (reqs, resps)
                continue
            assert f is not None, (reqs, resps)
            base = len(pad) if side == 0 else 2 * len(pad) + len(reqs)
            got = [(a, buf[base + a:base + a + n], h, c) for a, n, h, c in f]
            assert got == r


# whole blocks ----------------------------------------------------------------------------

_RULES = parse_rules("""
alert tcp any any -> any 80 (msg:"a"; content:"abab"; sid:1;)
alert tcp any any -> any 80 (msg:"b"; content:"AB"; nocase; content:"ba"; sid:2;)
alert tcp any 80 -> any any (msg:"c"; content:"bbb"; flow:to_client; sid:3;)
alert tcp any any <> any 80 (msg:"d"; content:"aXa"; nocase; sid:4;)
alert tcp any any -> any any (msg:"e"; content:"b"; content:"aa"; flow:established; sid:5;)
""")


def _v4(rng: random.Random, net: tuple[int, ...]) -> list[int]:
    """An address of ``net`` (its first 3 bytes) as the NFs keep it: IPv4 mapped into IPv6."""
    addr = bytes(net) + bytes([rng.randrange(1, 255)])
    return [0, (0xFFFF << 32) | int.from_bytes(addr, "big")]


def _flows(n: int, rng: random.Random) -> FlowTable:
    return FlowTable(proto=np.full(n, 6, dtype=np.int64),
                     client_port=np.array([rng.choice([1024, 80, 5000]) for _ in range(n)]),
                     server_port=np.array([rng.choice([80, 80, 8080]) for _ in range(n)]),
                     client_addr=np.array([_v4(rng, rng.choice([(10, 0, 1), (10, 0, 2)]))
                                           for _ in range(n)], dtype=np.int64),
                     server_addr=np.array([_v4(rng, (10, 1, 0)) for _ in range(n)],
                                          dtype=np.int64), names=["tcp"] * n,
                     established=np.array([rng.random() < 0.7 for _ in range(n)]))


def _blocks(rng: random.Random, flows: int, count: int) -> list[tuple[Block, bytes, np.ndarray]]:
    """Blocks of messages over a small alphabet, with offsets into one shared payload."""
    out, index = [], Counter()
    for _ in range(count):
        n = rng.randrange(1, 40)
        payloads = [bytes(rng.choice(b"abAxX") for _ in range(rng.randrange(0, 12)))
                    for _ in range(n)]
        flow = np.array([rng.randrange(flows) for _ in range(n)], dtype=np.int64)
        idx = []
        for f in flow.tolist():
            idx.append(index[f])
            index[f] += 1
        lengths = np.array([len(p) for p in payloads], dtype=np.int64)
        lead = rng.randrange(0, 3)
        payload = bytes(lead) + b"".join(payloads)
        block = Block(flow=flow, direction=np.array([rng.randrange(2) for _ in range(n)]),
                      index=np.array(idx, dtype=np.int64), length=lengths,
                      header_len=np.zeros(n, dtype=np.int64), kind=np.zeros(n, dtype=np.int64),
                      ts_us=np.array([rng.randrange(10**6) for _ in range(n)]),
                      packets=np.array([rng.randrange(1, 4) for _ in range(n)]), blob=b"",
                      offset=lead + np.cumsum(lengths) - lengths)
        alive = np.array([rng.random() < 0.85 for _ in range(n)])
        out.append((block, payload, alive))
    return out


@pytest.mark.parametrize("scan_bytes", [1 << 20, 40, 1])
@pytest.mark.parametrize("backend", ["hyperscan", "ahocorasick"])
def test_block_nfs_equal_message_by_message(monkeypatch, backend, scan_bytes):
    """Also with the IDS's streams scanned a few (``SCAN_BYTES`` 40) or one at a time."""
    if backend == "hyperscan" and ids_module.hyperscan is None:
        pytest.skip("hyperscan does not load here")
    if backend == "ahocorasick":
        monkeypatch.setattr(ids_module, "hyperscan", None)
    monkeypatch.setattr(ids_module, "SCAN_BYTES", scan_bytes)
    for seed in range(6):
        rng = random.Random(seed)
        flows = _flows(8, rng)
        firewall = load_config(EXAMPLES / "firewall.yaml").chain[0]  # denies 10.0.1.0/24
        nfs = [Firewall(firewall, flows), Monitor(None, flows), Ids(None, flows, rules=_RULES)]
        ref_states: dict = {}
        states: dict = {}
        ref_out, out = Outputs(), Outputs()
        for block, payload, alive in _blocks(rng, 8, 6):
            data, starts = block.bytes_and_starts(payload)
            ctx = MessageContext()
            for row in np.flatnonzero(alive).tolist():
                flow = int(block.flow[row])
                state = ref_states.setdefault(flow, [nf.cpu_state(flow) for nf in nfs])
                ctx.flow, ctx.index = flow, int(block.index[row])
                ctx.direction, ctx.ts_us = int(block.direction[row]), int(block.ts_us[row])
                ctx.packets = int(block.packets[row])
                start = int(starts[row])
                for nf, s in zip(nfs, state):
                    if not nf.cpu(s, ctx, data[start:start + int(block.length[row])], ref_out):
                        break
            for flow in np.unique(block.flow).tolist():
                states.setdefault(flow, [nf.cpu_state(flow) for nf in nfs])
            for position, nf in enumerate(nfs):
                alive = nf.cpu_block(block, data, starts, alive, states, position, out)
        assert sorted(out.alerts) == sorted(ref_out.alerts)
        assert sorted(map(tuple, out.table("drops", 2).tolist())) == sorted(ref_out.drops)
        for flow, state in ref_states.items():
            assert [nf.export_flow(s) for nf, s in zip(nfs, states[flow]) if nf.portable] == \
                [nf.export_flow(s) for nf, s in zip(nfs, state) if nf.portable]
        assert _monitor_rows(out) == _monitor_rows(ref_out)
        assert ref_out.alerts and ref_out.drops  # the seeds do reach alerts and drops


def _monitor_rows(out: Outputs) -> dict:
    rows: dict = {}
    for f, m, p, b, first, last in out.table("monitor", 6).tolist():
        r = rows.setdefault(f, [0, 0, 0, first, last])
        r[0], r[1], r[2] = r[0] + m, r[1] + p, r[2] + b
        r[3], r[4] = min(r[3], first), max(r[4], last)
    return rows


_NAMES = (b"Content-Length", b"content-length", b" CONTENT-LENGTH\t", b"Content-Lengthx",
          b"Transfer-Encoding", b"\x0btransfer-encoding ", b"Host", b"X", b"", b"\rContent-Length",
          b"Content-Length\n", b"a: Content-Length")
_VALUES = (b" 3", b"3", b" 03 ", b"-1", b"1x", b" chunked", b"gzip, Chunked ", b"chunked, gzip",
           b"", b" \r", b"\n3", b"9" * 16, b":3")


@pytest.mark.parametrize("seed", range(2))
def test_header_lines_equal_the_framer(seed):
    """Header lines of every odd shape (blanks and stray CR/LF around names and values,
    missing colons, repeated or conflicting lengths, encodings) frame as ``Framer`` does."""
    rng = random.Random(seed)
    for _ in range(1500):
        lines = []
        for _ in range(rng.randrange(0, 5)):
            line = rng.choice(_NAMES)
            if rng.random() < 0.93:
                line += b":" + rng.choice(_VALUES)
            lines.append(line)
        body = b"abc\r\n0\r\n\r\n" if rng.random() < 0.5 else b"abcdefgh"
        side = rng.choice([REQUEST, RESPONSE])
        start = b"POST /x HTTP/1.1" if side == REQUEST else b"HTTP/1.1 200 OK"
        stream = b"\r\n".join([start, *lines]) + b"\r\n\r\n" + body
        ref_q, fast_q = deque([b"GET"]), deque([b"GET"])
        ref = _framer(stream, side, ref_q)
        fast = frame_whole(stream, side, fast_q)
        if ref is None:
            assert fast is None, stream
            continue
        assert fast is not None, stream
        assert [(a, stream[a:a + n], h, c) for a, n, h, c in fast] == ref, stream
