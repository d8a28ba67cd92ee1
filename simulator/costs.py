"""The cost model: the one place that answers "how long" (and "how much memory").

Planners and the simulator ask this module, never a formula of their own.

Compute
    An op's time on a device is its measured time where the graph was profiled
    on that device type; otherwise a roofline estimate
    ``launch + max(flops / peak_flops, bytes / memory_bandwidth) / efficiency``,
    where the efficiency of *this op* is calibrated on the reference device type
    (the one with measurements): ``efficiency = roofline_ref / measured_ref``,
    clipped to [``MIN_EFFICIENCY``, 1]. Without any measurement a default
    efficiency is used. A replica that holds a fraction ``f`` of the batch takes
    ``fixed + (t - fixed) * f``: part of an op's time does not shrink with the
    batch. ``fixed`` is the op's measured batch-independent part where the
    profile measured one on that device type (``fwd_fixed_ms``: from a second
    measurement at an eighth of the batch; on a CPU, reading and packing the weights of
    a small-batch matmul is most of it), otherwise the launch overhead.

Optimizer step and gradient buffers
    On a CPU of the profile's type, the step and the zeroing of the gradients as
    ``profile model`` timed them over the model's parameters, per byte
    (``ProfileInfo.update_ns_per_byte``, ``zero_ns_per_byte``), and a backward's adding
    into the gradients likewise (``accumulate_ns_per_byte``). Elsewhere memory bound:
    per parameter byte an update moves ``UPDATE_PASSES`` bytes, as
    many as the fused step of ``torch.optim`` that the runtime runs reads and writes
    (one kernel, on a CPU as on a GPU). Gradients live in flat
    buckets (as DDP's ``gradient_as_bucket_view``): every step zeroes them (two
    passes: a write reads the line first) and every backward pass of a
    microbatch adds into them (read two, write one: ``ACCUMULATE_PASSES``).
    The adding is part of each backward task (``accumulate_ms_per_byte``: autograd adds
    an op's weight gradient as soon as it is computed, on the same stream), the
    zeroing part of the update; planners that reason per step take both
    together (``upkeep_ms``).

Communication
    A transfer over a route takes ``latency + bytes / bottleneck bandwidth``.
    Collectives are analytical and congestion-aware: each phase is a set of
    concurrent flows, and a phase takes the largest route latency plus, over
    every directed link, the bytes all flows put on it divided by its
    bandwidth. So a ring AllReduce of S bytes over N devices on uniform links
    takes exactly ``2(N-1)/N * S/B + 2(N-1) * latency``, a PS exchange is bounded
    by the server's NIC, and rings that cross a shared NIC pay for it.

    Host-memory transports (measured with gloo between processes of one host):
    a ``loopback`` link is the CPUs copying through the kernel, so its two
    directions share one capacity (an exchange both ways took 2.0x one
    transfer); and on CPU devices the collective library sums on the CPU
    between transfers, so every byte a device reduces costs
    ``REDUCE_PASSES`` passes over its memory bandwidth (read two operands,
    write one), in sequence with the transfers. On GPUs the reduction runs in
    the transfer kernels and is not charged.

    A collective library gets less from a link than one transfer does (its
    own synchronisation per step, chunking): where the topology gives an
    interconnect ``collective_latency_us`` / ``collective_bandwidth_gbps``
    (``profile network`` fits them to the AllReduce it times), AllReduce
    phases cross its links with those figures (``link_figures``).

Memory
    Parameters, gradients (same size) and optimizer state (``state_factor``
    times the parameters) stay resident, and so does each op's
    ``resident_bytes`` (a footprint an importer read as one figure) on every
    device that runs it; activations (op outputs) of every in-flight
    microbatch are stashed until their backward.

Every phase of a collective is affine in its size, so each (algorithm,
device set) is turned once into a small cached expression
``sum_t max_k (a + b x bytes)``; later calls cost O(phases).

Limits (honest): no kernel-level contention between concurrent ops on one
device, no NCCL protocol switching (LL/LL128/Simple), no overlap of a
collective's phases, the efficiency calibration assumes an op is as
efficient relative to its roofline on every device type. docs/cost-model.md
has every formula.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dl_nfv.artifacts import (
    Cluster,
    Collective,
    OpGraph,
    OpKind,
    Optimizer,
    ProfileInfo,
    Topology,
    cluster_of,
)
from dl_nfv.artifacts.devices import DeviceType

from .extrapolation import at_threads, thread_points

MIN_EFFICIENCY = 0.05
DEFAULT_COMPUTE_EFFICIENCY = 0.5
DEFAULT_MEMORY_EFFICIENCY = 0.7
# Bytes moved per parameter byte by one fused optimizer step of torch.optim (``fused=True``,
# as the runtime runs it: one kernel reads the parameters, their gradients and the state
# and writes the parameters and the state):
#   SGD with momentum: reads param, grad, momentum buffer, writes param, buffer: 5;
#   Adam: reads param, grad, exp_avg, exp_avg_sq, writes param and both averages: 7.
# (The unfused steps run a kernel per operation and move 8 and 18; on a CPU whose heap
# hands freed memory back, an unfused Adam step also faults in two fresh temporaries every
# step: docs/cost-model.md.)
UPDATE_PASSES = {Optimizer.SGD: 5.0, Optimizer.ADAM: 7.0}
# Gradient buckets: zeroed once per step (a pure write also reads each cache line first,
# so it costs two passes), and each backward adds into them (read two, write one).
ZERO_PASSES = 2.0
ACCUMULATE_PASSES = 3.0
# Bytes moved per reduced byte by a CPU collective's sum: read two operands, write one.
REDUCE_PASSES = 3.0
# Link media whose two directions share one capacity.
SHARED_MEDIA = frozenset({"loopback"})


@dataclass(frozen=True, slots=True)
class Flow:
    """A point-to-point flow of ``nbytes`` from device ``src`` to device ``dst``."""

    src: str
    dst: str
    nbytes: float


def tied_weights(graph: OpGraph) -> list[tuple[str, str, str, float]]:
    """Tied weights: ``(parameter, owner op, sharing op, bytes)`` for every op that uses a
    parameter another op owns (``Op.shared_params``), in graph order."""
    owner_of = {name: op.id for op in graph.ops for name in op.params}
    return [(name, owner_of[name], op.id, float(nbytes)) for op in graph.ops
            for name, nbytes in op.shared_params.items() if name in owner_of]


def lookup_rows(graph: OpGraph) -> dict[str, float]:
    """Owner op -> bytes of the rows of its tied weight's gradient that it can make
    non-zero, for owners that are lookups: an op that reads only graph inputs (token
    ids) and owns a tied weight updates one row per id at most, and each row is one
    position of its output. So at most its output's bytes of the gradient (plus the
    ids, which say which rows) are non-zero, whatever the vocabulary. Owners that read
    anything else are absent (their gradient is dense)."""
    index = graph.index
    tied: dict[str, float] = defaultdict(float)  # owner -> bytes of the largest weight it lends
    for _, owner, _, nbytes in tied_weights(graph):
        tied[owner] = max(tied[owner], nbytes)
    into: dict[str, list] = defaultdict(list)
    sent: dict[str, int] = defaultdict(int)  # largest output edge (an op may not record output_bytes)
    for e in graph.edges:
        into[e.dst].append(e)
        sent[e.src] = max(sent[e.src], e.bytes)
    out = {}
    for owner in sorted(tied):
        edges = into.get(owner, [])
        if edges and all(index[e.src].kind == OpKind.INPUT for e in edges):
            rows = max(index[owner].output_bytes, sent[owner])
            out[owner] = float(min(tied[owner], rows) + sum(e.bytes for e in edges))
    return out


def exchangeable(lookups: dict[str, float], owner: str, owner_devices: Sequence[str],
                 sharer_devices: Sequence[Sequence[str]]) -> bool:
    """Whether a tie can be summed by exchange (``TieSync.EXCHANGE``): its owner is a
    lookup (in ``lookups``, from ``lookup_rows``), the owner's group and every sharer's
    group run on one device each, and one other device than the owner's holds it."""
    holders = {*owner_devices, *(d for devs in sharer_devices for d in devs)}
    return (owner in lookups and len(owner_devices) == 1 and len(holders) == 2
            and all(len(devs) == 1 for devs in sharer_devices))


