"""What the network adds to the stage-balanced bound, from the cost model's figures only.

* **AllReduce floors** (``allreduce_floors``): per group size ``k``, and per vector of
  device counts per class, the least ms per parameter byte any AllReduce of such a group
  takes. The cost model's AllReduce is the fastest of ring, tree and hierarchical, whose
  phases cross each link with the figures the topology gives collectives there; each moves
  at least ``2 (k - 1) / k`` bytes per byte over one route at a time (ring: ``2 (k - 1)``
  steps of ``1 / k``; tree: the whole payload up and down; hierarchical over ``m`` hosts of
  at most ``l`` members: ``2 (1 - 1 / (m l))`` with ``m l >= k``), so at least that over
  the fastest route between two devices; a group no host holds alone spans hosts, each of
  which receives at least the payload through its links from outside (at best the hosts
  with the fastest such links that hold ``k`` devices); and every algorithm carries the
  whole payload across any cut of the network with members on both sides, so the
  narrowest cut any ``k`` devices can have (from the Gomory-Hu tree of the link
  capacities) is a floor too. On clusters of at most ``EXACT_GROUPS_UP_TO`` devices the
  floor is exact instead: the cost model's own per-byte cost (``allreduce_ms_per_byte``)
  of the best group of that size, or of that mix of classes.
* **Boundaries** (``Boundaries``): where two single-op regions meet, every plan that cuts
  there sends the edge between them to each replica of the stage after, before its first
  forward (and the gradient back after its last backward where the op before needs one):
  at least one sample over the best route, and at least the least latency plus the
  replica's samples over the most a device can receive at once.
* **Tied weights** (``tie_terms``): a stage that holds the later user of a tied weight and
  not the earlier one splits the tie, whose gradient is then summed over at least two
  devices after the earlier user's last backward, which the last microbatch reaches only
  after passing back from this stage.

Limits: links are taken as free of other traffic; transfers of a boundary and AllReduces
never wait for each other in the bound.

Complexity: O(D^2) routes (O(D) on a uniform cluster, ``pairs``), a Gomory-Hu tree (D max-flows), and on small clusters the
cost model's AllReduce of every group (2^D).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

if TYPE_CHECKING:
    from dl_nfv.planners.pipeline.problem import Problem

EXACT_GROUPS_UP_TO = 12  # clusters this small take the AllReduce floor over every group


@dataclass(frozen=True, kw_only=True, slots=True)
class AllReduceFloors:
    """Least ms per byte of an AllReduce: ``by_size[k]`` over any ``k`` of the devices,
    ``by_vector[n]`` over groups of class-count vector ``n`` (``class_states`` order)."""

    by_size: np.ndarray
    by_vector: np.ndarray


def allreduce_floors(p: Problem, devices: list[str], device_class: list[int],
                     vectors: list[tuple[int, ...]]) -> AllReduceFloors:
    """The floors described in the module docstring; ``device_class[d]`` is the class of
    ``devices[d]``, ``vectors`` the class-count vectors."""
    by_size = _host_limits(p, devices)
    by_vector = by_size[np.array([sum(kv) for kv in vectors])]
    if len(devices) <= EXACT_GROUPS_UP_TO:
        floors = _group_floors(p, devices, device_class, len(vectors[-1]))
        exact: dict[int, float] = {}
        for kv, value in floors.items():
            exact[sum(kv)] = min(exact.get(sum(kv), np.inf), value)
        for k, value in exact.items():
            by_size[k] = max(by_size[k], value)
        by_vector = np.array([max(float(by_size[sum(kv)]), floors.get(kv, 0.0))
                              for kv in vectors])
    return AllReduceFloors(by_size=by_size, by_vector=by_vector)


def _host_limits(p: Problem, devices: list[str]) -> np.ndarray:
    """Per group size k: the fastest route's and the hosts' floors (module docstring), and
    the narrowest cut's (``_cut_limits``), whichever is largest."""
    cm = p.cm
    cluster = cm.cluster
    sizes: dict[str, int] = {}
    for d in devices:
        host = cluster.device(d).host
        sizes[host] = sizes.get(host, 0) + 1
    # ms per byte into each host over its links from outside, as an AllReduce sees them
    inbound = {host: cm.inbound_ms_per_byte(
        {host, *(d.name for d in cluster.devices if d.host == host)}, collective=True)
        for host in sizes}
    widest = max(sizes.values())
    ranked = sorted(sizes, key=lambda h: (inbound[h], -sizes[h], h))
    out = np.zeros(len(devices) + 1)
    for k in range(widest + 1, len(devices) + 1):
        held = 0
        for h in ranked:
            held += sizes[h]
            if held >= k:
                per_byte = inbound[h]
                break
        out[k] = per_byte if np.isfinite(per_byte) else 0.0
    # any group: 2 (k - 1) / k bytes per byte over routes no faster than the fastest
    fastest = min((cm.route_ms_per_byte(d, e, collective=True) for d, e in pairs(p, devices)),
                  default=0.0)
    for k in range(2, len(devices) + 1):
        out[k] = max(out[k], 2.0 * (k - 1) / k * fastest)
    return np.maximum(out, _cut_limits(cm.capacity_graph(collective=True), devices))


