"""The cost model's network figures for planners against its own transfer and AllReduce times."""

from __future__ import annotations

import itertools

import pytest

from dl_nfv.artifacts import Collective, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.simulator.costs import NetworkCosts

MIB = 2**20
SIZES = (1.0, 4 * MIB, 256 * MIB)


def _cluster(collective_gbps: float | None = None) -> NetworkCosts:
    """Two hosts of two V100s (NVLink at 50 Gbps and 1 us, below the 2 us through the host
    bridge; perhaps another figure for collectives)
    and one T4 host, NICs of 25 and 10 Gbps on one switch."""
    nvlink = {"kind": "nvlink", "bandwidth_gbps": 50, "latency_us": 1}
    if collective_gbps:
        nvlink["collective_bandwidth_gbps"] = collective_gbps
    return NetworkCosts(from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "three-hosts",
        "hosts": [{"name": f"h{i}", "devices": [{"type": "V100-16GB", "count": 2}],
                   "interconnect": nvlink,
                   "nics": [{"switch": "sw", "bandwidth_gbps": 25, "latency_us": 5}]}
                  for i in range(2)]
        + [{"name": "t", "devices": [{"type": "T4"}],
            "nics": [{"switch": "sw", "bandwidth_gbps": 10, "latency_us": 5}]}],
        "switches": [{"name": "sw"}]}))


def test_transfer_affine_is_the_transfer_time():
    net = _cluster()
    for a, b in itertools.permutations(net.cluster.device_names, 2):
        latency, per_byte = net.transfer_affine(a, b)
        for nbytes in SIZES:
            assert latency + nbytes * per_byte == pytest.approx(net.transfer_ms(a, b, nbytes))
    assert net.transfer_affine("h0/gpu0", "h0/gpu0") == (0.0, 0.0)
    # across hosts: 5 + 5 us of NICs, 1 + 1 us of host links, the 10 Gbps NIC the bottleneck
    assert net.transfer_affine("h0/gpu0", "t/gpu0")[1] == pytest.approx(8 / 10e6)


@pytest.mark.parametrize("collective_gbps", [None, 5.0, 400.0])
def test_allreduce_affine_bounds_the_allreduce_and_meets_it_for_a_ring(collective_gbps):
    net = _cluster(collective_gbps)
    names = net.cluster.device_names
    for group in (names[:2], names[:4], names):
        for algorithm in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL):
            latency, per_byte = net.allreduce_affine(group, algorithm)
            assert net.allreduce_ms(group, 0.0, algorithm) == 0.0
            for nbytes in SIZES:
                exact = net.allreduce_ms(group, nbytes, algorithm)
                assert exact <= latency + nbytes * per_byte + 1e-12
            if algorithm is Collective.RING:
                assert exact == pytest.approx(latency + nbytes * per_byte)
        # the per-byte floor is at most every algorithm's slope
        assert net.allreduce_ms_per_byte(group) <= min(
            net.allreduce_affine(group, a)[1] for a in (Collective.RING, Collective.TREE,
                                                        Collective.HIERARCHICAL)) + 1e-18
    with pytest.raises(ValueError):
        net.allreduce_affine(names, Collective.AUTO)


def test_a_collective_figure_is_seen_by_allreduce_links_only():
    """Two V100s of one host, NVLink at 50 Gbps, 400 Gbps for collectives: a two-device ring
    moves S bytes each way over the link at the collective figure; a transfer, the link's."""
    net = _cluster(400.0)
    hop = ("h0/gpu0", "h0/gpu1")
    assert net.link_ms_per_byte(hop) == pytest.approx(8 / 50e6)
    assert net.link_ms_per_byte(hop, collective=True) == pytest.approx(8 / 400e6)
    assert net.route_ms_per_byte(*hop, collective=True) == pytest.approx(8 / 400e6)
    assert net.allreduce_affine(hop, Collective.RING)[1] == pytest.approx(8 / 400e6)
    assert net.transfer_affine(*hop)[1] == pytest.approx(8 / 50e6)


def test_inbound_and_capacity_graph():
    net = _cluster()
    # a V100 receives over its NVLink to the other V100 and its PCIe link to the host
    assert 1 / net.inbound_ms_per_byte(["h0/gpu0"]) == pytest.approx((50 + 126) * 1e6 / 8)
    host = ["h0", "h0/gpu0", "h0/gpu1"]
    assert net.inbound_ms_per_byte(host) == pytest.approx(8 / 25e6)  # its NIC
    graph = net.capacity_graph()
    assert graph.edges["h0", "sw"]["bytes_per_ms"] == pytest.approx(25e6 / 8)
