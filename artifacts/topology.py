"""The ``topology`` artifact: hosts, devices, switches and links, and its compiled graph.

A topology file describes a cluster of any shape:

* **hosts**, each with device entries (a catalog type and a count, optional
  per-device overrides), an intra-host ``interconnect`` and NICs to switches;
* **switches** (top-of-rack, spine, ...);
* explicit **links** between any two endpoints (devices, hosts, switches), so
  rings, partial meshes and oversubscribed fabrics can be written down.

Inside a host every device hangs off the host bridge (node ``<host>``) by a
PCIe link. ``interconnect.kind`` adds device-device paths: ``nvlink`` and
``loopback`` make a full mesh of direct links; ``pcie`` makes the host link
itself the interconnect (device-device traffic crosses the bridge, sharing
it); ``none`` adds nothing. With ``loopback`` (worker processes on one
machine) the host links take the interconnect's figures too, so traffic
between processes always takes the direct, measured path. Links are full duplex: each direction carries
``bandwidth_gbps`` on its own.

An interconnect may also say what its links give a collective
(``collective_latency_us``, ``collective_bandwidth_gbps``): the figures with
which the cost model's AllReduce phases cross them. Below the link's own figure,
the collective library gets less from a link than one transfer does (its own
synchronisation per step, chunking); above it, more (several channels driven
at once, where one point-to-point transfer drives one). Either is accepted:
AllReduce phases, in the simulator and in every planner's bound, take these
figures, and every other transfer (activations, parameter servers, all-gather,
broadcast) the link's own. ``dl-nfv profile network`` fits them to the
AllReduce it measures; without them a collective sees the link's point-to-point
figures.

``cluster_of(topology)`` compiles the record into a ``Cluster``: a networkx
graph plus routes between any two devices, chosen by lowest total latency and
then widest bottleneck.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING

from .devices import DeviceKind, DeviceType, lookup
from .errors import InvalidArtifact, UnknownName
from .records import check, record, unique

if TYPE_CHECKING:  # networkx is imported where a graph is built: it costs ~0.1 s at start-up
    import networkx as nx

SCHEMA_VERSION = 1
# The most devices one host may hold (summed over its device entries): far above any real
# machine, and low enough that a typo (count: 1000000000000) is an error, not hours of work.
MAX_DEVICES_PER_HOST = 4096

# PCIe 3.0 x16: 15.75 GB/s per direction = 126 Gbps; about 1 us per hop.
DEFAULT_HOST_LINK_GBPS = 126.0
DEFAULT_HOST_LINK_LATENCY_US = 1.0


class InterconnectKind(StrEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"
    LOOPBACK = "loopback"
    NONE = "none"


# DeviceSpec fields that override the catalog type's figure of the same name
OVERRIDES = ("memory_gib", "fp32_tflops", "fp16_tflops", "memory_bandwidth_gb_per_s", "cores")


@record
class DeviceSpec:
    """``count`` devices of catalog ``type`` in one host, with optional overrides."""

    type: str
    count: int = 1
    prefix: str | None = None
    memory_gib: float | None = None
    fp32_tflops: float | None = None
    fp16_tflops: float | None = None
    memory_bandwidth_gb_per_s: float | None = None
    cores: int | None = None  # a CPU device's cores (its worker's threads); default one

    def __post_init__(self) -> None:
        check(self.count >= 1, f"count must be >= 1, got {self.count}")
        check(self.count <= MAX_DEVICES_PER_HOST,
              f"count must be <= {MAX_DEVICES_PER_HOST} (the device limit per host), "
              f"got {self.count}")
        for name in OVERRIDES:
            value = getattr(self, name)
            check(value is None or value > 0, f"{name} must be > 0, got {value}")
        check(self.prefix is None or (self.prefix and "/" not in self.prefix),
              f"prefix must be a non-empty name without '/', got {self.prefix!r}")


@record
class Interconnect:
    """A host's device-device links. ``collective_*``, where given, are what an AllReduce
    sees on them: below the link's own figures (a collective library's synchronisation per
    step) or above them (several channels at once where one transfer drives one), both
    valid; the simulator's AllReduce phases and every planner's bound take them, every other
    transfer the link's own (see the module docstring)."""

    kind: InterconnectKind
    bandwidth_gbps: float
    latency_us: float = 1.0
    collective_latency_us: float | None = None
    collective_bandwidth_gbps: float | None = None
    # CPU a worker process of a CPU device spends on one message it sends or receives over
    # these links (its collective library's threads included): a fixed part and one per MiB
    # (``profile network`` measures them); None: not measured, nothing beyond the transfer
    message_cpu_us: float | None = None
    message_cpu_us_per_mib: float | None = None

    def __post_init__(self) -> None:
        _check_link_figures(self.bandwidth_gbps, self.latency_us)
        figures = self.collective_figures
        if figures is not None:
            _check_link_figures(figures[1], figures[0], "collective_")
        for name in ("message_cpu_us", "message_cpu_us_per_mib"):
            value = getattr(self, name)
            check(value is None or value >= 0, f"{name} must be >= 0, got {value}")

    @property
    def collective_figures(self) -> tuple[float, float] | None:
        """``(latency_us, bandwidth_gbps)`` a collective sees on this interconnect's links
        (the link's own figure where only one is given); None where neither is given."""
        if self.collective_latency_us is None and self.collective_bandwidth_gbps is None:
            return None
        return (self.latency_us if self.collective_latency_us is None else self.collective_latency_us,
                self.bandwidth_gbps if self.collective_bandwidth_gbps is None
                else self.collective_bandwidth_gbps)


