"""Rich rendering of a ``topology``: hosts, devices, links and the bandwidth matrix."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts import Topology, cluster_of

MATRIX_LIMIT = 32


def _fmt_bw(gbps: float) -> str:
    return f"{gbps:g}" if gbps < 1000 else f"{gbps / 1000:g}T"


def render(topology: Topology) -> Group:
    cluster = cluster_of(topology)
    parts = []
    hosts = Table(title=f"topology {topology.name}: {len(cluster.devices)} devices on "
                        f"{len(topology.hosts)} hosts", title_justify="left")
    for col in ("host", "devices", "interconnect", "FP32 TFLOP/s", "memory GiB", "NICs"):
        hosts.add_column(col, justify="right" if "/" in col or "GiB" in col else "left")
    total_tflops = total_mem = 0.0
    for host in topology.hosts:
        devs = [d for d in cluster.devices if d.host == host.name]
        tflops = sum(d.type.fp32_tflops for d in devs)
        mem = sum(d.type.memory_gib for d in devs)
        total_tflops += tflops
        total_mem += mem
        kinds: dict[str, int] = {}
        for d in devs:
            kinds[d.type.name] = kinds.get(d.type.name, 0) + 1
        ic = host.interconnect
        hosts.add_row(host.name, ", ".join(f"{n}x {t}" for t, n in kinds.items()) or "-",
                      f"{ic.kind.value} {ic.bandwidth_gbps:g} Gbps" if ic else "-",
                      f"{tflops:.1f}", f"{mem:g}",
                      ", ".join(f"{n.bandwidth_gbps:g}G->{n.switch}" for n in host.nics) or "-")
    hosts.add_row("total", "", "", f"{total_tflops:.1f}", f"{total_mem:g}", "", style="bold")
    parts.append(hosts)

    devices = Table(title="devices", title_justify="left")
    for col in ("device", "type", "memory GiB", "FP32", "FP16", "mem GB/s"):
        devices.add_column(col)
    for d in cluster.devices:
        t = d.type
        devices.add_row(d.name, t.name, f"{t.memory_gib:g}", f"{t.fp32_tflops:g}",
                        f"{t.fp16_tflops:g}", f"{t.memory_bandwidth_gb_per_s:g}")
    parts.append(devices)

    links = Table(title=f"links ({cluster.graph.number_of_edges()})", title_justify="left")
    # the figures an AllReduce crosses a link with, where the topology gives them
    collective = any("collective_bandwidth_gbps" in attrs for *_, attrs in cluster.graph.edges(data=True))
    for col in ("a", "b", "medium", "Gbps", "latency us",
                *(("AllReduce Gbps", "AllReduce latency us") if collective else ())):
        links.add_column(col)
    for a, b, attrs in cluster.graph.edges(data=True):
        extra = ()
        if collective:
            extra = ((_fmt_bw(attrs["collective_bandwidth_gbps"]), f"{attrs['collective_latency_us']:g}")
                     if "collective_bandwidth_gbps" in attrs else ("-", "-"))
        links.add_row(a, b, attrs["medium"], _fmt_bw(attrs["bandwidth_gbps"]),
                      f"{attrs['latency_us']:g}", *extra)
    parts.append(links)

    names = cluster.device_names
    if len(names) <= MATRIX_LIMIT:
        matrix = Table(title="route bottleneck bandwidth between devices (Gbps)",
                       title_justify="left")
        matrix.add_column("from \\ to")
        short = [n if len(topology.hosts) > 1 else n.split("/", 1)[1] for n in names]
        for s in short:
            matrix.add_column(s, justify="right")
        for a, row in zip(short, cluster.bandwidth_matrix_gbps()):
            matrix.add_row(a, *("-" if v == 0 else _fmt_bw(v) for v in row))
        parts.append(matrix)
    return Group(*parts)
