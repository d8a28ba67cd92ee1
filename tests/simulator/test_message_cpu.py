"""The CPU a worker spends per message (``Interconnect.message_cpu_us``): a CPU device is
held for a transfer no less than that; closed forms on a two-op placement."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import Group, Topology, from_data
from dl_nfv.simulator import CostModel, simulate

from .helpers import graph, op, plan

MIB = 2**20


def _cpus(**figures) -> Topology:
    return from_data(Topology, {
        "name": "two-cpus",
        "hosts": [{"name": "h", "devices": [{"type": "cpu", "count": 2}],
                   "interconnect": {"kind": "loopback", "bandwidth_gbps": 1000.0,
                                    "latency_us": 10.0, **figures}}]})


def _placed(t: Topology) -> float:
    g = graph([op("a", 1.0, 0.0, device_type="cpu"), op("b", 1.0, 0.0, device_type="cpu")],
              [("a", "b", MIB)])
    groups = [Group(id="a", ops=("a",), devices=("h/cpu0",)),
              Group(id="b", ops=("b",), devices=("h/cpu1",))]
    return simulate(plan(g, t, groups), g, t).iteration_ms


def test_a_transfer_holds_cpu_ends_for_their_cpu_per_message_when_it_exceeds_the_link():
    link_ms = (10.0 + MIB * 8 / 1e6) / 1e3  # latency + 1 MiB at 1000 Gbps
    assert _placed(_cpus()) == pytest.approx(2.0 + link_ms)
    assert _placed(_cpus(message_cpu_us=300.0, message_cpu_us_per_mib=200.0)) == \
        pytest.approx(2.0 + 0.5)
    # below the link's own time, the CPU per message changes nothing
    assert _placed(_cpus(message_cpu_us=1.0, message_cpu_us_per_mib=0.0)) == \
        pytest.approx(2.0 + link_ms)


def test_message_cpu_is_affine_in_bytes_and_absent_where_not_measured():
    g = graph([op("a", device_type="cpu")])
    cm = CostModel(g, _cpus(message_cpu_us=40.0, message_cpu_us_per_mib=250.0))
    assert cm.message_cpu_ms("h/cpu0", 4 * MIB) == pytest.approx((40.0 + 4 * 250.0) / 1e3)
    assert cm.message_cpu_ms("h/cpu0", 0) == 0.0
    assert CostModel(g, _cpus()).message_cpu_ms("h/cpu0", MIB) == 0.0
    assert cm.host_transfer_ms("h/cpu0", "h/cpu0", MIB) == 0.0  # nothing moves