@record
class Nic:
    """A host NIC cabled to ``switch``."""

    switch: str
    bandwidth_gbps: float
    latency_us: float = 5.0

    def __post_init__(self) -> None:
        _check_link_figures(self.bandwidth_gbps, self.latency_us)


@record
class Host:
    name: str
    devices: tuple[DeviceSpec, ...]
    interconnect: Interconnect | None = None
    host_link_gbps: float = DEFAULT_HOST_LINK_GBPS
    host_link_latency_us: float = DEFAULT_HOST_LINK_LATENCY_US
    nics: tuple[Nic, ...] = ()

    def __post_init__(self) -> None:
        check(bool(self.name) and "/" not in self.name,
              f"host name must be non-empty and contain no '/', got {self.name!r}")
        _check_link_figures(self.host_link_gbps, self.host_link_latency_us)
        total = sum(spec.count for spec in self.devices)
        check(total <= MAX_DEVICES_PER_HOST,
              f"host {self.name!r} has {total} devices; the limit per host is "
              f"{MAX_DEVICES_PER_HOST}")


@record
class Switch:
    name: str

    def __post_init__(self) -> None:
        check(bool(self.name) and "/" not in self.name,
              f"switch name must be non-empty and contain no '/', got {self.name!r}")


@record
class Link:
    """An explicit full-duplex link between two endpoints (device, host or switch names)."""

    endpoints: tuple[str, str]
    bandwidth_gbps: float
    latency_us: float = 1.0

    def __post_init__(self) -> None:
        check(self.endpoints[0] != self.endpoints[1],
              f"a link joins two different endpoints, got {self.endpoints[0]!r} twice")
        _check_link_figures(self.bandwidth_gbps, self.latency_us)


def _check_link_figures(bandwidth_gbps: float, latency_us: float, prefix: str = "") -> None:
    check(bandwidth_gbps > 0, f"{prefix}bandwidth_gbps must be > 0, got {bandwidth_gbps}")
    check(latency_us >= 0, f"{prefix}latency_us must be >= 0, got {latency_us}")


