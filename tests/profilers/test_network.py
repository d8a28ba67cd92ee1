"""Network probe: the latency/bandwidth fit and the topology built from measurements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import cluster_of
from dl_nfv.profilers.network import (
    DEFAULT_SIZES,
    NetworkReport,
    fit_link,
    message_cpu,
    topology_from_report,
)
from dl_nfv.simulator.costs import NetworkCosts


def _line(latency_us: float, gbps: float, sizes=DEFAULT_SIZES) -> list[float]:
    return [latency_us * 1e-6 + s * 8 / (gbps * 1e9) for s in sizes]


@settings(max_examples=50, deadline=None)
@given(latency_us=st.floats(0.5, 500), gbps=st.floats(0.1, 400))
def test_fit_recovers_an_exact_line(latency_us, gbps):
    fit = fit_link(DEFAULT_SIZES, _line(latency_us, gbps))
    assert fit.latency_us == pytest.approx(latency_us, rel=1e-6)
    assert fit.bandwidth_gbps == pytest.approx(gbps, rel=1e-6)
    assert fit.time_s(4096) == pytest.approx(_line(latency_us, gbps, [4096])[0], rel=1e-6)


def test_fit_follows_large_messages_when_mid_sized_ones_copy_faster():
    # loopback: messages that fit the caches move at 40 Gbps, large ones at 25 Gbps
    times = [40e-6 + s * 8 / (40e9 if s <= 2**20 else 25e9) for s in DEFAULT_SIZES]
    fit = fit_link(DEFAULT_SIZES, times)
    big = DEFAULT_SIZES[-1]
    assert fit.time_s(big) == pytest.approx(times[-1], rel=0.02)
    assert fit.bandwidth_gbps == pytest.approx(25.0, rel=0.05)
    assert fit.latency_us >= 0


def test_fit_clamps_a_negative_latency_to_zero():
    times = [s * 8 / 10e9 for s in DEFAULT_SIZES]
    times[0] *= 0.5  # small messages faster than the line predicts -> negative intercept
    fit = fit_link(DEFAULT_SIZES, times)
    assert fit.latency_us == 0.0 and fit.bandwidth_gbps > 0


def _report(hosts, fits, devices=None):
    n = len(hosts)
    sizes = list(DEFAULT_SIZES)
    return NetworkReport(
        backend="gloo", world_size=n, hosts=hosts, devices=devices or ["cpu"] * n, sizes=sizes,
        p2p_s={k: _line(v[1], v[0]) for k, v in fits.items()},
        allreduce_s=[1e-3] * len(sizes),
        fits={k: {"bandwidth_gbps": v[0], "latency_us": v[1]} for k, v in fits.items()},
        matmul_gflops=[50.0] * n, memory_gb_per_s=[9.0, 11.0, 10.0, 10.0][:n],
        memory_gib={h: 24.0 for h in hosts})


def test_two_local_processes_make_one_loopback_host():
    topo = topology_from_report(_report(["box", "box"], {"0-1": (12.0, 40.0)}))
    assert topo.device_names == ("box/cpu0", "box/cpu1")
    host = topo.hosts[0]
    assert host.interconnect.kind.value == "loopback"
    spec = host.devices[0]
    assert spec.type == "cpu" and spec.memory_gib == 12.0 and spec.fp32_tflops == 0.05
    assert spec.memory_bandwidth_gb_per_s == 10.0  # median of the processes' measurements
    assert cluster_of(topo).device("box/cpu0").type.memory_bandwidth_gb_per_s == 10.0
    route = cluster_of(topo).route("box/cpu0", "box/cpu1")
    # The route takes the measured link, not the host bridge.
    assert route.bandwidth_gbps == 12.0 and route.latency_us == 40.0 and len(route.hops) == 1
    assert "AllReduce" in topo.description


def test_threads_asked_for_become_the_cpu_devices_cores():
    report = _report(["box", "box"], {"0-1": (12.0, 40.0)})
    assert topology_from_report(report).hosts[0].devices[0].cores is None  # torch's share
    report.threads = 3
    topo = topology_from_report(report)
    assert topo.hosts[0].devices[0].cores == 3
    assert cluster_of(topo).device("box/cpu1").type.cpu_cores == 3


def test_three_processes_get_a_link_per_measured_pair():
    fits = {"0-1": (10.0, 30.0), "0-2": (5.0, 60.0), "1-2": (8.0, 35.0)}
    topo = topology_from_report(_report(["h"] * 3, fits))
    cluster = cluster_of(topo)
    assert cluster.route("h/cpu0", "h/cpu2").bandwidth_gbps == 5.0
    assert cluster.route("h/cpu1", "h/cpu2").latency_us == 35.0
    assert topo.hosts[0].interconnect.bandwidth_gbps == 8.0  # median of the pairs


def test_two_hosts_are_joined_through_a_switch_with_the_measured_cross_host_figures():
    fits = {"0-1": (20.0, 10.0), "2-3": (20.0, 10.0),
            "0-2": (5.0, 50.0), "0-3": (5.0, 50.0), "1-2": (5.0, 50.0), "1-3": (5.0, 50.0)}
    topo = topology_from_report(_report(["a", "a", "b", "b"], fits))
    cluster = cluster_of(topo)
    route = cluster.route("a/cpu0", "b/cpu1")
    assert route.bandwidth_gbps == 5.0
    assert route.latency_us == pytest.approx(50.0)
    assert cluster.route("a/cpu0", "a/cpu1").bandwidth_gbps == 20.0


def test_fit_takes_the_latency_from_the_small_messages_not_the_smallest_alone():
    times = _line(80.0, 25.0)
    times[0] += 1.5e-3  # one slow 1 KiB median, as a busy machine gives now and then
    fit = fit_link(DEFAULT_SIZES, times)
    assert fit.latency_us == pytest.approx(80.0, rel=1e-6)
    assert fit.bandwidth_gbps == pytest.approx(25.0, rel=1e-6)


MEMORY_GB_S = 10.0  # the median of _report's processes' memory bandwidth


def _loopback_allreduce(latency_us: float, gbps: float) -> list[float]:
    """A 2-process ring AllReduce over loopback by the cost model's closed form: two phases,
    each S/2 both ways over the shared link, and the sum of S/2 on each CPU (3 passes)."""
    return [2 * (latency_us * 1e-6 + s * 8 / (gbps * 1e9)) + 0.5 * s * 3 / (MEMORY_GB_S * 1e9)
            for s in DEFAULT_SIZES]


def test_collective_figures_are_those_that_reproduce_the_measured_allreduce():
    report = _report(["box", "box"], {"0-1": (30.0, 80.0)})
    report.allreduce_s = _loopback_allreduce(230.0, 24.0)
    topo = topology_from_report(report)
    ic = topo.hosts[0].interconnect
    assert ic.bandwidth_gbps == 30.0 and ic.latency_us == 80.0  # transfers keep the pair's
    assert ic.collective_latency_us == pytest.approx(230.0, rel=1e-3)
    assert ic.collective_bandwidth_gbps == pytest.approx(24.0, rel=1e-3)
    costs = NetworkCosts(topo)
    names = costs.cluster.device_names
    for size, seconds in zip(DEFAULT_SIZES, report.allreduce_s):
        assert costs.allreduce_ms(names, size) == pytest.approx(seconds * 1e3, rel=1e-3)
    assert costs.transfer_ms(*names, 2**20) == pytest.approx(0.08 + 2**20 * 8 / 30e6)
    assert "fitted to the measured AllReduce" in topo.description


def test_no_collective_figures_when_the_allreduce_leaves_nothing_for_the_links():
    # the constant 1 ms of _report: no time per byte above the CPU's sums
    topo = topology_from_report(_report(["box", "box"], {"0-1": (30.0, 80.0)}))
    ic = topo.hosts[0].interconnect
    assert ic.collective_latency_us is None and ic.collective_bandwidth_gbps is None


def test_no_collective_figures_beside_per_pair_links():
    fits = {"0-1": (10.0, 30.0), "0-2": (5.0, 60.0), "1-2": (8.0, 35.0)}
    report = _report(["h"] * 3, fits)
    report.allreduce_s = _loopback_allreduce(230.0, 24.0)
    assert topology_from_report(report).hosts[0].interconnect.collective_latency_us is None


def test_the_cpu_per_message_is_fitted_and_written_into_a_cpu_hosts_interconnect():
    cpu_s = [(50.0 + s / 2**20 * 300.0) * 1e-6 for s in DEFAULT_SIZES]  # 50 us + 300 us/MiB
    assert message_cpu(DEFAULT_SIZES, cpu_s) == pytest.approx((50.0, 300.0), rel=1e-6)
    report = _report(["box", "box"], {"0-1": (12.0, 40.0)})
    assert topology_from_report(report).hosts[0].interconnect.message_cpu_us is None  # older
    report.p2p_cpu_s = {"0-1": cpu_s}
    ic = topology_from_report(report).hosts[0].interconnect
    assert (ic.message_cpu_us, ic.message_cpu_us_per_mib) == pytest.approx((50.0, 300.0))
    data = report.to_data()
    assert data["p2p_cpu_per_message_s"] == {"0-1": cpu_s}