def pairs(p: Problem, devices: list[str]) -> list[tuple[str, str]]:
    """The ordered device pairs whose routes the floors take the least of: every pair, or on
    a uniform cluster (``symmetry.uniform_labels``) bounded on all of its devices, the pairs
    from its first device. Its automorphisms map any device onto any other and routes onto
    routes with the same figures, so every pair's figures are some such pair's: the least
    is the same, at ``D - 1`` routes instead of ``D (D - 1)``."""
    if p.labels is not None and sorted(devices) == sorted(p.devices):
        return [(devices[0], e) for e in devices[1:]]
    return [(a, b) for a in devices for b in devices if a != b]


def _group_floors(p: Problem, devices: list[str], device_class: list[int],
                  classes: int) -> dict[tuple[int, ...], float]:
    """Per class-count vector: the least ms per byte of the cost model's own AllReduce (the
    fastest of its algorithms, ``allreduce_ms_per_byte``) over every group of at least two
    ``devices`` with those counts of each class."""
    out: dict[tuple[int, ...], float] = {}
    for k in range(2, len(devices) + 1):
        for group in combinations(range(len(devices)), k):
            counts = [0] * classes
            for d in group:
                counts[device_class[d]] += 1
            key = tuple(counts)
            value = p.cm.allreduce_ms_per_byte([devices[d] for d in group])
            if value < out.get(key, np.inf):
                out[key] = value
    return out


