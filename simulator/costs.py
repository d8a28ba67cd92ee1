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
    ``launch + (t - launch) * f``: launch overhead does not shrink with the batch.

Communication
    A transfer over a route takes ``latency + bytes / bottleneck bandwidth``.
    Collectives are analytical and congestion-aware: each phase is a set of
    concurrent flows, and a phase takes the largest route latency plus, over
    every directed link, the bytes all flows put on it divided by its
    bandwidth. So a ring AllReduce of S bytes over N devices on uniform links
    takes exactly ``2(N-1)/N * S/B + 2(N-1) * latency``, a PS exchange is bounded
    by the server's NIC, and rings that cross a shared NIC pay for it.

Memory
    Parameters, gradients (same size) and optimizer state (``state_factor``
    times the parameters) stay resident; activations (op outputs) of every
    in-flight microbatch are stashed until their backward.

Limits (honest): no kernel-level contention between concurrent ops on one
device, no NCCL protocol switching (LL/LL128/Simple), no overlap of a
collective's phases, the efficiency calibration assumes an op is as
efficient relative to its roofline on every device type.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import Cluster, Collective, OpGraph, Topology, cluster_of
from dl_nfv.artifacts.devices import DeviceType

MIN_EFFICIENCY = 0.05
DEFAULT_COMPUTE_EFFICIENCY = 0.5
DEFAULT_MEMORY_EFFICIENCY = 0.7
# Bytes moved per parameter byte by an optimizer step: read param + grad, write param,
# read and write each state tensor.
UPDATE_PASSES = 3.0


@dataclass(frozen=True, slots=True)
class Flow:
    """A point-to-point flow of ``nbytes`` from device ``src`` to device ``dst``."""

    src: str
    dst: str
    nbytes: float