@record
class Topology:
    """A cluster: hosts with devices, switches, links. See the module docstring."""

    kind: str = "topology"
    schema_version: int = SCHEMA_VERSION
    name: str
    description: str = ""
    device_types: tuple[DeviceType, ...] = ()
    hosts: tuple[Host, ...]
    switches: tuple[Switch, ...] = ()
    links: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        check(len(self.hosts) >= 1, "a topology needs at least one host")
        unique((h.name for h in self.hosts), "host name")
        unique((s.name for s in self.switches), "switch name")
        unique((t.name for t in self.device_types), "device type")
        extra = {t.name: t for t in self.device_types}
        for i, host in enumerate(self.hosts):
            for j, spec in enumerate(host.devices):
                try:
                    lookup(spec.type, extra)
                except UnknownName as exc:
                    raise InvalidArtifact(str(exc), field=f"hosts[{i}].devices[{j}].type") from None
        names = [d for d, _, _ in _device_entries(self)]
        unique(names, "device name")
        endpoints = {*names, *(h.name for h in self.hosts), *(s.name for s in self.switches)}
        clash = set(names) & {*(h.name for h in self.hosts), *(s.name for s in self.switches)}
        check(not clash, lambda: f"name {sorted(clash)[0]!r} is used twice")
        for i, host in enumerate(self.hosts):
            for j, nic in enumerate(host.nics):
                if nic.switch not in {s.name for s in self.switches}:
                    raise InvalidArtifact(f"unknown switch {nic.switch!r}",
                                          field=f"hosts[{i}].nics[{j}].switch")
        for i, link in enumerate(self.links):
            for end in link.endpoints:
                if end not in endpoints:
                    raise InvalidArtifact(f"unknown endpoint {end!r}", field=f"links[{i}].endpoints")
        import networkx as nx

        graph = _build_graph(self)
        components = list(nx.connected_components(graph))
        if len(components) > 1:
            reachable = next(c for c in components if names[0] in c)
            stranded = next(n for n in names if n not in reachable)
            raise ValueError(f"device {stranded!r} is not connected to device {names[0]!r}")

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d for d, _, _ in _device_entries(self))


def _device_entries(topology: Topology):
    """Yield ``(device name, host, DeviceSpec)`` in file order."""
    extra = {t.name: t for t in topology.device_types}
    for host in topology.hosts:
        counters: dict[str, int] = {}
        for spec in host.devices:
            kind = lookup(spec.type, extra).kind
            prefix = spec.prefix or ("cpu" if kind is DeviceKind.CPU else "gpu")
            for _ in range(spec.count):
                index = counters.get(prefix, 0)
                counters[prefix] = index + 1
                yield f"{host.name}/{prefix}{index}", host, spec


def _build_graph(topology: Topology) -> nx.Graph:
    import networkx as nx

    graph = nx.Graph()
    for s in topology.switches:
        graph.add_node(s.name, role="switch")
    for host in topology.hosts:
        graph.add_node(host.name, role="host")
    by_host: dict[str, list[str]] = {}
    for name, host, _ in _device_entries(topology):
        graph.add_node(name, role="device", host=host.name)
        by_host.setdefault(host.name, []).append(name)
    for host in topology.hosts:
        devices = by_host.get(host.name, [])
        ic = host.interconnect
        if ic is not None and ic.kind in (InterconnectKind.PCIE, InterconnectKind.LOOPBACK):
            # pcie: the host link is the interconnect; loopback: processes reach the host's
            # other endpoints (its NICs) through the same kernel path they use between them.
            host_bw, host_lat = ic.bandwidth_gbps, ic.latency_us
        else:
            host_bw, host_lat = host.host_link_gbps, host.host_link_latency_us
        # the links device-device traffic inside the host crosses carry the collective figures
        mesh = ic is not None and ic.kind in (InterconnectKind.NVLINK, InterconnectKind.LOOPBACK)
        bridged = ic is not None and ic.kind is InterconnectKind.PCIE
        collective = ic.collective_figures if ic is not None else None
        for d in devices:
            _add_link(graph, d, host.name, host_bw, host_lat, "host-link",
                      collective if bridged else None)
        if mesh:
            for i, a in enumerate(devices):
                for b in devices[i + 1:]:
                    _add_link(graph, a, b, ic.bandwidth_gbps, ic.latency_us, ic.kind.value,
                              collective)
        for nic in host.nics:
            _add_link(graph, host.name, nic.switch, nic.bandwidth_gbps, nic.latency_us, "nic")
    for link in topology.links:
        a, b = link.endpoints
        _add_link(graph, a, b, link.bandwidth_gbps, link.latency_us, "link")
    return graph


def _add_link(graph: nx.Graph, a: str, b: str, bandwidth_gbps: float, latency_us: float,
              medium: str, collective: tuple[float, float] | None = None) -> None:
    # An explicit link between two nodes already joined replaces the implicit one.
    graph.add_edge(a, b, bandwidth_gbps=bandwidth_gbps, latency_us=latency_us, medium=medium)
    attrs = graph.edges[a, b]
    if collective is None:
        attrs.pop("collective_latency_us", None)
        attrs.pop("collective_bandwidth_gbps", None)
    else:
        attrs["collective_latency_us"], attrs["collective_bandwidth_gbps"] = collective