class NetworkCosts:
    """Costs of moving data on one cluster: transfers, concurrent flows and collectives.

    Needs only the cluster (no op graph), so a network probe can ask what the
    model says of the collectives it measured; ``CostModel`` adds the graph.
    Collective costs are built once per (algorithm, device set) into cached
    expressions (see ``_Expression``).
    """

    def __init__(self, topology: Topology | Cluster):
        self.cluster = topology if isinstance(topology, Cluster) else cluster_of(topology)
        # collective cost expressions per (algorithm, device tuple): see _Expression
        self._expressions: dict[tuple, _Expression] = {}
        # optional, set by a caller that knows the cluster's symmetry: a key under which
        # device sets whose AllReduce costs are equal share them (``_allreduce_terms``), and
        # the table they are kept in (a caller may share it between clusters alike)
        self.group_class: Callable[[tuple[str, ...]], Hashable] | None = None
        self.class_terms: dict[tuple, list] = {}
        self._phases: dict[tuple, tuple[float, float, dict]] = {}
        # directed hop -> (capacity key, latency, bandwidth, collective latency, collective bandwidth)
        self._hops: dict[tuple[str, str], tuple] = {}
        self._route_latency: dict[tuple[str, str], float] = {}  # collective latency per route

    def transfer_ms(self, src: str, dst: str, nbytes: float) -> float:
        """Point-to-point transfer of ``nbytes`` from ``src`` to ``dst`` (0 when equal)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return self.cluster.route(src, dst).transfer_us(nbytes) / 1e3

    def message_cpu_ms(self, device: str, nbytes: float) -> float:
        """CPU a worker of CPU ``device`` spends sending or receiving one message of
        ``nbytes`` (its collective library's threads included): its host interconnect's
        measured ``message_cpu_us + nbytes x message_cpu_us_per_mib``; 0 where not measured
        or on another kind of device."""
        dev = self.cluster.device(device)
        if dev.type.kind.value != "cpu" or nbytes <= 0:
            return 0.0
        host = next(h for h in self.cluster.topology.hosts if h.name == dev.host)
        ic = host.interconnect
        if ic is None or ic.message_cpu_us is None:
            return 0.0
        return (ic.message_cpu_us + nbytes / 2**20 * (ic.message_cpu_us_per_mib or 0.0)) / 1e3

    def host_transfer_ms(self, src: str, dst: str, nbytes: float) -> float:
        """A transfer that holds CPU ends (``TaskGraph.host_driven``): its link time, and no
        less than either CPU end spends on the message (``message_cpu_ms``)."""
        return max(self.transfer_ms(src, dst, nbytes), self.message_cpu_ms(src, nbytes),
                   self.message_cpu_ms(dst, nbytes)) if src != dst and nbytes > 0 else 0.0

    def concurrent_ms(self, flows: Iterable[Flow]) -> float:
        """Time for a set of flows that start together and share links.

        The largest route latency plus the heaviest directed link's bytes over
        its bandwidth (every flow's bytes count on every link of its route).
        """
        load: dict[tuple[str, str], float] = defaultdict(float)
        latency = 0.0
        for f in flows:
            if f.src == f.dst or f.nbytes <= 0:
                continue
            route = self.cluster.route(f.src, f.dst)
            latency = max(latency, route.latency_us)
            for hop in route.hops:
                load[hop] += f.nbytes
        if not load:
            return 0.0
        worst_us = max(nbytes * 8 / (bw * 1e3) for nbytes, bw in self._capacity_load(load))
        return (latency + worst_us) / 1e3

    def _capacity_load(self, load: dict, collective: bool = False) -> list[tuple[float, float]]:
        """(bytes, Gbps) per link capacity (``capacity_key``); with ``collective``, the
        bandwidth a collective sees on the link (``link_figures``)."""
        merged: dict = defaultdict(float)
        bandwidth: dict = {}
        column = 4 if collective else 2
        for hop, nbytes in load.items():
            info = self._hops.get(hop) or self._hop(hop)
            merged[info[0]] += nbytes
            bandwidth[info[0]] = info[column]
        return [(nbytes, bandwidth[key]) for key, nbytes in merged.items()]

    def _hop(self, hop: tuple[str, str]) -> tuple:
        """What the cost model reads of a directed hop, looked up once: its capacity key,
        latency and bandwidth, and the latency and bandwidth a collective sees on it."""
        link = self.cluster.link(*hop)
        key = frozenset(hop) if link.get("medium") in SHARED_MEDIA else hop
        info = self._hops[hop] = (key, link["latency_us"], link["bandwidth_gbps"],
                                  link.get("collective_latency_us", link["latency_us"]),
                                  link.get("collective_bandwidth_gbps", link["bandwidth_gbps"]))
        return info

    def link_figures(self, hop: tuple[str, str], collective: bool = False) -> tuple[float, float]:
        """``(latency_us, bandwidth_gbps)`` of a hop: for a collective's phase, the figures
        the topology gives collectives there (``collective_*``), else the link's own."""
        info = self._hops.get(hop) or self._hop(hop)
        return (info[3], info[4]) if collective else (info[1], info[2])

    def capacity_key(self, hop: tuple[str, str]) -> Hashable:
        """What a directed hop's bandwidth is shared with: the hop itself, or both
        directions of a shared-medium link together."""
        return (self._hops.get(hop) or self._hop(hop))[0]

    def flow_links(self, flows: Iterable[Flow]) -> frozenset:
        """The link capacities (``capacity_key``) a set of flows occupies."""
        return frozenset(self.capacity_key(hop) for f in flows
                         if f.src != f.dst and f.nbytes > 0
                         for hop in self.cluster.route(f.src, f.dst).hops)

    def reduce_ms_per_byte(self, devices: Sequence[str]) -> float:
        """Time per byte a CPU device spends summing a collective's data (0 on GPUs): the
        slowest of ``devices``, ``REDUCE_PASSES`` passes over its memory bandwidth."""
        worst = 0.0
        for name in devices:
            t = self.cluster.device(name).type
            if t.kind.value == "cpu":
                worst = max(worst, REDUCE_PASSES / (t.memory_bandwidth_gb_per_s * 1e6))
        return worst

    def links_of(self, devices: Sequence[str]) -> set[tuple[str, str]]:
        """Directed links a collective among ``devices`` (ring order) may use."""
        hops: set[tuple[str, str]] = set()
        ring = list(devices)
        for a, b in zip(ring, ring[1:] + ring[:1]):
            if a != b:
                hops.update(self.cluster.route(a, b).hops)
                hops.update(self.cluster.route(b, a).hops)
        return hops

    def ring_order(self, devices: Sequence[str]) -> list[str]:
        """Devices ordered host by host, so a ring crosses each host boundary once."""
        return sorted(devices, key=self._ring_index.__getitem__)

    @cached_property
    def _ring_index(self) -> dict[str, tuple[str, int]]:
        return {d.name: (d.host, d.index) for d in self.cluster.devices}

    def allreduce_ms(self, devices: Sequence[str], nbytes: float,
                     algorithm: Collective = Collective.AUTO) -> float:
        """AllReduce of ``nbytes`` over ``devices`` by ring, tree or hierarchical algorithm.

        ``AUTO`` takes the fastest of the three. Raises ``ValueError`` for an
        unknown algorithm. The cost of an algorithm on a device set is built once
        (a sum of phases, each ``latency + bytes x ms_per_byte`` of its busiest
        link) and cached, so repeated calls cost O(phases).
        """
        devices = tuple(dict.fromkeys(devices))
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        if algorithm == Collective.AUTO:
            return min(self.allreduce_ms(devices, nbytes, a)
                       for a in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL))
        if algorithm not in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL):
            raise ValueError(f"unknown collective {algorithm!r}")
        return _Expression(self._allreduce_terms(Collective(algorithm).value, devices)).ms(nbytes)

    def _allreduce_terms(self, name: str, devices: tuple[str, ...]) -> list:
        """The cost terms of AllReduce ``name`` over ``devices`` (``_Expression.terms``); with a
        ``group_class``, built once per class of device sets (their links stay per set)."""
        if self.group_class is None:
            return self._expression(name, devices).terms
        key = (name, self.group_class(devices))
        terms = self.class_terms.get(key)
        if terms is None:
            terms = self.class_terms[key] = self._expression(name, devices).terms
        return terms

    def allreduce_ms_per_byte(self, devices: Sequence[str]) -> float:
        """The least ms per byte any AllReduce over ``devices`` takes, whatever its size.

        Each phase of an algorithm is ``latency + b x bytes`` with ``latency >= 0``, so
        ``allreduce_ms(devices, S) >= S x`` this for every ``S`` and algorithm, and a
        payload split into buckets costs at least as much as sent whole.
        """
        devices = tuple(dict.fromkeys(devices))
        if len(devices) <= 1:
            return 0.0
        return min(sum(max(b for _, b in term)
                       for term in self._allreduce_terms(Collective(a).value, devices))
                   for a in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL))

    def allreduce_algorithm(self, devices: Sequence[str], nbytes: float,
                            algorithm: Collective = Collective.AUTO) -> Collective:
        """The algorithm ``allreduce_ms`` uses: ``algorithm``, or for ``AUTO`` the fastest."""
        if algorithm != Collective.AUTO:
            return Collective(algorithm)
        return min((Collective.RING, Collective.TREE, Collective.HIERARCHICAL),
                   key=lambda a: self.allreduce_ms(devices, nbytes, a))

    def collective_link_bytes(self, what: str, devices: Sequence[str], nbytes: float, *,
                              algorithm: Collective = Collective.AUTO,
                              servers: Sequence[str] = ()) -> dict[tuple[str, str], float]:
        """Bytes each directed link carries in a collective, by the same model as its time.

        ``what`` is ``allreduce`` (with ``algorithm``), ``allgather`` (``nbytes``
        per device), ``ps`` (push and pull to ``servers``; ``ps-push`` or
        ``ps-pull`` for one phase) or ``broadcast`` (from ``devices[0]``).
        """
        devices = tuple(dict.fromkeys(devices))
        if nbytes <= 0:
            return {}
        if what == "allreduce":
            if len(devices) <= 1:
                return {}
            exprs = [self._expression(self.allreduce_algorithm(devices, nbytes, algorithm).value,
                                      devices)]
        elif what == "allgather":
            exprs = [self._expression("allgather", devices)] if len(devices) > 1 else []
        elif what in ("ps", "ps-push", "ps-pull"):
            key = "\n".join(dict.fromkeys(servers))
            exprs = [self._expression(phase, devices, key) for phase in ("ps-push", "ps-pull")
                     if what in ("ps", phase)]
        elif what == "broadcast":
            others = tuple(d for d in devices[1:] if d != devices[0])
            exprs = [self._expression("broadcast", others, devices[0])] if others else []
        else:
            raise ValueError(f"unknown collective {what!r}")
        out: dict[tuple[str, str], float] = defaultdict(float)
        for expr in exprs:
            for hop, w in expr.links.items():
                out[hop] += w * nbytes
        return dict(out)

    def _expression(self, name: str, devices: tuple[str, ...], root: str = "") -> _Expression:
        key = (name, devices, root)
        expr = self._expressions.get(key)
        if expr is None:
            build = {"ring": self._ring_expr, "tree": self._tree_expr,
                     "hierarchical": self._hierarchical_expr, "allgather": self._allgather_expr,
                     "ps-push": lambda d: self._ps_expr(d, root, push=True),
                     "ps-pull": lambda d: self._ps_expr(d, root, push=False),
                     "broadcast": lambda d: self._broadcast_expr(root, d)}[name]
            expr = self._expressions[key] = build(devices)
        return expr

    def _phase(self, flows: tuple[tuple[str, str, float], ...],
               collective: bool = False) -> tuple[float, float, dict]:
        """``(latency_ms, ms_per_byte, load)`` of concurrent flows ``(src, dst, weight)``.

        Flow ``i`` carries ``weight_i x S`` bytes; the phase takes the largest
        route latency plus, over every directed link, the bytes all flows put on
        it over its bandwidth: ``latency + S x max_link(sum weights / bandwidth)``.
        ``load`` maps each directed link to its bytes per byte of ``S``. A phase of
        an AllReduce (``collective``) takes the links' collective figures
        (``link_figures``); the routes stay those of point-to-point transfers.
        """
        key = (flows, collective)
        cached = self._phases.get(key)
        if cached is not None:
            return cached
        load: dict[tuple[str, str], float] = defaultdict(float)
        latency_us = 0.0
        for src, dst, weight in flows:
            if src == dst or weight <= 0:
                continue
            route = self.cluster.route(src, dst)
            latency_us = max(latency_us, self._collective_latency_us(route) if collective
                             else route.latency_us)
            for hop in route.hops:
                load[hop] += weight
        result = self._phases[key] = (latency_us / 1e3, self._busiest(load, collective), dict(load))
        return result

    def _collective_latency_us(self, route) -> float:
        """A route's latency for a collective's phase: the sum of its hops' collective
        latencies, computed once per route."""
        key = (route.src, route.dst)
        latency = self._route_latency.get(key)
        if latency is None:
            latency = self._route_latency[key] = sum(self.link_figures(hop, True)[0]
                                                     for hop in route.hops)
        return latency

    def _busiest(self, links: dict, collective: bool = False) -> float:
        """ms per byte of ``S`` on the busiest capacity, given bytes per byte of ``S`` per link."""
        return max((w * 8 / (bw * 1e3) for w, bw in self._capacity_load(links, collective)),
                   default=0.0) / 1e3

    def _ring_phase(self, ring: Sequence[str], weight: float,
                    collective: bool = False) -> tuple[float, float, dict]:
        return self._phase(tuple((a, b, weight) for a, b in zip(ring, [*ring[1:], ring[0]])),
                           collective)

    def _ring_expr(self, devices: tuple[str, ...]) -> _Expression:
        ring = self.ring_order(devices)
        n = len(ring)
        lat, per_byte, load = self._ring_phase(ring, 1.0 / n, collective=True)
        # reduce-scatter: each device sums (n-1)/n of the data
        reduce = (n - 1) / n * self.reduce_ms_per_byte(ring)
        return _Expression([[(2 * (n - 1) * lat, 2 * (n - 1) * per_byte + reduce)]],
                           _scaled(load, 2 * (n - 1)))

    def _tree_expr(self, devices: tuple[str, ...]) -> _Expression:
        # Pipelined binary tree: reduce up then broadcast down; each of the
        # ceil(log2 n) levels pays latency once, the payload crosses each edge once per
        # direction (bandwidth term of the slowest level, twice).
        order = self.ring_order(devices)
        n = len(order)
        latency = 0.0
        worst = 0.0
        links: dict = defaultdict(float)
        for level in range(math.ceil(math.log2(n))):
            stride = 2 ** level
            up = tuple((order[i + stride], order[i], 1.0) for i in range(0, n - stride, 2 * stride))
            lat, per_byte, load = self._phase(up, collective=True)
            latency += lat
            worst = max(worst, per_byte)
            _add(links, load)
            _add(links, self._phase(tuple((b, a, w) for a, b, w in up), collective=True)[2])
        # each level's receivers sum the whole payload; no link carries its bytes faster
        # than its bandwidth (a NIC that several levels cross carries them all)
        reduce = math.ceil(math.log2(n)) * self.reduce_ms_per_byte(order)
        return _Expression([[(2 * latency, max(2 * worst, self._busiest(links, True)) + reduce)]],
                           dict(links))

    def _hierarchical_expr(self, devices: tuple[str, ...]) -> _Expression:
        by_host: dict[str, list[str]] = defaultdict(list)
        for name in self.ring_order(devices):
            by_host[self.cluster.device(name).host].append(name)
        hosts = list(by_host.values())
        local = max(len(h) for h in hosts)
        # intra-host reduce-scatter and all-gather, all hosts at once
        # (hosts are disjoint, so each host's ring runs on its own links): the slowest host
        links: dict = defaultdict(float)
        intra = []
        for h in hosts:
            if len(h) > 1:
                expr = self._ring_expr(tuple(h))
                intra.append(expr.terms[0][0])
                _add(links, expr.links)
        terms = [intra] if intra else []
        if len(hosts) > 1:
            # inter-host: one ring per local rank, each over 1/local of the data, sharing NICs
            rings = [[h[i % len(h)] for h in hosts] for i in range(local)]
            m = len(hosts)
            lat, per_byte, load = self._phase(tuple((a, b, 1.0 / local / m) for ring in rings
                                                    for a, b in zip(ring, [*ring[1:], ring[0]])),
                                              collective=True)
            reduce = (m - 1) / m / local * self.reduce_ms_per_byte([d for h in hosts for d in h])
            terms.append([(2 * (m - 1) * lat, 2 * (m - 1) * per_byte + reduce)])
            _add(links, _scaled(load, 2 * (m - 1)))
        return _Expression(terms, dict(links))

    def _allgather_expr(self, devices: tuple[str, ...]) -> _Expression:
        ring = self.ring_order(devices)
        n = len(ring)
        lat, per_byte, load = self._ring_phase(ring, 1.0)
        return _Expression([[((n - 1) * lat, (n - 1) * per_byte)]], _scaled(load, n - 1))

    def _broadcast_expr(self, root: str, devices: tuple[str, ...]) -> _Expression:
        order = [root, *self.ring_order(devices)]
        latency = 0.0
        worst = 0.0
        links: dict = defaultdict(float)
        for level in range(math.ceil(math.log2(len(order)))):
            stride = 2 ** level
            lat, per_byte, load = self._phase(tuple(
                (order[i], order[i + stride], 1.0) for i in range(0, len(order) - stride, 2 * stride)))
            latency += lat
            worst = max(worst, per_byte)
            _add(links, load)
        return _Expression([[(latency, max(worst, self._busiest(links)))]], dict(links))

    def _ps_expr(self, workers: tuple[str, ...], servers_key: str, *, push: bool) -> _Expression:
        servers = servers_key.split("\n")
        weight = 1.0 / len(servers)
        if push:
            flows = tuple((w, s, weight) for w in workers for s in servers if w != s)
        else:
            flows = tuple((s, w, weight) for w in workers for s in servers if w != s)
        lat, per_byte, load = self._phase(flows)
        if push:  # each server sums the shards pushed to it, after they arrive
            pushed = max(sum(1 for w in workers if w != s) for s in servers)
            per_byte += pushed * weight * self.reduce_ms_per_byte(servers)
        return _Expression([[(lat, per_byte)]], load)

    # ------------------------------------------------ affine figures for planners and bounds
    def transfer_affine(self, src: str, dst: str) -> tuple[float, float]:
        """``(latency_ms, ms_per_byte)`` of a lone transfer ``src -> dst``:
        ``transfer_ms(src, dst, S) == latency_ms + S x ms_per_byte`` for every ``S > 0``
        (both 0 when ``src == dst``). Concurrent flows share links (``concurrent_ms``)."""
        if src == dst:
            return 0.0, 0.0
        route = self.cluster.route(src, dst)
        return route.latency_us / 1e3, _ms_per_byte(route.bandwidth_gbps)

    def link_ms_per_byte(self, hop: tuple[str, str], collective: bool = False) -> float:
        """ms per byte through one directed hop on its own: point-to-point figures, or with
        ``collective`` the ones an AllReduce's phases see there (``link_figures``)."""
        return _ms_per_byte(self.link_figures(hop, collective)[1])

    def route_ms_per_byte(self, src: str, dst: str, collective: bool = False) -> float:
        """ms per byte through the route ``src -> dst`` (its slowest hop; ``link_ms_per_byte``)."""
        return max((self.link_ms_per_byte(hop, collective)
                    for hop in self.cluster.route(src, dst).hops), default=0.0)

    def inbound_ms_per_byte(self, nodes: Iterable[str], collective: bool = False) -> float:
        """ms per byte into the node set ``nodes`` (devices, hosts, switches) over all of its
        links from outside at once: one over the sum of their bytes per ms (inf: none)."""
        inside = set(nodes)
        rate = sum(1.0 / self.link_ms_per_byte((v, u), collective) for u in inside
                   for v in self.cluster.graph[u] if v not in inside)
        return 1.0 / rate if rate > 0 else math.inf

    def capacity_graph(self, collective: bool = False):
        """The topology's undirected graph with each link's ``bytes_per_ms`` (point-to-point,
        or with ``collective`` as an AllReduce sees it): for cut arguments over the network."""
        import networkx as nx

        out = nx.Graph()
        out.add_nodes_from(self.cluster.graph.nodes)
        for u, v in self.cluster.graph.edges:
            out.add_edge(u, v, bytes_per_ms=1.0 / self.link_ms_per_byte((u, v), collective))
        return out

    def allreduce_affine(self, devices: Sequence[str],
                         algorithm: Collective) -> tuple[float, float]:
        """``(latency_ms, ms_per_byte)`` of one AllReduce algorithm (ring, tree or hierarchical)
        over ``devices``: ``allreduce_ms(devices, S, algorithm) <= latency_ms + S x ms_per_byte``
        for every ``S``, equal at ``S -> 0`` and in the slope for large ``S`` (exact for ring and
        tree, and for a hierarchical AllReduce whose hosts' rings are alike). (0, 0) for fewer
        than two devices. Raises ``ValueError`` for ``AUTO`` (not affine: take the least of
        the three) or an unknown algorithm."""
        devices = tuple(dict.fromkeys(devices))
        if algorithm not in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL):
            raise ValueError(f"no affine form for collective {algorithm!r}")
        if len(devices) <= 1:
            return 0.0, 0.0
        terms = self._allreduce_terms(Collective(algorithm).value, devices)
        return (sum(max(a for a, _ in term) for term in terms),
                sum(max(b for _, b in term) for term in terms))

    def allgather_ms(self, devices: Sequence[str], nbytes_per_device: float) -> float:
        """Ring all-gather: every device ends with every device's ``nbytes_per_device``."""
        devices = tuple(dict.fromkeys(devices))
        if len(devices) <= 1 or nbytes_per_device <= 0:
            return 0.0
        return self._expression("allgather", devices).ms(nbytes_per_device)

    def broadcast_ms(self, root: str, devices: Sequence[str], nbytes: float) -> float:
        """Pipelined tree broadcast of ``nbytes`` from ``root`` to ``devices``."""
        others = tuple(d for d in dict.fromkeys(devices) if d != root)
        if not others or nbytes <= 0:
            return 0.0
        return self._expression("broadcast", others, root).ms(nbytes)

    def ps_phases_ms(self, workers: Sequence[str], servers: Sequence[str],
                     nbytes: float) -> tuple[float, float]:
        """(push, pull) times of a parameter-server exchange of ``nbytes`` (see ``ps_ms``)."""
        if not servers or nbytes <= 0:
            return 0.0, 0.0
        workers = tuple(dict.fromkeys(workers))
        key = "\n".join(dict.fromkeys(servers))
        return (self._expression("ps-push", workers, key).ms(nbytes),
                self._expression("ps-pull", workers, key).ms(nbytes))

    def ps_ms(self, workers: Sequence[str], servers: Sequence[str], nbytes: float,
              shares: Sequence[float] | None = None) -> float:
        """Parameter-server exchange: push gradients, then pull parameters.

        Parameters are sharded evenly over ``servers``; every worker pushes its
        shard to each server and pulls it back. A worker that is also a server
        exchanges its own shard locally. Bounded below by the busiest server NIC.
        """
        del shares  # every replica pushes a full gradient whatever its batch share
        push, pull = self.ps_phases_ms(workers, servers, nbytes)
        return push + pull

    def sfb_ms(self, devices: Sequence[str], batch_size: int, in_features: int,
               out_features: int, elem_bytes: int = 4) -> float:
        """Sufficient-factor broadcasting of one weight gradient (TAG's lossless compression).

        Each replica all-gathers its slice of the layer input (batch x in) and of
        the output gradient (batch x out); the gradient is then recomputed
        locally (the recompute is charged by the caller as compute).
        """
        n = len(devices)
        per_device = batch_size / n * (in_features + out_features) * elem_bytes
        return self.allgather_ms(devices, per_device)