class CostModel:
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
    (``fwd_ms_by_type``, ``bwd_ms_by_type``, shape ``[ops, types]``) so that
    planners can vectorise; ``op_ms`` reads from them. Construction is
    O(ops x device types); every query after that is O(1) or O(route length).
    """

    def __init__(self, graph: OpGraph, topology: Topology | Cluster, *,
                 reference: str | None = None):
        self.graph = graph
        self.cluster = topology if isinstance(topology, Cluster) else cluster_of(topology)
        self.op_ids: list[str] = [op.id for op in graph.ops]
        self.op_index: dict[str, int] = {op_id: i for i, op_id in enumerate(self.op_ids)}
        types: dict[str, DeviceType] = {}
        for d in self.cluster.devices:
            types.setdefault(d.type.name, d.type)
        self.device_types: list[DeviceType] = list(types.values())
        self.type_index = {t.name: i for i, t in enumerate(self.device_types)}
        self.device_type_index = {d.name: self.type_index[d.type.name] for d in self.cluster.devices}
        self.reference = reference or _reference_type(graph)
        self.fwd_ms_by_type, self.bwd_ms_by_type = self._compute_tables()
        self.launch_ms_by_type = np.array([t.launch_overhead_us / 1e3 for t in self.device_types])
        self.param_bytes = np.array([op.param_bytes for op in graph.ops], dtype=np.float64)
        self.output_bytes = np.array([op.output_bytes for op in graph.ops], dtype=np.float64)

    # ---------------------------------------------------------------- compute
    def _compute_tables(self) -> tuple[np.ndarray, np.ndarray]:
        n, k = len(self.graph.ops), len(self.device_types)
        fwd = np.zeros((n, k))
        bwd = np.zeros((n, k))
        for i, op in enumerate(self.graph.ops):
            bwd_flops = op.bwd_flops or (2 * op.flops if op.param_bytes else op.flops)
            eff_f = self._efficiency(op.fwd_ms.get(self.reference), op.flops, op.bytes_accessed)
            eff_b = self._efficiency(op.bwd_ms.get(self.reference), bwd_flops, 2 * op.bytes_accessed)
            for j, t in enumerate(self.device_types):
                fwd[i, j] = _measured_or(op.fwd_ms, t, lambda t=t: _roofline_ms(
                    op.flops, op.bytes_accessed, t, eff_f, self.graph.model.dtype))
                bwd[i, j] = _measured_or(op.bwd_ms, t, lambda t=t: _roofline_ms(
                    bwd_flops, 2 * op.bytes_accessed, t, eff_b, self.graph.model.dtype)
                    if (op.bwd_ms or op.flops or op.param_bytes) else 0.0)
        return fwd, bwd

    def _efficiency(self, measured_ms: float | None, flops: float, nbytes: float) -> float | None:
        """Roofline time over measured time on the reference type; None when unmeasured."""
        if measured_ms is None or measured_ms <= 0 or self.reference is None:
            return None
        ref = _lookup_type(self.reference, self.device_types)
        ideal = _roofline_ms(flops, nbytes, ref, 1.0, self.graph.model.dtype, launch=False)
        launch = ref.launch_overhead_us / 1e3
        return min(1.0, max(MIN_EFFICIENCY, ideal / max(measured_ms - launch, 1e-6)))

    def op_ms(self, op_id: str, device: str, phase: str = "fwd", batch_fraction: float = 1.0) -> float:
        """Time of one op's forward (``phase="fwd"``) or backward on ``device``.

        ``batch_fraction`` is the share of the graph's batch this device
        processes (a replica's share times a microbatch's fraction).
        """
        i = self.op_index[op_id]
        j = self.device_type_index[device]
        table = self.fwd_ms_by_type if phase == "fwd" else self.bwd_ms_by_type
        return scale_by_batch(float(table[i, j]), float(self.launch_ms_by_type[j]), batch_fraction)

    def ops_ms(self, op_ids: Iterable[str], device: str, batch_fraction: float = 1.0) -> tuple[float, float]:
        """Summed (forward, backward) time of ``op_ids`` on ``device`` at ``batch_fraction``."""
        idx = [self.op_index[o] for o in op_ids]
        j = self.device_type_index[device]
        launch = float(self.launch_ms_by_type[j])
        return (_scaled_sum(self.fwd_ms_by_type[idx, j], launch, batch_fraction),
                _scaled_sum(self.bwd_ms_by_type[idx, j], launch, batch_fraction))

    def fused_ms(self, op_ids: Sequence[str], device: str, phase: str = "fwd",
                 batch_fraction: float = 1.0) -> float:
        """Time of ``op_ids`` fused into one kernel on ``device``.

        Fusion saves all launches but one, and the memory round trip (write
        then read) of every tensor that stays inside the fused kernel; it never
        takes less than the slowest member.
        """
        times = [self.op_ms(o, device, phase, batch_fraction) for o in op_ids]
        if len(times) <= 1:
            return sum(times)
        t = self.device_types[self.device_type_index[device]]
        inside = set(op_ids)
        internal_bytes = sum(e.bytes for e in self.graph.edges if e.src in inside and e.dst in inside)
        saved = (len(times) - 1) * t.launch_overhead_us / 1e3
        saved += 2 * internal_bytes * batch_fraction / (t.memory_bandwidth_gb_per_s * 1e6)
        return max(sum(times) - saved, max(times))

    def update_ms(self, param_bytes: float, device: str, state_factor: float = 1.0) -> float:
        """Optimizer step over ``param_bytes`` of parameters on ``device`` (memory bound)."""
        if param_bytes <= 0:
            return 0.0
        t = self.cluster.device(device).type
        moved = param_bytes * (UPDATE_PASSES + 2 * state_factor)
        return t.launch_overhead_us / 1e3 + moved / (t.memory_bandwidth_gb_per_s * 1e6)

    # ---------------------------------------------------------- communication
    def transfer_ms(self, src: str, dst: str, nbytes: float) -> float:
        """Point-to-point transfer of ``nbytes`` from ``src`` to ``dst`` (0 when equal)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return self.cluster.route(src, dst).transfer_us(nbytes) / 1e3

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
        worst_us = max(nbytes * 8 / (self.cluster.link(*hop)["bandwidth_gbps"] * 1e3)
                       for hop, nbytes in load.items())
        return (latency + worst_us) / 1e3

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
        index = {d.name: (d.host, d.index) for d in self.cluster.devices}
        return sorted(devices, key=lambda name: index[name])

    def allreduce_ms(self, devices: Sequence[str], nbytes: float,
                     algorithm: Collective = Collective.AUTO) -> float:
        """AllReduce of ``nbytes`` over ``devices`` by ring, tree or hierarchical algorithm.

        ``AUTO`` takes the fastest of the three. Raises ``ValueError`` for an
        unknown algorithm.
        """
        devices = list(dict.fromkeys(devices))
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        if algorithm is Collective.AUTO:
            return min(self.allreduce_ms(devices, nbytes, a)
                       for a in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL))
        if algorithm is Collective.RING:
            return self._ring_allreduce_ms(self.ring_order(devices), nbytes)
        if algorithm is Collective.TREE:
            return self._tree_allreduce_ms(self.ring_order(devices), nbytes)
        if algorithm is Collective.HIERARCHICAL:
            return self._hierarchical_allreduce_ms(devices, nbytes)
        raise ValueError(f"unknown collective {algorithm!r}")

    def _ring_step_ms(self, ring: Sequence[str], chunk_bytes: float) -> float:
        return self.concurrent_ms(Flow(a, b, chunk_bytes) for a, b in zip(ring, [*ring[1:], ring[0]]))

    def _ring_allreduce_ms(self, ring: Sequence[str], nbytes: float) -> float:
        n = len(ring)
        return 2 * (n - 1) * self._ring_step_ms(ring, nbytes / n)

    def _tree_allreduce_ms(self, order: Sequence[str], nbytes: float) -> float:
        # Pipelined binary tree: reduce up then broadcast down; each of the
        # ceil(log2 n) levels pays latency once, the payload crosses each edge once per
        # direction (bandwidth term of the slowest level, twice).
        n = len(order)
        levels = math.ceil(math.log2(n))
        worst_level = 0.0
        latency = 0.0
        for level in range(levels):
            stride = 2 ** level
            flows = [Flow(order[i + stride], order[i], nbytes)
                     for i in range(0, n - stride, 2 * stride)]
            t = self.concurrent_ms(flows)
            lat = max(self.cluster.route(f.src, f.dst).latency_us for f in flows) / 1e3
            latency += lat
            worst_level = max(worst_level, t - lat)
        return 2 * (latency + worst_level)

    def _hierarchical_allreduce_ms(self, devices: Sequence[str], nbytes: float) -> float:
        by_host: dict[str, list[str]] = defaultdict(list)
        for name in self.ring_order(devices):
            by_host[self.cluster.device(name).host].append(name)
        hosts = list(by_host.values())
        local = max(len(h) for h in hosts)
        # intra-host reduce-scatter and all-gather, all hosts at once
        # (hosts are disjoint, so each host's ring runs on its own links)
        intra = max((self._ring_allreduce_ms(h, nbytes) for h in hosts if len(h) > 1), default=0.0)
        if len(hosts) == 1:
            return intra
        # inter-host: one ring per local rank, each over 1/local of the data, sharing NICs
        rings = [[h[i % len(h)] for h in hosts] for i in range(local)]
        m = len(hosts)
        step = self.concurrent_ms(Flow(a, b, nbytes / local / m) for ring in rings
                                  for a, b in zip(ring, [*ring[1:], ring[0]]))
        return intra + 2 * (m - 1) * step

    def allgather_ms(self, devices: Sequence[str], nbytes_per_device: float) -> float:
        """Ring all-gather: every device ends with every device's ``nbytes_per_device``."""
        ring = self.ring_order(list(dict.fromkeys(devices)))
        if len(ring) <= 1:
            return 0.0
        return (len(ring) - 1) * self._ring_step_ms(ring, nbytes_per_device)

    def broadcast_ms(self, root: str, devices: Sequence[str], nbytes: float) -> float:
        """Pipelined tree broadcast of ``nbytes`` from ``root`` to ``devices``."""
        others = [d for d in dict.fromkeys(devices) if d != root]
        if not others:
            return 0.0
        order = [root, *self.ring_order(others)]
        levels = math.ceil(math.log2(len(order)))
        latency = 0.0
        worst = 0.0
        for level in range(levels):
            stride = 2 ** level
            flows = [Flow(order[i], order[i + stride], nbytes)
                     for i in range(0, len(order) - stride, 2 * stride)]
            lat = max(self.cluster.route(f.src, f.dst).latency_us for f in flows) / 1e3
            latency += lat
            worst = max(worst, self.concurrent_ms(flows) - lat)
        return latency + worst

    def ps_ms(self, workers: Sequence[str], servers: Sequence[str], nbytes: float,
              shares: Sequence[float] | None = None) -> float:
        """Parameter-server exchange: push gradients, then pull parameters.

        Parameters are sharded evenly over ``servers``; every worker pushes its
        shard to each server and pulls it back. A worker that is also a server
        exchanges its own shard locally. Bounded below by the busiest server NIC.
        """
        del shares  # every replica pushes a full gradient whatever its batch share
        if not servers or nbytes <= 0:
            return 0.0
        shard = nbytes / len(servers)
        push = [Flow(w, s, shard) for w in workers for s in servers if w != s]
        pull = [Flow(s, w, shard) for w in workers for s in servers if w != s]
        return self.concurrent_ms(push) + self.concurrent_ms(pull)

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

    # ----------------------------------------------------------------- memory
    def static_bytes(self, op_ids: Iterable[str], state_factor: float = 1.0) -> float:
        """Parameters + gradients + optimizer state of ``op_ids`` (bytes)."""
        params = sum(self.param_bytes[self.op_index[o]] for o in op_ids)
        return params * (2.0 + state_factor)

    def activation_bytes(self, op_ids: Iterable[str], batch_fraction: float = 1.0) -> float:
        """Stashed activations (op outputs) of ``op_ids`` for ``batch_fraction`` of the batch."""
        return sum(self.output_bytes[self.op_index[o]] for o in op_ids) * batch_fraction

    def memory_bytes(self, device: str) -> int:
        return self.cluster.device(device).memory_bytes


def scale_by_batch(ms: float, launch_ms: float, batch_fraction: float) -> float:
    """An op time scaled to a fraction of the batch; launch overhead does not scale."""
    if batch_fraction == 1.0:
        return ms
    if ms <= launch_ms:
        return ms
    return launch_ms + (ms - launch_ms) * batch_fraction


def _scaled_sum(times: np.ndarray, launch_ms: float, batch_fraction: float) -> float:
    if batch_fraction == 1.0:
        return float(times.sum())
    return float(np.where(times > launch_ms, launch_ms + (times - launch_ms) * batch_fraction,
                          times).sum())


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
