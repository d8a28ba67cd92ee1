"""Topology compilation: device naming, routes, bottlenecks, the example files."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import CATALOG, InvalidArtifact, UnknownName, cluster_of, load, lookup
from dl_nfv.artifacts.records import from_data
from dl_nfv.artifacts.topology import Topology
from tests.conftest import TOPOLOGIES


def _topo(**extra):
    doc = {"kind": "topology", "schema_version": 1, "name": "t",
           "hosts": [{"name": "h0", "devices": [{"type": "V100-16GB", "count": 2}],
                      "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1}}]}
    doc.update(extra)
    return from_data(Topology, doc)


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_every_example_loads_and_compiles(path):
    topo = load(path, expect="topology")
    cluster = cluster_of(topo)
    names = cluster.device_names
    assert len(names) >= 2
    for a in names:
        for b in names:
            route = cluster.route(a, b)
            assert (a == b) == (route.hops == ())
            if a != b:
                assert route.hops[0][0] == a and route.hops[-1][1] == b
                bws = [cluster.link(u, v)["bandwidth_gbps"] for u, v in route.hops]
                assert route.bandwidth_gbps == min(bws)
                lat = sum(cluster.link(u, v)["latency_us"] for u, v in route.hops)
                assert route.latency_us == pytest.approx(lat)


def test_expected_example_sizes():
    sizes = {p.stem: len(cluster_of(load(p)).devices) for p in TOPOLOGIES}
    assert sizes == {"a100-2x4-100g": 8, "a100-2x4-25g": 8, "a100-4x8-leafspine": 32,
                     "heterog-testbed8": 8, "local-cpu": 2, "mixed-a100-t4-2rack": 12,
                     "ring8-mixed": 8, "tag-hetero16": 16, "v100x8-nvlink": 8}
    tag = cluster_of(load([p for p in TOPOLOGIES if p.stem == "tag-hetero16"][0]))
    kinds = sorted(d.type.name for d in tag.devices)
    assert kinds.count("V100-32GB") == 4 and kinds.count("1080Ti") == 8 and kinds.count("P100") == 4


def test_device_names_and_overrides():
    topo = _topo(hosts=[{"name": "h", "devices": [
        {"type": "T4", "count": 2}, {"type": "cpu", "count": 1},
        {"type": "A10", "count": 1, "memory_gib": 12}]}])
    cluster = cluster_of(topo)
    assert cluster.device_names == ("h/gpu0", "h/gpu1", "h/cpu0", "h/gpu2")
    assert cluster.device("h/gpu2").type.memory_gib == 12
    assert CATALOG["A10"].memory_gib == 24  # the catalog itself is untouched


def test_nvlink_route_beats_pcie_and_transfer_time():
    cluster = cluster_of(_topo())
    route = cluster.route("h0/gpu0", "h0/gpu1")
    assert route.hops == (("h0/gpu0", "h0/gpu1"),)
    # 1 us + 25e6 bytes * 8 / 200e9 b/s = 1 us + 1000 us
    assert route.transfer_us(25e6) == pytest.approx(1001.0)


def test_ties_on_latency_take_the_widest_path():
    topo = _topo(hosts=[{"name": f"h{i}", "devices": [{"type": "T4"}]} for i in range(3)],
                 switches=[{"name": "s1"}, {"name": "s2"}],
                 links=[{"endpoints": ["h0", "s1"], "bandwidth_gbps": 10, "latency_us": 1},
                        {"endpoints": ["s1", "h1"], "bandwidth_gbps": 10, "latency_us": 1},
                        {"endpoints": ["h0", "s2"], "bandwidth_gbps": 40, "latency_us": 1},
                        {"endpoints": ["s2", "h1"], "bandwidth_gbps": 40, "latency_us": 1},
                        {"endpoints": ["h2", "s2"], "bandwidth_gbps": 40, "latency_us": 1}])
    route = cluster_of(topo).route("h0/gpu0", "h1/gpu0")
    assert route.bandwidth_gbps == 40
    assert ("h0", "s2") in route.hops


def test_ring_routes_go_around_the_slow_link():
    cluster = cluster_of(load([p for p in TOPOLOGIES if p.stem == "ring8-mixed"][0]))
    # r3 -> r4 directly is 10 Gbps at 10 us; the other way round is 7 hops with more latency.
    assert cluster.route("r3/gpu0", "r4/gpu0").bandwidth_gbps == 10
    # r0 -> r2: via r1 (2 + 5 us) rather than via r7..r3 (far more latency)
    r = cluster.route("r0/gpu0", "r2/gpu0")
    assert [v for _, v in r.hops] == ["r1/gpu0", "r2/gpu0"] and r.bandwidth_gbps == 25


def test_unknown_device_type_lists_known_ones():
    with pytest.raises(UnknownName, match="known: .*A100-40GB"):
        lookup("NOPE-9000")
    with pytest.raises(InvalidArtifact, match=r"hosts\[0\]\.devices\[0\]\.type: unknown device type"):
        _topo(hosts=[{"name": "h", "devices": [{"type": "NOPE-9000"}]}])


def test_user_device_types_extend_the_catalog():
    topo = _topo(device_types=[{"name": "MyAccel", "memory_gib": 48, "fp32_tflops": 50,
                                "fp16_tflops": 400, "memory_bandwidth_gb_per_s": 2000}],
                 hosts=[{"name": "h", "devices": [{"type": "MyAccel", "count": 2}]}])
    assert cluster_of(topo).device("h/gpu1").type.fp16_tflops == 400


def test_catalog_has_the_required_types():
    for name in ("P100", "V100-16GB", "V100-32GB", "1080Ti", "T4", "A10", "L4", "A100-40GB",
                 "A100-80GB", "H100", "H200", "RTX-3090", "RTX-4090", "cpu"):
        t = CATALOG[name]
        assert t.memory_gib > 0 and t.fp32_tflops > 0 and t.memory_bandwidth_gb_per_s > 0
        assert t.datasheet
    assert CATALOG["H200"].memory_gib == 141 and CATALOG["A100-80GB"].memory_bandwidth_gb_per_s == 2039


def test_loopback_processes_talk_over_the_measured_path():
    topo = _topo(hosts=[{"name": "local", "devices": [{"type": "cpu", "count": 2}],
                         "interconnect": {"kind": "loopback", "bandwidth_gbps": 8, "latency_us": 40}}])
    cluster = cluster_of(topo)
    route = cluster.route("local/cpu0", "local/cpu1")
    assert route.hops == (("local/cpu0", "local/cpu1"),)
    assert route.bandwidth_gbps == 8 and route.latency_us == 40


def test_collective_figures_ride_on_the_links_inside_the_host():
    ic = {"kind": "loopback", "bandwidth_gbps": 8, "latency_us": 40,
          "collective_latency_us": 100, "collective_bandwidth_gbps": 6}
    cluster = cluster_of(_topo(hosts=[{"name": "h", "devices": [{"type": "cpu", "count": 3}],
                                       "interconnect": ic}]))
    link = cluster.link("h/cpu0", "h/cpu1")
    assert (link["latency_us"], link["bandwidth_gbps"]) == (40, 8)
    assert (link["collective_latency_us"], link["collective_bandwidth_gbps"]) == (100, 6)
    # routes stay those of transfers
    assert cluster.route("h/cpu0", "h/cpu2").latency_us == 40
    # an explicit link replaces the interconnect's, its figures and all
    cluster = cluster_of(_topo(
        hosts=[{"name": "h", "devices": [{"type": "cpu", "count": 2}], "interconnect": ic}],
        links=[{"endpoints": ["h/cpu0", "h/cpu1"], "bandwidth_gbps": 5, "latency_us": 10}]))
    assert "collective_latency_us" not in cluster.link("h/cpu0", "h/cpu1")
    # pcie: device-device traffic crosses the host links, which carry them
    pcie = {**ic, "kind": "pcie"}
    cluster = cluster_of(_topo(hosts=[{"name": "h", "devices": [{"type": "V100-16GB", "count": 2}],
                                       "interconnect": pcie}]))
    assert cluster.link("h/gpu0", "h")["collective_bandwidth_gbps"] == 6


def test_collective_figures_default_to_the_links_own():
    from dl_nfv.artifacts.topology import Interconnect, InterconnectKind

    ic = Interconnect(kind=InterconnectKind.NVLINK, bandwidth_gbps=300.0, latency_us=2.0,
                      collective_bandwidth_gbps=200.0)
    assert ic.collective_figures == (2.0, 200.0)
    assert Interconnect(kind=InterconnectKind.NVLINK, bandwidth_gbps=300.0).collective_figures is None


def test_local_cpu_example_holds_every_figure_profile_network_measures_on_one_cpu_host():
    """The README's sequence plans on this measured file: it must carry what the probe now
    writes for CPU workers on one host (a file from an older probe lacked the CPU per
    message, so every transfer held its sender for the link's whole latency)."""
    topo = load([p for p in TOPOLOGIES if p.stem == "local-cpu"][0])
    (host,) = topo.hosts
    ic = host.interconnect
    assert ic.message_cpu_us > 0 and ic.message_cpu_us_per_mib > 0
    assert ic.collective_latency_us > 0 and ic.collective_bandwidth_gbps > 0
    (devices,) = host.devices
    assert devices.cores == 1 and devices.memory_bandwidth_gb_per_s > 0 and devices.fp32_tflops > 0