class CostModel(NetworkCosts):
    """Costs of one op graph on one cluster.

    Parameters
    ----------
    graph : OpGraph
        The profiled model.
    topology : Topology or Cluster
        The cluster.
    reference : str, optional
        Device type whose measurements calibrate the roofline; by default the
        type with the most measured ops.

    Per-op times per device type are precomputed into numpy arrays
    (``fwd_ms_by_type``, ``bwd_ms_by_type``, shape ``[ops, types]``, at the
    graph's batch, and their batch-independent parts ``fwd_fixed_by_type``,
    ``bwd_fixed_by_type``; ``tie_sum_by_type``, the part of a tied weight's owner's
    backward that sums the weight's gradients, lies within the fixed part) so that planners
    can vectorise; ``op_ms`` reads from them, and ``scale_by_batch`` / ``scale_table``
    scale them. Construction is
    O(ops x device types); every query after that is O(1) or O(route length).
    """

    # ``estimator(cost_model, op_ids, device, phase, batch_fraction) -> ms`` of a fused group
    # of two ops or more; None: the rule of ``fused_ms``
    fused_estimator: Callable[..., float] | None = None

    def __init__(self, graph: OpGraph, topology: Topology | Cluster, *,
                 reference: str | None = None):
        super().__init__(topology)
        self.graph = graph
        self.op_ids: list[str] = [op.id for op in graph.ops]
        self.op_index: dict[str, int] = {op_id: i for i, op_id in enumerate(self.op_ids)}
        # one column per device type and core count: a CPU profile's op times scale to a
        # device's cores (``extrapolation.at_threads``); ``type_index`` names each type's first
        types: dict[tuple[str, int | None], DeviceType] = {}
        for d in self.cluster.devices:
            types.setdefault((d.type.name, d.type.cpu_cores), d.type)
        self.device_types: list[DeviceType] = list(types.values())
        column = {key: i for i, key in enumerate(types)}
        self.type_index: dict[str, int] = {}
        for i, t in enumerate(self.device_types):
            self.type_index.setdefault(t.name, i)
        self.device_type_index = {d.name: column[(d.type.name, d.type.cpu_cores)]
                                  for d in self.cluster.devices}
        self.reference = reference or _reference_type(graph)
        self.launch_ms_by_type = np.array([t.launch_overhead_us / 1e3 for t in self.device_types])
        (self.fwd_ms_by_type, self.bwd_ms_by_type, self.fwd_fixed_by_type,
         self.bwd_fixed_by_type, self.tie_sum_by_type) = self._compute_tables()
        self.param_bytes = np.array([op.param_bytes for op in graph.ops], dtype=np.float64)
        self.output_bytes = np.array([op.output_bytes for op in graph.ops], dtype=np.float64)
        self.resident_bytes = np.array([op.resident_bytes for op in graph.ops], dtype=np.float64)
        self.input_bytes = np.zeros(len(graph.ops))
        self._out_edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for e in graph.edges:
            self.input_bytes[self.op_index[e.dst]] += e.bytes
            self._out_edges[e.src].append((e.dst, e.bytes))

    @cached_property
    def topological_ids(self) -> list[str]:
        """The graph's op ids in topological order (file order among independent ops), cached."""
        return self.graph.topological_ids()

    @cached_property
    def ties(self) -> list[tuple[str, str, str, float]]:
        """``tied_weights`` of the graph, cached."""
        return tied_weights(self.graph)

    @cached_property
    def tie_rows(self) -> dict[str, float]:
        """``lookup_rows`` of the graph, cached."""
        return lookup_rows(self.graph)

    def exchangeable(self, owner: str, owner_devices: Sequence[str],
                     sharer_devices: Sequence[Sequence[str]]) -> bool:
        """``exchangeable`` on this graph's lookups (``tie_rows``)."""
        return exchangeable(self.tie_rows, owner, owner_devices, sharer_devices)

    def unit_action_ms(self, device: str) -> float:
        """CPU the training runtime spends per unit action (a unit's forward or backward on a
        microbatch) beyond its ops' time, on a CPU device of the profile's type: the
        profile's ``unit_action_ms`` (measured on one thread; Python, not split by threads);
        0 elsewhere or where the profile did not measure it."""
        info = self._cpu_profile(device)
        return 0.0 if info is None or info.unit_action_ms is None else info.unit_action_ms

    def turn_ms(self, device: str, op_ids: Iterable[str]) -> float:
        """CPU a turn between forward and backward costs a unit of ``op_ids`` on a CPU
        device of the profile's type (what an action that does not turn saves against the
        op times, which hold one): the profile's ``turn_ms`` (the whole model's, on one
        thread) times the ops' share of the model's batch-independent time there (forward
        and backward; of its whole time where none was measured): what the turn finds cold
        is what the ops touch whatever the batch. 0 elsewhere or where not measured."""
        info = self._cpu_profile(device)
        if info is None or not info.turn_ms:
            return 0.0
        return info.turn_ms * self._fixed_share(device, op_ids)

    def cold_ms(self, device: str, op_ids: Iterable[str]) -> tuple[float, float]:
        """What the first forward and the first backward of a step cost ``op_ids`` more on
        a CPU device of the profile's type than passes right after a pass of their own size
        (the op times' context): the profile's ``cold_fwd_ms`` and ``cold_bwd_ms`` (the
        whole model's) times the ops' share as in ``turn_ms``. 0 elsewhere or where not
        measured."""
        info = self._cpu_profile(device)
        if info is None or not (info.cold_fwd_ms or info.cold_bwd_ms):
            return 0.0, 0.0
        share = self._fixed_share(device, op_ids)
        return (info.cold_fwd_ms or 0.0) * share, (info.cold_bwd_ms or 0.0) * share

    def _fixed_share(self, device: str, op_ids: Iterable[str]) -> float:
        """``op_ids``' share of the model's batch-independent time (forward and backward) on
        ``device``'s type; of its whole time where no fixed parts were measured."""
        j = self.device_type_index[device]
        fixed = self.fwd_fixed_by_type[:, j] + self.bwd_fixed_by_type[:, j]
        if fixed.sum() <= 0:
            fixed = self.fwd_ms_by_type[:, j] + self.bwd_ms_by_type[:, j]
        total = float(fixed.sum())
        if total <= 0:
            return 0.0
        return float(fixed[[self.op_index[o] for o in op_ids]].sum()) / total

    def op_action_ms(self, device: str) -> float | None:
        """CPU per further unit action alone (the profile's ``op_action_ms``: measured with
        every op a unit of its own) on a CPU device of the profile's type; 0 elsewhere, None
        where the profile did not measure it."""
        info = self._cpu_profile(device)
        return 0.0 if info is None else info.op_action_ms

    def co_run_slowdown(self, device: str) -> float:
        """How much slower compute runs on a CPU device of the profile's type while another
        device of its host computes (the profile's ``co_run_slowdown``, ``profilers.corun``);
        1 elsewhere or where the profile did not measure it."""
        info = self._cpu_profile(device)
        return 1.0 if info is None or info.co_run_slowdown is None else info.co_run_slowdown

    def update_co_run_slowdown(self, device: str) -> float:
        """How much slower the update (the optimizer's step and the gradients' zeroing) runs
        on a CPU device of the profile's type while another device of its host runs its
        training iteration (the profile's ``update_co_run_slowdown``); the compute's
        ``co_run_slowdown`` where the profile did not measure it; 1 elsewhere."""
        info = self._cpu_profile(device)
        if info is None or info.update_co_run_slowdown is None:
            return self.co_run_slowdown(device)
        return info.update_co_run_slowdown

    def loss_ms(self, device: str, batch_fraction: float = 1.0) -> float:
        """The loss's forward and backward (outside the graph: in no op's time) on a device
        of the profile's type, at ``batch_fraction`` of the profiled batch: the profile's
        ``loss_fixed_ms + (loss_ms - loss_fixed_ms) x fraction`` (the whole ``loss_ms`` at
        every fraction where the fixed part was not measured); 0 elsewhere or where the
        profile did not measure it. The runtime computes it on every microbatch."""
        info = self.graph.profile
        dev = self.cluster.device(device)
        if info is None or info.loss_ms is None or dev.type.name != info.device_type:
            return 0.0
        fixed = info.loss_ms if info.loss_fixed_ms is None else info.loss_fixed_ms
        return fixed + (info.loss_ms - fixed) * batch_fraction

    def exchange_add_ms(self, device: str, nbytes: float) -> float:
        """A tie exchange's sum on ``device``: scan ``nbytes`` of gradient for non-zero
        rows (one pass) and add what was received into it (a backward's accumulation)."""
        bandwidth = self.cluster.device(device).type.memory_bandwidth_gb_per_s * 1e6
        return nbytes * (1.0 + ACCUMULATE_PASSES) / bandwidth

    @cached_property
    def needs_grad(self) -> dict[str, bool]:
        """Op id -> whether its backward runs: it or an ancestor has parameters or is
        marked ``runs_backward`` (a source recorded its backward work). The
        simulator lowers no backward for the others (nothing upstream wants their input
        gradients), so planners and bounds charge them none either."""
        preds: dict[str, list[str]] = defaultdict(list)
        for e in self.graph.edges:
            preds[e.dst].append(e.src)
        index = self.graph.index
        needs: dict[str, bool] = {}
        for op in self.topological_ids:
            needs[op] = (index[op].param_bytes > 0 or index[op].runs_backward
                         or any(needs[p] for p in preds[op]))
        return needs

    @cached_property
    def bwd_runs(self) -> np.ndarray:
        """``needs_grad`` as 0/1 per op in graph order (to mask ``bwd_ms_by_type`` rows)."""
        return np.array([1.0 if self.needs_grad[o] else 0.0 for o in self.op_ids])

    @cached_property
    def ops_by_id(self) -> dict:
        """Op id -> Op of the graph, cached."""
        return self.graph.index

    # ---------------------------------------------------------------- compute
    def _compute_tables(self) -> tuple[np.ndarray, ...]:
        n, k = len(self.graph.ops), len(self.device_types)
        fwd = np.zeros((n, k))
        bwd = np.zeros((n, k))
        fwd_fixed = np.zeros((n, k))
        bwd_fixed = np.zeros((n, k))
        tie_sum = np.zeros((n, k))
        lent: dict[str, dict[str, float]] = defaultdict(dict)  # owner -> tied weight -> bytes
        for name, owner, _, nbytes in tied_weights(self.graph):
            lent[owner][name] = nbytes
        ref = (_lookup_type(self.reference, self.device_types)
               if self.reference and any(op.tie_sum_ms for op in self.graph.ops) else None)
        for i, op in enumerate(self.graph.ops):
            bwd_flops = op.bwd_flops or (2 * op.flops if op.param_bytes else op.flops)
            # a measured tie sum is memory-bound work apart from the op's own backward
            tie_ref = op.tie_sum_ms.get(self.reference) if op.id in lent else None
            bwd_ref = op.bwd_ms.get(self.reference)
            eff_f = self._efficiency(op.fwd_ms.get(self.reference), op.flops, op.bytes_accessed)
            eff_b = self._efficiency(None if bwd_ref is None else bwd_ref - (tie_ref or 0.0),
                                     bwd_flops, 2 * op.bytes_accessed)
            for j, t in enumerate(self.device_types):
                tie = self._tie_sum_ms(op, t, lent.get(op.id), tie_ref, ref)
                extra = tie if tie_ref is not None else 0.0
                fwd[i, j] = _measured_or(op.fwd_ms, t, lambda t=t: _roofline_ms(
                    op.flops, op.bytes_accessed, t, eff_f, self.graph.model.dtype))
                bwd[i, j] = _measured_or(op.bwd_ms, t, lambda t=t, extra=extra: _roofline_ms(
                    bwd_flops, 2 * op.bytes_accessed, t, eff_b, self.graph.model.dtype) + extra
                    if (op.bwd_ms or op.flops or op.param_bytes) else 0.0)
                launch = self.launch_ms_by_type[j]
                f_at, b_at = self._thread_scaling(op, t, fwd[i, j], bwd[i, j])
                f_scale = f_at / fwd[i, j] if fwd[i, j] > 0 else 1.0
                b_scale = b_at / bwd[i, j] if bwd[i, j] > 0 else 1.0
                fwd[i, j], bwd[i, j] = f_at, b_at
                f_fixed, b_fixed = self._fixed_at_threads(op, t)
                fwd_fixed[i, j] = min(op.fwd_fixed_ms.get(t.name, launch) * f_scale
                                      if f_fixed is None else f_fixed, fwd[i, j])
                bwd_fixed[i, j] = min(op.bwd_fixed_ms.get(t.name, launch + tie) * b_scale
                                      if b_fixed is None else b_fixed, bwd[i, j])
                tie_sum[i, j] = min(tie, bwd_fixed[i, j])
        return fwd, bwd, fwd_fixed, bwd_fixed, tie_sum

    def _thread_scaling(self, op, t: DeviceType, fwd_ms: float, bwd_ms: float
                        ) -> tuple[float, float]:
        """``op``'s forward and backward times (``fwd_ms``, ``bwd_ms`` as measured) carried
        to the cores of a CPU type ``t`` (``extrapolation.at_threads``); unchanged where the
        profile timed no other thread count or ``t`` has its threads."""
        profile, cores = self.graph.profile, t.cpu_cores
        if (profile is None or cores is None or cores == profile.threads
                or not op.fwd_ms_by_threads):
            return fwd_ms, bwd_ms
        out = []
        for measured, by_threads, ms in ((op.fwd_ms, op.fwd_ms_by_threads, fwd_ms),
                                         (op.bwd_ms, op.bwd_ms_by_threads, bwd_ms)):
            points = thread_points(profile, t.name, measured, by_threads)
            out.append(at_threads(points, cores) if points else ms)
        return out[0], out[1]

    def _fixed_at_threads(self, op, t: DeviceType) -> tuple[float | None, float | None]:
        """``op``'s batch-independent forward and backward parts at the cores of a CPU type
        ``t``, from those the profile measured at each thread count it timed
        (``extrapolation.at_threads`` over them); None where it measured them at one count
        only (the caller scales that one by the op's factor) or ``t`` has its threads."""
        profile, cores = self.graph.profile, t.cpu_cores
        if (profile is None or cores is None or cores == profile.threads
                or not op.fwd_fixed_ms_by_threads):
            return None, None
        out: list[float | None] = []
        for measured, by_threads in ((op.fwd_fixed_ms, op.fwd_fixed_ms_by_threads),
                                     (op.bwd_fixed_ms, op.bwd_fixed_ms_by_threads)):
            points = thread_points(profile, t.name, measured, by_threads)
            out.append(at_threads(points, cores) if points else None)
        return out[0], out[1]

    @staticmethod
    def _tie_sum_ms(op, t: DeviceType, lent: dict[str, float] | None, tie_ref: float | None,
                    ref: DeviceType | None) -> float:
        """How long ``op``'s backward on type ``t`` sums the gradients of the tied weights it
        owns (``lent``: name -> bytes): measured on ``t``; else the reference type's
        measurement scaled by memory bandwidth; else ``ACCUMULATE_PASSES`` over their bytes."""
        if not lent:
            return 0.0
        if t.name in op.tie_sum_ms:
            return float(op.tie_sum_ms[t.name])
        if tie_ref is not None and ref is not None:
            return tie_ref * ref.memory_bandwidth_gb_per_s / t.memory_bandwidth_gb_per_s
        return sum(lent.values()) * ACCUMULATE_PASSES / (t.memory_bandwidth_gb_per_s * 1e6)

    def _efficiency(self, measured_ms: float | None, flops: float, nbytes: float) -> float | None:
        """Roofline time over measured time on the reference type; None when unmeasured."""
        if measured_ms is None or measured_ms <= 0 or self.reference is None:
            return None
        ref = _lookup_type(self.reference, self.device_types)
        ideal = _roofline_ms(flops, nbytes, ref, 1.0, self.graph.model.dtype, launch=False)
        launch = ref.launch_overhead_us / 1e3
        return min(1.0, max(MIN_EFFICIENCY, ideal / max(measured_ms - launch, 1e-6)))

    @cached_property
    def bwd_input_share(self) -> np.ndarray:
        """Per op (graph order): the share of its backward that computes input gradients,
        by FLOPs (``Op.bwd_input_flops / Op.bwd_flops``); the rest computes weight gradients.
        1 (all of it, nothing to defer) where the FLOPs were not counted or there are none."""
        return np.array([op.bwd_input_flops / op.bwd_flops
                         if op.bwd_input_flops is not None and op.bwd_flops > 0 else 1.0
                         for op in self.graph.ops])

    def op_ms(self, op_id: str, device: str, phase: str = "fwd", batch_fraction: float = 1.0) -> float:
        """Time of one op's forward (``phase="fwd"``) or backward on ``device``.

        ``batch_fraction`` is the share of the graph's batch this device
        processes (a replica's share times a microbatch's fraction).
        """
        i = self.op_index[op_id]
        j = self.device_type_index[device]
        if phase == "fwd":
            return scale_by_batch(float(self.fwd_ms_by_type[i, j]),
                                  float(self.fwd_fixed_by_type[i, j]), batch_fraction)
        return scale_by_batch(float(self.bwd_ms_by_type[i, j]), float(self.bwd_fixed_by_type[i, j]),
                              batch_fraction)

    def tie_sum_ms(self, op_id: str, device: str) -> float:
        """Of ``op_id``'s backward on ``device``, the batch-independent time spent summing the
        gradients of the tied weights it owns from their uses: a plan that puts a use on
        another device sums there by communication instead (0 for ops that own none)."""
        return float(self.tie_sum_by_type[self.op_index[op_id], self.device_type_index[device]])

    def ops_ms(self, op_ids: Iterable[str], device: str, batch_fraction: float = 1.0) -> tuple[float, float]:
        """Summed (forward, backward) time of ``op_ids`` on ``device`` at ``batch_fraction``."""
        idx = [self.op_index[o] for o in op_ids]
        j = self.device_type_index[device]
        return (float(scale_table(self.fwd_ms_by_type[idx, j], self.fwd_fixed_by_type[idx, j],
                                  batch_fraction).sum()),
                float(scale_table(self.bwd_ms_by_type[idx, j], self.bwd_fixed_by_type[idx, j],
                                  batch_fraction).sum()))

    def fixed_ms(self, op_ids: Iterable[str], device: str) -> tuple[float, float]:
        """Summed (forward, backward) batch-independent time of ``op_ids`` on ``device``: what
        they take at any batch (0 where no fixed parts were measured)."""
        idx = [self.op_index[o] for o in op_ids]
        j = self.device_type_index[device]
        return (float(self.fwd_fixed_by_type[idx, j].sum()),
                float(self.bwd_fixed_by_type[idx, j].sum()))

    def scaled_tables(self, cols, batch_fraction) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) ``[ops, len(cols)]`` tables of device-type columns ``cols`` at
        ``batch_fraction`` (a scalar, or an array broadcasting against ``[ops, cols]``)."""
        return (scale_table(self.fwd_ms_by_type[:, cols], self.fwd_fixed_by_type[:, cols],
                            batch_fraction),
                scale_table(self.bwd_ms_by_type[:, cols], self.bwd_fixed_by_type[:, cols],
                            batch_fraction))

    def fused_ms(self, op_ids: Sequence[str], device: str, phase: str = "fwd",
                 batch_fraction: float = 1.0) -> float:
        """Time of ``op_ids`` fused into one kernel on ``device``.

        Fusion saves all launches but one, and the memory round trip (write
        then read) of every tensor that stays inside the fused kernel; it never
        takes less than the slowest member. Where ``fused_estimator`` is set (a
        learned estimator, ``planners.disco.estimator``), a group of two ops or
        more takes what it answers instead.
        """
        times = [self.op_ms(o, device, phase, batch_fraction) for o in op_ids]
        if len(times) <= 1:
            return sum(times)
        if self.fused_estimator is not None:
            return self.fused_estimator(self, op_ids, device, phase, batch_fraction)
        t = self.device_types[self.device_type_index[device]]
        inside = set(op_ids)
        internal_bytes = sum(nbytes for src in inside for dst, nbytes in self._out_edges.get(src, ())
                             if dst in inside)
        saved = (len(times) - 1) * t.launch_overhead_us / 1e3
        saved += 2 * internal_bytes * batch_fraction / (t.memory_bandwidth_gb_per_s * 1e6)
        return max(sum(times) - saved, max(times))

    def update_ms(self, param_bytes: float, device: str,
                  optimizer: Optimizer = Optimizer.SGD) -> float:
        """Optimizer step over ``param_bytes`` of parameters on ``device`` (memory bound)."""
        if param_bytes <= 0:
            return 0.0
        return self.update_launch_ms(device) + param_bytes * self.update_ms_per_byte(
            device, optimizer)

    def update_ms_per_byte(self, device: str, optimizer: Optimizer = Optimizer.SGD) -> float:
        """The per-parameter-byte part of ``update_ms``: on a CPU device of the profile's
        type, the step the profile timed over the model's parameters (``ProfileInfo.
        update_ns_per_byte``); elsewhere ``UPDATE_PASSES`` at the memory bandwidth."""
        measured = self._cpu_profile(device)
        if measured is not None and optimizer.value in measured.update_ns_per_byte:
            return measured.update_ns_per_byte[optimizer.value] * 1e-6
        return UPDATE_PASSES[optimizer] / (
            self.cluster.device(device).type.memory_bandwidth_gb_per_s * 1e6)

    def _cpu_profile(self, device: str) -> ProfileInfo | None:
        """The graph's profile where ``device`` is a CPU of the profile's type (its measured
        update and zeroing rates apply there); else None."""
        info = self.graph.profile
        dev = self.cluster.device(device)
        if info is None or dev.type.kind.value != "cpu" or dev.type.name != info.device_type:
            return None
        return info

    def update_launch_ms(self, device: str) -> float:
        """The fixed part of ``update_ms``."""
        return self.cluster.device(device).type.launch_overhead_us / 1e3

    def upkeep_ms(self, grad_bytes: float, device: str, accumulations: int = 1) -> float:
        """Per step, the upkeep of ``grad_bytes`` of gradient buckets on ``device``: zeroed
        once, added into by ``accumulations`` backward passes (one per microbatch)."""
        return grad_bytes * self.upkeep_ms_per_byte(device, accumulations)

    def accumulate_ms_per_byte(self, device: str) -> float:
        """One backward pass adding a gradient byte into its bucket on ``device``: the
        adding the profile timed (``ProfileInfo.accumulate_ns_per_byte``, on a CPU device
        of its type), else ``ACCUMULATE_PASSES`` at the memory bandwidth."""
        measured = self._cpu_profile(device)
        if measured is not None and measured.accumulate_ns_per_byte is not None:
            return measured.accumulate_ns_per_byte * 1e-6
        return ACCUMULATE_PASSES / (self.cluster.device(device).type.memory_bandwidth_gb_per_s * 1e6)

    def upkeep_ms_per_byte(self, device: str, accumulations: int = 1) -> float:
        """The per-gradient-byte cost of ``upkeep_ms``: the zeroing the profile timed
        (``ProfileInfo.zero_ns_per_byte``, on a CPU device of its type) or
        ``ZERO_PASSES`` at the memory bandwidth, and ``accumulate_ms_per_byte`` per
        backward."""
        bandwidth = self.cluster.device(device).type.memory_bandwidth_gb_per_s * 1e6
        measured = self._cpu_profile(device)
        zero = (measured.zero_ns_per_byte * 1e-6
                if measured is not None and measured.zero_ns_per_byte is not None
                else ZERO_PASSES / bandwidth)
        return zero + accumulations * self.accumulate_ms_per_byte(device)

    def sfb_factors(self, op_id: str, elem_bytes: int = 4) -> tuple[float, float, float] | None:
        """``(rows, in_features, out_features)`` of a matmul op with parameters, or None.

        Recovered from its input bytes ``I = rows x in``, output bytes
        ``O = rows x out`` and parameter bytes ``P = in x out`` (elements times
        ``elem_bytes``): ``rows = sqrt(I x O / (elem_bytes x P))``. Rows count every
        token of the batch (batch x sequence for a transformer). The output is the
        tensor the op passes on (its largest outgoing edge), not ``Op.output_bytes``:
        a profile records there what the backward pass keeps, which is nothing for a
        matmul whose input is what autograd saves.
        """
        from dl_nfv.artifacts import OpKind

        i = self.op_index[op_id]
        op = self.graph.ops[i]
        p, inp, out = self.param_bytes[i], self.input_bytes[i], self._produced_bytes(op_id)
        if op.kind != OpKind.MATMUL or p <= 0 or inp <= 0 or out <= 0:
            return None
        rows = math.sqrt(inp * out / (elem_bytes * p))
        return rows, inp / (elem_bytes * rows), out / (elem_bytes * rows)

    def sfb_op_ms(self, op_id: str, devices: Sequence[str], elem_bytes: int = 4) -> float | None:
        """All-gather time of an op's sufficient factors over ``devices`` (None if not a matmul)."""
        factors = self.sfb_factors(op_id, elem_bytes)
        if factors is None:
            return None
        rows, fin, fout = factors
        return self.sfb_ms(devices, rows, fin, fout, elem_bytes)

    def _produced_bytes(self, op_id: str) -> float:
        """Bytes of the tensor an op passes on: its largest outgoing edge, or
        ``Op.output_bytes`` for an op nothing reads."""
        edges = self._out_edges.get(op_id)
        if edges:
            return float(max(nbytes for _, nbytes in edges))
        return float(self.output_bytes[self.op_index[op_id]])

    def sfb_factor_bytes(self, op_id: str) -> float:
        """Bytes of all of an op's sufficient factors over the batch: its input plus its output."""
        return float(self.input_bytes[self.op_index[op_id]] + self._produced_bytes(op_id))

    def sfb_recompute_ms(self, op_id: str, device: str, own_share: float) -> float:
        """Recomputing an op's weight gradient from the other replicas' factors on ``device``.

        The weight gradient is half of a matmul's backward work; the device
        already has its own share, so it recomputes ``1 - own_share`` of the batch.
        """
        rest = 1.0 - own_share
        if rest <= 0:
            return 0.0
        return 0.5 * self.op_ms(op_id, device, "bwd", rest)

    # ----------------------------------------------------------------- memory
    def static_bytes(self, op_ids: Iterable[str], state_factor: float = 1.0) -> float:
        """Parameters + gradients + optimizer state of ``op_ids``, plus their resident
        footprints (``Op.resident_bytes``): what a device running them holds all iteration."""
        rows = [self.op_index[o] for o in op_ids]
        params = sum(self.param_bytes[i] for i in rows)
        return params * (2.0 + state_factor) + sum(self.resident_bytes[i] for i in rows)

    def activation_bytes(self, op_ids: Iterable[str], batch_fraction: float = 1.0) -> float:
        """Stashed activations (op outputs) of ``op_ids`` for ``batch_fraction`` of the batch."""
        return sum(self.output_bytes[self.op_index[o]] for o in op_ids) * batch_fraction

    def replica_bytes(self, state_factor: float = 1.0) -> float:
        """One replica of the whole graph on one device: ``static_bytes`` of every op and
        every op's activations at the full batch (what the ``single`` planner needs)."""
        return self.static_bytes(self.op_ids, state_factor) + self.activation_bytes(self.op_ids)

    def memory_bytes(self, device: str) -> int:
        return self.cluster.device(device).memory_bytes