@dataclass(frozen=True, slots=True)
class Device:
    """A compute device of a compiled cluster: its name, host and effective type."""

    name: str
    host: str
    type: DeviceType
    index: int

    @property
    def memory_bytes(self) -> int:
        return self.type.memory_bytes


@dataclass(frozen=True, slots=True)
class Route:
    """A path between two devices: its directed hops, total latency, bottleneck bandwidth."""

    src: str
    dst: str
    hops: tuple[tuple[str, str], ...]
    latency_us: float
    bandwidth_gbps: float

    def transfer_us(self, nbytes: float) -> float:
        """Latency plus ``nbytes`` over the bottleneck, in microseconds (0 for a local copy)."""
        if not self.hops:
            return 0.0
        return self.latency_us + nbytes * 8 / (self.bandwidth_gbps * 1e3)


@dataclass(slots=True)
class Cluster:
    """A topology compiled for computation: devices, a networkx graph and routes."""

    topology: Topology
    graph: nx.Graph
    devices: tuple[Device, ...]
    _by_name: dict[str, Device] = field(default_factory=dict)
    _routes: dict[str, dict[str, Route]] = field(default_factory=dict)

    def device(self, name: str) -> Device:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownName(f"unknown device {name!r} in topology {self.topology.name!r}") from None

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def route(self, src: str, dst: str) -> Route:
        """The route ``src -> dst``: lowest total latency, ties broken by widest bottleneck."""
        if src not in self._routes:
            self.device(src)
            self._routes[src] = _routes_from(self.graph, src, self._by_name)
        try:
            return self._routes[src][dst]
        except KeyError:
            self.device(dst)
            raise

    def bandwidth_matrix_gbps(self) -> list[list[float]]:
        """Bottleneck bandwidth of the route between every ordered pair (0 on the diagonal)."""
        names = self.device_names
        return [[0.0 if a == b else self.route(a, b).bandwidth_gbps for b in names] for a in names]

    def link(self, a: str, b: str) -> dict:
        """Attributes (bandwidth_gbps, latency_us, medium, and where the topology gives them
        collective_latency_us and collective_bandwidth_gbps) of the link between nodes a and b."""
        return self.graph.edges[a, b]


def _routes_from(graph: nx.Graph, src: str, devices: dict[str, Device]) -> dict[str, Route]:
    # Dijkstra on the label (latency, -bottleneck), which is monotone along a path.
    best: dict[str, tuple[float, float]] = {src: (0.0, -float("inf"))}
    parent: dict[str, str] = {}
    heap = [(0.0, -float("inf"), src)]
    done: set[str] = set()
    while heap:
        latency, neg_bw, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        for nxt, attrs in graph[node].items():
            if nxt in done:
                continue
            cand = (latency + attrs["latency_us"], max(neg_bw, -attrs["bandwidth_gbps"]))
            if nxt not in best or cand < best[nxt]:
                best[nxt] = cand
                parent[nxt] = node
                heapq.heappush(heap, (cand[0], cand[1], nxt))
    routes = {}
    for dst in devices:
        if dst == src:
            routes[dst] = Route(src, dst, (), 0.0, float("inf"))
            continue
        path = [dst]
        while path[-1] != src:
            path.append(parent[path[-1]])
        path.reverse()
        latency, neg_bw = best[dst]
        routes[dst] = Route(src, dst, tuple(zip(path, path[1:])), latency, -neg_bw)
    return routes


@lru_cache(maxsize=64)
def cluster_of(topology: Topology) -> Cluster:
    """Compile ``topology`` (cached per topology value)."""
    extra = {t.name: t for t in topology.device_types}
    devices = []
    for index, (name, host, spec) in enumerate(_device_entries(topology)):
        base = lookup(spec.type, extra)
        overrides = {k: getattr(spec, k) for k in OVERRIDES if getattr(spec, k) is not None}
        devices.append(Device(name, host.name, replace(base, **overrides) if overrides else base, index))
    cluster = Cluster(topology, _build_graph(topology), tuple(devices))
    cluster._by_name = {d.name: d for d in devices}
    return cluster
