"""Synthetic L3/L4 traffic as columns, for benchmarks: no per-packet objects.

``synthetic_packets`` lays out ``flows`` TCP connections of ``packets // flows``
packets each (handshake, data both ways, FIN/FIN/ACK teardown; a flow shorter
than seven packets is the prefix of that sequence), client 10.0.0.0/12 ports
1024-65535 -> server 10.16.0.0/16 port 80, every packet ``packet_bytes`` long.
Flows start at uniform times over the trace and send one packet per
``gap_us``; packets are ordered by time (ties by flow), so flows interleave.
Checksums are left at 0 (the chain's incremental update does not read payloads).
O(packets log packets) time, a few int64 columns of memory.
"""

from __future__ import annotations

import numpy as np

from ..traffic.pcap import ACK, FIN, SYN
from .packets import ChainPackets

_PATTERN = [(0, SYN), (1, SYN | ACK), (0, ACK)]
_CLOSE = [(0, FIN | ACK), (1, FIN | ACK), (0, ACK)]


def _pattern(m: int) -> tuple[np.ndarray, np.ndarray]:
    if m >= 6:
        data = [(k % 2, ACK) for k in range(m - 6)]
        steps = _PATTERN + data + _CLOSE
    else:
        steps = (_PATTERN + _CLOSE)[:m]
    return (np.array([d for d, _ in steps], dtype=np.int64),
            np.array([f for _, f in steps], dtype=np.int64))


def synthetic_packets(*, flows: int, packets: int, packet_bytes: int = 64, seed: int = 0,
                      duration_s: float = 1.0, gap_us: int = 100) -> ChainPackets:
    """``packets`` (rounded down to a multiple of ``flows``) packets of ``flows`` flows."""
    rng = np.random.default_rng(seed)
    m = max(1, packets // flows)
    direction, flags = _pattern(m)
    client = (10 << 24) + rng.integers(0, 1 << 20, flows, dtype=np.int64)
    cport = rng.integers(1024, 65536, flows, dtype=np.int64)
    server = (10 << 24) + (16 << 16) + rng.integers(0, 1 << 16, flows, dtype=np.int64)
    start = rng.integers(0, max(1, int(duration_s * 1e6)), flows, dtype=np.int64)
    f = np.repeat(np.arange(flows, dtype=np.int64), m)
    j = np.tile(np.arange(m, dtype=np.int64), flows)
    ts = start[f] + j * gap_us
    order = np.lexsort((f, ts))
    f, j, ts = f[order], j[order], ts[order]
    back = direction[j] == 1
    src = np.where(back, server[f], client[f])
    dst = np.where(back, client[f], server[f])
    sport = np.where(back, 80, cport[f])
    dport = np.where(back, cport[f], 80)
    n = f.shape[0]
    zeros = np.zeros(n, dtype=np.int64)
    return ChainPackets(ts_us=ts, src=src, dst=dst, sport=sport, dport=dport,
                        proto=np.full(n, 6, dtype=np.int64), flags=flags[j],
                        wire_bytes=np.full(n, packet_bytes, dtype=np.int64), ip_csum=zeros,
                        l4_csum=zeros.copy()).packed()
