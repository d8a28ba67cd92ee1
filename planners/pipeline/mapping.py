"""Device orderings: sequences of the cluster's devices whose contiguous runs become stages.

The partition DP places each stage on a contiguous run of an ordering, and
charges the transfer between stages to the route between neighbours in it,
so an ordering should (a) keep each host's devices together (cheap
replication and cheap boundaries inside a host), (b) put well-connected
hosts next to each other, and (c) put slow or small devices at an end, where
the DP may leave them out. Candidates:

* the topology's own order (host by host);
* hosts by decreasing and by increasing compute speed;
* bandwidth-greedy paths: from every start device, repeatedly step to the
  unvisited device with the widest (then lowest-latency) route; the best of
  these by total per-byte transfer time along the path (on a ring of mixed
  links this walks the ring and cuts it at its slowest link);
* hosts grouped by device type, the groups in every order (2-4 types), so that
  the DP, which may leave either end of an ordering unused, can keep one or two
  types together (on the TAG cluster: the V100 and P100 hosts without the
  1080Tis between them);
* with tied weights (an embedding shared by the first and last layers), each
  of those also *folded*: rotated to start halfway through its first host, so
  that the first and last stages, which sum the tied weight's gradient, share
  a host's links;
* ``neighbours``: host-block swaps and reversals of a given ordering, for a
  local search driven by the DP's bottleneck (``search.py``).

Complexity: O(D^2 x hosts) for the greedy paths (D devices).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import numpy as np

from dl_nfv.simulator.costs import CostModel

# the transfer an ordering's neighbours are compared by: a megabyte, about one sample's
# activations of a layer, so that latency and bandwidth both count
PATH_PROBE_BYTES = 1e6


def host_blocks(cm: CostModel, ordering: Sequence[str]) -> list[list[str]]:
    """Maximal runs of ``ordering`` on one host."""
    blocks: list[list[str]] = []
    for d in ordering:
        host = cm.cluster.device(d).host
        if blocks and cm.cluster.device(blocks[-1][-1]).host == host:
            blocks[-1].append(d)
        else:
            blocks.append([d])
    return blocks


def _speed(cm: CostModel, device: str) -> float:
    j = cm.device_type_index[device]
    total = float(cm.fwd_ms_by_type[:, j].sum() + cm.bwd_ms_by_type[:, j].sum())
    return 1.0 / total if total > 0 else 1.0


def path_cost(cm: CostModel, ordering: Sequence[str]) -> float:
    """Sum over neighbours of the time to send ``PATH_PROBE_BYTES`` (ms)."""
    return sum(cm.transfer_ms(a, b, PATH_PROBE_BYTES) for a, b in zip(ordering, ordering[1:]))


def greedy_path(cm: CostModel, devices: Sequence[str], start: str,
                ranks: np.ndarray | None = None) -> list[str]:
    """Walk from ``start`` to the widest, then nearest, unvisited device each step (then the
    one with fewer hops, then the one first in ``devices``). ``ranks`` (``route_ranks``) may
    be passed when walking from many starts."""
    ranks = route_ranks(cm, devices) if ranks is None else ranks
    here = list(devices).index(start)
    visited = np.zeros(len(devices), dtype=bool)
    path = [here]
    visited[here] = True
    for _ in range(len(devices) - 1):
        here = int(np.argmin(np.where(visited, len(devices), ranks[here])))
        path.append(here)
        visited[here] = True
    return [devices[i] for i in path]


def route_ranks(cm: CostModel, devices: Sequence[str]) -> np.ndarray:
    """``[a, b]``: the rank of ``b`` among the devices seen from ``a``, by the widest route
    (the least ms per byte), then the lowest latency, then the fewest hops, then the order
    of ``devices``
    (O(D^2 log D), once for all the greedy walks)."""
    D = len(devices)
    ranks = np.zeros((D, D), dtype=np.int64)
    for a, here in enumerate(devices):
        keys = []
        for b, d in enumerate(devices):
            if b == a:
                keys.append((float("inf"), 0.0, 0, b))
                continue
            latency_ms, ms_per_byte = cm.transfer_affine(here, d)
            keys.append((ms_per_byte, latency_ms, len(cm.cluster.route(here, d).hops), b))
        for rank, (*_, b) in enumerate(sorted(keys)):
            ranks[a, b] = rank
    return ranks


def candidate_orderings(cm: CostModel, devices: Sequence[str] | None = None,
                        fold: bool = False) -> list[tuple[str, ...]]:
    """The deterministic candidate orderings described in the module docstring (deduplicated);
    with ``fold``, each also folded (``folded``)."""
    devices = list(devices or cm.cluster.device_names)
    out: list[tuple[str, ...]] = []

    def add(seq):
        t = tuple(seq)
        if t not in out and tuple(reversed(t)) not in out:
            out.append(t)

    add(devices)
    blocks = host_blocks(cm, devices)
    speed = {tuple(b): sum(_speed(cm, d) for d in b) / len(b) for b in blocks}
    by_speed = sorted(blocks, key=lambda b: (-speed[tuple(b)], blocks.index(b)))
    add([d for b in by_speed for d in b])
    add([d for b in reversed(by_speed) for d in b])
    ranks = route_ranks(cm, devices)
    paths = sorted((greedy_path(cm, devices, s, ranks) for s in devices),
                   key=lambda p: (path_cost(cm, p), p))
    for p in paths[:2]:
        add(p)
    for seq in by_kind(cm, blocks):
        add(seq)
    if fold:
        for seq in list(out):
            add(folded(cm, seq))
    return out


def by_kind(cm: CostModel, blocks: list[list[str]]) -> list[list[str]]:
    """Host blocks grouped by their device types, the groups in every order (2-4 groups)."""
    kinds: dict[tuple[str, ...], list[list[str]]] = {}
    for b in blocks:
        kind = tuple(sorted({cm.cluster.device(d).type.name for d in b}))
        kinds.setdefault(kind, []).append(b)
    if not 1 < len(kinds) <= 4:
        return []
    return [[d for k in perm for b in kinds[k] for d in b]
            for perm in itertools.permutations(kinds)]


def folded(cm: CostModel, ordering: Sequence[str]) -> tuple[str, ...]:
    """``ordering`` rotated to start halfway through its first host block, so that both of its
    ends are on one host (the first and last stages then share that host's links)."""
    first = host_blocks(cm, ordering)[0]
    k = len(first) // 2 if len(first) > 1 else len(first)
    return tuple(ordering[k:]) + tuple(ordering[:k])


def neighbours(cm: CostModel, ordering: Sequence[str], rng: random.Random, count: int) -> list[tuple[str, ...]]:
    """``count`` random host-block moves of ``ordering`` (swap two blocks, reverse one, move one)."""
    blocks = host_blocks(cm, ordering)
    out = []
    for _ in range(count):
        b = [list(x) for x in blocks]
        move = rng.randrange(3) if len(b) > 1 else 1
        if move == 0:
            i, j = rng.sample(range(len(b)), 2)
            b[i], b[j] = b[j], b[i]
        elif move == 1:
            i = rng.randrange(len(b))
            if len(b[i]) > 1:
                b[i].reverse()
            elif len(b) > 1:
                j = rng.randrange(len(b) - 1)
                b[j], b[j + 1] = b[j + 1], b[j]
        else:
            i = rng.randrange(len(b))
            block = b.pop(i)
            b.insert(rng.randrange(len(b) + 1), block)
        out.append(tuple(d for x in b for d in x))
    return out
