"""The tensor chain equals the per-packet reference, packet for packet and state for state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from dl_nfv.artifacts import from_data, load
from dl_nfv.artifacts.nfconfig import NfConfig
from dl_nfv.nfv.chains.engine import OUT_FIELDS, build_chain
from dl_nfv.nfv.chains.packets import ChainPackets, load_packets
from dl_nfv.nfv.chains.reference import maglev_table
from dl_nfv.nfv.traffic.pcap import ACK, FIN, RST, SYN

from ..helpers import EXAMPLES, REAL_TRACE

FLAGS = [SYN, SYN | ACK, ACK, FIN | ACK, RST, RST | ACK, ACK | 0x08, 0]


def small_chain(pool_ports: str = "5000-5003", rate: bool = True) -> NfConfig:
    """Every NF, with short time-outs, a tiny NAT pool and a small Maglev table."""
    timeouts = {"syn_s": 0.05, "established_s": 0.2, "fin_s": 0.1, "closing_s": 0.03,
                "udp_s": 0.08}
    chain = [
        {"nf": "firewall", "default": "allow", "timeouts": timeouts,
         "acl": [{"action": "deny", "proto": "tcp", "src": "10.0.0.3/32"},
                 {"action": "deny", "proto": "udp", "dst_port": "53"}]},
        {"nf": "nat", "pool": ["192.0.2.1"], "ports": pool_ports, "timeouts": timeouts},
        {"nf": "lb", "backends": ["10.9.0.1:8080", "10.9.0.2", "10.9.0.3:81"],
         "table_size": 13, "timeouts": timeouts},
        {"nf": "monitor", "timeouts": timeouts},
    ]
    if rate:
        chain.append({"nf": "rate-limit", "rate_bytes_per_s": 200_000, "burst_bytes": 3000,
                      "timeouts": timeouts})
    return from_data(NfConfig, {"kind": "nf-config", "schema_version": 1, "name": "t",
                                "l4_chain": chain, "l4_engine": {"sweep_interval_s": 0.05}})


def run_both(specs, packets: ChainPackets, batch_sizes, *, between=None, capacity=16,
             sweep_s=0.05):
    """Drive both engines over the same batches; assert equal outcomes; return the chains."""
    chains = [build_chain(specs, engine, capacity=capacity, sweep_interval_s=sweep_s)
              for engine in ("cpu", "tensor")]
    start, k = 0, 0
    while start < len(packets):
        size = batch_sizes[k % len(batch_sizes)]
        batch = packets.slice(start, start + size)
        ref, ten = (c.run_batch(batch) for c in chains)
        np.testing.assert_array_equal(ref.stage, ten.stage)
        np.testing.assert_array_equal(ref.reason, ten.reason)
        for name in OUT_FIELDS:
            np.testing.assert_array_equal(ref.fields[name], ten.fields[name], err_msg=name)
        if between is not None:
            between(k, chains)
        start += size
        k += 1
    for a, b in zip(*(c.nfs for c in chains)):
        assert a.snapshot() == b.snapshot(), type(a).__name__
    return chains


def test_real_trace_every_batch_size():
    packets = load_packets(REAL_TRACE).packets
    specs = load(EXAMPLES / "fw-nat-lb.yaml").l4_chain
    for sizes in ([5], [64, 3], [10_000]):
        ref, _ = run_both(specs, packets, sizes)
        assert ref.nfs[-1].snapshot()  # the monitor saw the trace's flows
    ref, ten = run_both(small_chain().l4_chain, packets, [16])
    assert ref.nfs[1].translations == ten.nfs[1].translations > 0


@hs.composite
def traces(draw):
    n = draw(hs.integers(1, 160))
    hosts = draw(hs.integers(1, 5))
    rows = []
    ts = 0
    for _ in range(n):
        ts += draw(hs.sampled_from([0, 1, 500, 20_000, 60_000, 250_000]))
        a, b = draw(hs.integers(1, hosts)), draw(hs.integers(1, hosts))
        pa, pb = draw(hs.sampled_from([80, 53, 1000])), draw(hs.sampled_from([80, 1000, 1001]))
        udp = draw(hs.booleans()) and draw(hs.booleans())
        flags = 0 if udp else draw(hs.sampled_from(FLAGS))
        size = draw(hs.sampled_from([60, 1500]))
        rows.append((ts, (10 << 24) + a, (10 << 24) + b, pa, pb, 17 if udp else 6, flags, size))
    cols = np.array(rows, dtype=np.int64).reshape(n, 8)
    sizes = draw(hs.lists(hs.integers(1, 40), min_size=1, max_size=4))
    return ChainPackets(ts_us=cols[:, 0], src=cols[:, 1], dst=cols[:, 2], sport=cols[:, 3],
                        dport=cols[:, 4], proto=cols[:, 5], flags=cols[:, 6],
                        wire_bytes=cols[:, 7], ip_csum=np.full(n, 0x1234, dtype=np.int64),
                        l4_csum=np.where(cols[:, 5] == 17, -1, 0x4321)), sizes


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_random_interleavings(case):
    packets, sizes = case
    run_both(small_chain().l4_chain, packets, sizes)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_random_interleavings_many(case):
    packets, sizes = case
    run_both(small_chain().l4_chain, packets, sizes)


def _syn_flood(flows: int) -> ChainPackets:
    n = flows
    ip = (10 << 24) + 1 + np.arange(n, dtype=np.int64) % 200
    port = 1024 + np.arange(n, dtype=np.int64)
    return ChainPackets(ts_us=np.arange(n, dtype=np.int64) * 10, src=ip,
                        dst=np.full(n, (10 << 24) + 250), sport=port, dport=np.full(n, 80),
                        proto=np.full(n, 6), flags=np.full(n, SYN), wire_bytes=np.full(n, 60),
                        ip_csum=np.zeros(n, dtype=np.int64), l4_csum=np.zeros(n, dtype=np.int64))


def test_syn_flood_exhausts_the_nat_pool():
    packets = _syn_flood(300)
    ref, ten = run_both(small_chain(rate=False).l4_chain, packets, [64, 17])
    denied = int((packets.src == (10 << 24) + 3).sum())  # the ACL's blocked client
    for chain in (ref, ten):
        nat = chain.nfs[1]
        assert nat.translations == 4 and nat.exhausted == 300 - denied - 4
        assert nat.in_use() == 4


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), hs.integers(0, 3))
def test_backend_change_mid_flow(case, when):
    packets, sizes = case
    changes = [["10.9.0.2", "10.9.0.4:90"], ["10.9.0.5"]]

    def between(k, chains):
        if k == when or k == when + 2:
            for chain in chains:
                chain.nfs[2].set_backends(changes[(k - when) // 2])

    ref, _ = run_both(small_chain().l4_chain, packets, sizes, between=between)
    # affinity: every live session still names a backend it was given
    for entry in ref.nfs[2].snapshot().values():
        assert entry[3] < len(ref.nfs[2].backends.names)


def test_maglev_balance_and_affinity():
    names = [f"b{k}" for k in range(7)]
    table = maglev_table(names, 65537)
    counts = np.bincount(table, minlength=7)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 65537
    fewer = maglev_table(names[:-1], 65537)
    kept = sum(1 for a, b in zip(table, fewer) if a == b and a != 6)
    assert kept / (65537 - counts[6]) > 0.9  # Maglev's minimal disruption (paper: ~1-2% move)


def test_a_batch_the_firewall_drops_whole():
    flood = _syn_flood(5)
    flood.src[:] = (10 << 24) + 3  # the ACL's blocked client
    chains = run_both(small_chain().l4_chain, flood, [5])
    for chain in chains:
        assert chain.nfs[1].translations == 0 and chain.nfs[3].snapshot() == {}
    for chain in chains:
        assert len(chain.run_batch(flood.slice(0, 0)).stage) == 0
