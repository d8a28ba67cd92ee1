"""The CPU a worker spends per message (``Interconnect.message_cpu_us``): a CPU sender is
held for a transfer no less than that, a CPU receiver spends it in the task that reads the
message, and neither end waits for the other's compute; closed forms on small placements."""

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


def test_the_sender_holds_its_cpu_and_the_receiver_spends_its_own_per_message():
    link_ms = (10.0 + MIB * 8 / 1e6) / 1e3  # latency + 1 MiB at 1000 Gbps
    assert _placed(_cpus()) == pytest.approx(2.0 + link_ms)
    # a: 1 ms; the send: max(link, 0.5 ms of CPU); b: 1 ms after reading it (0.5 ms)
    assert _placed(_cpus(message_cpu_us=300.0, message_cpu_us_per_mib=200.0)) == \
        pytest.approx(1.0 + 0.5 + 0.5 + 1.0)
    # below the link's own time, the sender's CPU per message changes nothing
    assert _placed(_cpus(message_cpu_us=1.0, message_cpu_us_per_mib=0.0)) == \
        pytest.approx(2.0 + link_ms + 0.001)


def test_a_sender_does_not_wait_for_a_busy_receiver():
    """a (cpu0) sends to b (cpu1) while cpu1 runs c, 5 ms; cpu0 goes on with d after
    its send, so the step is c and b on cpu1: 5 + receive + 1 ms."""
    g = graph([op("a", 1.0, 0.0, device_type="cpu"), op("b", 1.0, 0.0, device_type="cpu"),
               op("c", 5.0, 0.0, device_type="cpu"), op("d", 1.0, 0.0, device_type="cpu")],
              [("a", "b", MIB), ("a", "d", MIB)])
    t = _cpus(message_cpu_us=300.0, message_cpu_us_per_mib=200.0)
    groups = [Group(id="ad", ops=("a", "d"), devices=("h/cpu0",)),
              Group(id="cb", ops=("c", "b"), devices=("h/cpu1",))]
    result = simulate(plan(g, t, groups, order={"h/cpu0": ("a", "d"), "h/cpu1": ("c", "b")}),
                      g, t)
    tg, s = result.tasks, result.schedule
    ends = {tg.describe(k): s.end_ms[k] for k in range(len(tg.kind))}
    assert ends["forward d"] == pytest.approx(1.0 + 0.5 + 1.0)
    assert result.iteration_ms == pytest.approx(5.0 + 0.5 + 1.0)


def test_message_cpu_is_affine_in_bytes_and_absent_where_not_measured():
    g = graph([op("a", device_type="cpu")])
    cm = CostModel(g, _cpus(message_cpu_us=40.0, message_cpu_us_per_mib=250.0))
    assert cm.message_cpu_ms("h/cpu0", 4 * MIB) == pytest.approx((40.0 + 4 * 250.0) / 1e3)
    assert cm.message_cpu_ms("h/cpu0", 0) == 0.0
    assert CostModel(g, _cpus()).message_cpu_ms("h/cpu0", MIB) == 0.0
    assert cm.host_transfer_ms("h/cpu0", "h/cpu0", MIB) == 0.0  # nothing moves
