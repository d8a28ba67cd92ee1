"""The cost model's host-memory terms, motivated by what ``dl-nfv train`` measured with gloo.

Between processes of one host (``loopback``), an exchange both ways took twice
one transfer, and a collective's sums ran on the CPU between transfers. These
tests pin the closed forms the cost model gives for them, and that GPUs over
NVLink keep the plain link model.
"""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import OpGraph, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.simulator.costs import REDUCE_PASSES, CostModel, Flow

MIB = 2**20
GBPS = 8.0
LAT_US = 40.0


def _model(kind: str, device_type: str, n: int = 2, latency_us: float = LAT_US,
           **collective) -> CostModel:
    topo = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "t",
        "hosts": [{"name": "h", "devices": [{"type": device_type, "count": n}],
                   "interconnect": {"kind": kind, "bandwidth_gbps": GBPS,
                                    "latency_us": latency_us, **collective}}]})
    graph = from_data(OpGraph, {"kind": "op-graph", "schema_version": 1,
                                "model": {"name": "m", "batch_size": 1},
                                "ops": [{"id": "a", "name": "a"}]})
    return CostModel(graph, topo)


def _ms(nbytes: float) -> float:
    return nbytes * 8 / (GBPS * 1e6)


def test_loopback_directions_share_the_link():
    cm = _model("loopback", "cpu")
    a, b = (d.name for d in cm.cluster.devices)
    one = cm.concurrent_ms([Flow(a, b, 64 * MIB)])
    both = cm.concurrent_ms([Flow(a, b, 64 * MIB), Flow(b, a, 64 * MIB)])
    assert one == pytest.approx(LAT_US / 1e3 + _ms(64 * MIB))
    assert both == pytest.approx(LAT_US / 1e3 + 2 * _ms(64 * MIB))


def test_nvlink_directions_stay_independent():
    # (a latency below the host bridge's two hops, so the direct link is the route)
    cm = _model("nvlink", "V100-16GB", latency_us=0.5)
    a, b = (d.name for d in cm.cluster.devices)
    both = cm.concurrent_ms([Flow(a, b, 64 * MIB), Flow(b, a, 64 * MIB)])
    assert both == pytest.approx(0.5 / 1e3 + _ms(64 * MIB))


def test_cpu_ring_allreduce_over_loopback_closed_form():
    cm = _model("loopback", "cpu")
    names = [d.name for d in cm.cluster.devices]
    s = 64 * MIB
    bw = cm.cluster.devices[0].type.memory_bandwidth_gb_per_s
    # two phases, each S/2 both ways on the shared link, and the sum of S/2 on each CPU
    want = 2 * (LAT_US / 1e3 + _ms(s)) + 0.5 * s * REDUCE_PASSES / (bw * 1e6)
    from dl_nfv.artifacts import Collective

    assert cm.allreduce_ms(names, s, Collective.RING) == pytest.approx(want)


def test_cpu_parameter_server_push_pays_the_servers_sum():
    cm = _model("loopback", "cpu", n=3)
    names = [d.name for d in cm.cluster.devices]
    s = 16 * MIB
    bw = cm.cluster.devices[0].type.memory_bandwidth_gb_per_s
    push, pull = cm.ps_phases_ms(names, names[:1], s)
    # two workers push S to the server over its links; the server sums both
    assert push == pytest.approx(LAT_US / 1e3 + _ms(s) + 2 * s * REDUCE_PASSES / (bw * 1e6))
    assert pull == pytest.approx(LAT_US / 1e3 + _ms(s))


def test_allreduce_takes_the_collective_figures_and_nothing_else_does():
    col_lat, col_gbps = 3 * LAT_US, GBPS / 2
    cm = _model("loopback", "cpu", n=3, collective_latency_us=col_lat,
                collective_bandwidth_gbps=col_gbps)
    plain = _model("loopback", "cpu", n=3)
    names = [d.name for d in cm.cluster.devices]
    s = 64 * MIB
    bw = cm.cluster.devices[0].type.memory_bandwidth_gb_per_s
    from dl_nfv.artifacts import Collective

    # three devices: each ring step sends S/3 over its own pair link, 2(n-1) = 4 steps
    want = 4 * (col_lat / 1e3 + s / 3 * 8 / (col_gbps * 1e6)) + 2 / 3 * s * REDUCE_PASSES / (bw * 1e6)
    assert cm.allreduce_ms(names, s, Collective.RING) == pytest.approx(want)
    assert cm.allreduce_ms(names, s, Collective.TREE) > plain.allreduce_ms(names, s, Collective.TREE)
    # transfers, parameter servers, all-gathers and broadcasts keep the links' own figures
    assert cm.transfer_ms(names[0], names[1], s) == plain.transfer_ms(names[0], names[1], s)
    assert cm.ps_phases_ms(names, names[:1], s) == plain.ps_phases_ms(names, names[:1], s)
    assert cm.allgather_ms(names, s) == plain.allgather_ms(names, s)
    assert cm.broadcast_ms(names[0], names, s) == plain.broadcast_ms(names[0], names, s)
    # the same link bytes either way
    assert (cm.collective_link_bytes("allreduce", names, s, algorithm=Collective.RING)
            == plain.collective_link_bytes("allreduce", names, s, algorithm=Collective.RING))