def _ms_per_byte(bandwidth_gbps: float) -> float:
    """Milliseconds per byte at ``bandwidth_gbps`` (10^9 bits per second)."""
    return 8.0 / (bandwidth_gbps * 1e6)


def scale_by_batch(ms: float, fixed_ms: float, batch_fraction: float) -> float:
    """An op time at full batch scaled to a fraction of the batch: ``fixed`` does not scale."""
    if batch_fraction == 1.0 or ms <= fixed_ms:
        return ms
    return fixed_ms + (ms - fixed_ms) * batch_fraction


def scale_table(times: np.ndarray, fixed: np.ndarray, batch_fraction) -> np.ndarray:
    """``scale_by_batch`` elementwise (``fixed`` and ``batch_fraction`` broadcast)."""
    if np.isscalar(batch_fraction) and batch_fraction == 1.0:
        return times
    return np.where(times > fixed, fixed + (times - fixed) * batch_fraction, times)


def _lookup_type(name: str, types: list[DeviceType]) -> DeviceType:
    from dl_nfv.artifacts.devices import lookup

    for t in types:
        if t.name == name:
            return t
    return lookup(name)


def _reference_type(graph: OpGraph) -> str | None:
    counts: dict[str, int] = defaultdict(int)
    for op in graph.ops:
        for name in op.fwd_ms:
            counts[name] += 1
    return max(counts, key=counts.__getitem__) if counts else None