def _cut_limits(graph: nx.Graph, devices: list[str]) -> np.ndarray:
    """Per group size k: the least ms per byte over the best-connected cut of any k devices,
    on ``graph`` whose links carry ``bytes_per_ms`` (``NetworkCosts.capacity_graph``).

    A phase takes at least the bytes it puts across a cut over the cut's summed capacity,
    and every algorithm puts the whole payload across any cut with members on both sides:
    so ``1 / mincut(G)`` is a floor for a group ``G``, and the least over groups of ``k``
    devices is reached at the largest ``lambda`` at which some component of the Gomory-Hu
    tree, cut at its edges narrower than ``lambda``, holds ``k`` of the devices.
    """
    out = np.zeros(len(devices) + 1)
    if len(devices) < 2 or not nx.is_connected(graph):
        return out
    # Dinitz's max-flow: the least cut between two nodes is the same whatever finds it, and
    # so is every component above, so any flow algorithm gives the same limits (this one
    # takes about half of Edmonds-Karp's time on 256 A100s' leaf-spine)
    tree = nx.gomory_hu_tree(graph, capacity="bytes_per_ms",
                             flow_func=nx.algorithms.flow.dinitz)
    count = {v: int(v in devices) for v in tree}
    parent = {v: v for v in tree}

    def root(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    largest = max(count.values())
    for a, b, w in sorted(tree.edges(data="weight"), key=lambda e: -e[2]):
        ra, rb = root(a), root(b)
        parent[ra] = rb
        count[rb] += count[ra]
        # groups of up to count[rb] devices have a min cut of at least w
        for k in range(largest + 1, count[rb] + 1):
            out[k] = 1.0 / w
        largest = max(largest, count[rb])
    return out


class Boundaries:
    """The least time crossing the boundary before each region adds to a replica's way.

    Where regions ``i - 1`` and ``i`` are single ops, every plan that cuts there sends the
    edge between them from other devices (every device is in at most one stage) to each
    replica after it, before its first forward: its share, ``c`` samples, perhaps in parts
    from several replicas, and the gradient back after its last backward when that op needs
    one. A lone transfer takes its route's latency plus its bytes at the route's ms per
    byte, and parts share the links into the device: at least one sample over the best
    route, and at least the least latency plus ``c`` samples at the least ms per byte into
    any device over all of its links. Where a region may be split the cut may fall inside
    it: nothing.
    """

    def __init__(self, p: Problem, cuts: list[int], split: np.ndarray, devices: list[str],
                 forced: list[int] | None = None):
        # per forced cut (``forced``, default ``cuts``), then at ``cuts``, a subset of them
        forced = list(cuts) if forced is None else list(forced)
        fine_split = (split if forced == list(cuts)
                      else np.array([b - a > 1 for a, b in zip(forced, forced[1:])]))
        regions = len(forced) - 1
        one = np.zeros(regions + 1)  # one sample over the best route (ms)
        per_sample = np.zeros(regions + 1)  # ms per sample through the widest way in
        ways = np.zeros(regions + 1)
        self.latency = 0.0  # the least route latency (ms)
        cm = p.cm
        routes = pairs(p, devices)
        if routes:
            # every pair's transfer as the cost model's affine figures, asked once
            affine = np.array([cm.transfer_affine(a, b) for a, b in routes])
            self.latency = float(affine[:, 0].min())
            # the most bytes per ms any device can receive, all of its links at once
            inbound = min(cm.inbound_ms_per_byte([d])
                          for d in dict.fromkeys(a for a, _ in routes))
            largest: dict[tuple[str, str], float] = {}
            for e in p.graph.edges:
                largest[(e.src, e.dst)] = max(largest.get((e.src, e.dst), 0.0), float(e.bytes))
            for i in range(1, regions):
                if fine_split[i - 1] or fine_split[i]:
                    continue
                u, v = p.order[forced[i] - 1], p.order[forced[i]]
                nbytes = largest.get((u, v), 0.0) / p.batch_size
                if nbytes > 0:
                    one[i] = float((affine[:, 0] + nbytes * affine[:, 1]).min())
                    per_sample[i] = nbytes * inbound
                    ways[i] = 2 if p.needs_grad[u] else 1
        self._forced = (one, per_sample, ways)
        self._at = np.searchsorted(np.asarray(forced), np.asarray(cuts))  # cuts among forced
        # where a region of ``cuts`` may be split, a cut next to it may fall inside it: nothing
        alone = np.ones(len(cuts), dtype=bool)
        alone[1:] &= ~np.asarray(split, dtype=bool)
        alone[:-1] &= ~np.asarray(split, dtype=bool)
        self.one, self.per_sample, self.ways = (np.where(alone, x[self._at], 0.0)
                                                for x in self._forced)

    def _ms(self, arrays, samples: np.ndarray, one_way: bool) -> np.ndarray:
        samples = np.where(np.isfinite(samples), samples, 0.0)
        shape = (-1, *[1] * samples.ndim)
        one, per_sample, ways = (x.reshape(shape) for x in (
            arrays[0], arrays[1], np.minimum(arrays[2], 1) if one_way else arrays[2]))
        with np.errstate(invalid="ignore"):
            out = ways * np.maximum(one, self.latency + per_sample * samples[None])
        return np.where((samples[None] > 0) & (one > 0), out, 0.0)

    def ms(self, samples: np.ndarray, one_way: bool = False) -> np.ndarray:
        """``[i, *samples.shape]``: the boundary before region ``i`` for a replica of
        ``samples``, both ways (or the way in only); 0 where there is nothing to count or
        ``samples`` is not finite."""
        return self._ms((self.one, self.per_sample, self.ways), samples, one_way)

    def through(self, samples: float, one_way: bool = False) -> np.ndarray:
        """``[i]``: the most the boundaries up to the one before region ``i`` take for a
        replica of ``samples``, summed over every forced cut there (a plan that cuts inside
        a merged block crosses one of them)."""
        return np.cumsum(self._ms(self._forced, np.array(samples), one_way))[self._at]

    def drain_most(self, backward_fixed: np.ndarray, backward_scalable: np.ndarray,
                   samples: float) -> np.ndarray:
        """``[i]``: the most the stages in front of region ``i`` add to a chain offset beyond
        their forwards: the backward of every op before ``i`` (its fixed and scalable parts
        as the chain takes them, for a whole microbatch) and the way back over every
        (forced) boundary before it. A chain offset less this is at most the forward chain,
        after which a stage may start; where plans split backwards only that offset holds
        for the weight gradients, which may overlap the drain of the stages in front."""
        back = np.cumsum(self._ms(self._forced, np.array(samples), True))
        crossings = np.concatenate([[0.0], back[:-1]])[self._at]  # boundaries before i
        return backward_fixed + backward_scalable + crossings


def tie_terms(p: Problem, cuts: list[int], before: np.ndarray, pair_floor: float,
              exchange: bool) -> np.ndarray:
    """``[i, j]``: what tied weights add after the busy time of a stage of regions ``[i, j)``.

    A stage that holds the later user of a tied weight and not the earlier one splits the
    tie; its chain-offset term gains the AllReduce floor of a two-device group
    (``pair_floor`` ms per byte), less ``before[a]``, the chain of the regions before the
    earlier user's region ``a`` (their backward may overlap it). Where the plans may
    exchange the tie (``exchange``, an owner that is a lookup), the later user needs only
    the owner's rows, one way, at the same floor per byte. Ties within one region are left
    out (the region counts for neither stage that may split it).
    """
    regions = len(cuts) - 1
    out = np.zeros((regions + 1, regions + 1))
    if not p.cm.ties:
        return out
    region = np.searchsorted(np.asarray(cuts), np.arange(len(p.order)), side="right") - 1
    for _, owner, sharer, nbytes in p.cm.ties:
        a, b = sorted((int(region[p.pos[owner]]), int(region[p.pos[sharer]])))
        if a == b:
            continue
        if exchange and owner in p.cm.tie_rows:  # only the owner's rows need come back
            nbytes = min(nbytes, p.cm.tie_rows[owner])
        term = max(0.0, nbytes * pair_floor - float(before[a]))
        # stages [i, j) with a < i <= b < j
        out[a + 1:b + 1, b + 1:] += term
    return out