def _measured_or(measured: dict[str, float], device_type: DeviceType, estimate) -> float:
    value = measured.get(device_type.name)
    return float(value) if value is not None else float(estimate())


def _roofline_ms(flops: float, nbytes: float, device_type: DeviceType, efficiency: float | None,
                 dtype: str = "float32", *, launch: bool = True) -> float:
    if efficiency is None:
        compute_eff, memory_eff = DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY
    else:
        compute_eff = memory_eff = efficiency
    compute_ms = flops / (device_type.peak_tflops(dtype) * 1e9 * compute_eff)
    memory_ms = nbytes / (device_type.memory_bandwidth_gb_per_s * 1e6 * memory_eff)
    return (device_type.launch_overhead_us / 1e3 if launch else 0.0) + max(compute_ms, memory_ms)


class _Expression:
    """A collective's cost as a function of its size ``S`` (bytes): ``sum_t max_k (a + b S)``.

    Every phase of a collective is affine in ``S`` (latency plus the busiest
    link's bytes over bandwidth); an algorithm adds phases in sequence (terms)
    and waits for the slowest of concurrent parts (the max inside a term).
    ``links`` maps each directed link to the bytes it carries per byte of ``S``.
    """

    __slots__ = ("terms", "links")

    def __init__(self, terms: list[list[tuple[float, float]]], links: dict | None = None):
        self.terms = terms
        self.links = links or {}

    def ms(self, nbytes: float) -> float:
        return sum(max(a + b * nbytes for a, b in term) for term in self.terms)


def _scaled(load: dict, factor: float) -> dict:
    return {hop: w * factor for hop, w in load.items()}


def _add(into: dict, load: dict) -> None:
    for hop, w in load.items():
        into[hop] += w
