"""Random heterogeneous topologies for training and testing TAG: ``random:N`` specs.

``generate(seed)`` draws one cluster (numpy's seeded generator; same seed, same
topology) of 2 to ``MAX_DEVICES`` GPUs, in one of two shapes:

* **racks** (three draws in four): 1-3 racks of 1-3 hosts; each host holds 1, 2 or 4
  GPUs of one type drawn from the device catalog's GPUs (``artifacts.devices.CATALOG``),
  joined by NVLink (data-centre parts) or PCIe, with one NIC of 10-100 Gbps to its
  rack's top-of-rack switch; with more than one rack each top-of-rack switch has one
  uplink to a spine, oversubscribed 1:1, 2:1 or 4:1 against its NICs;
* **ring**: 4-8 single-GPU hosts of mixed types cabled in a ring of 10-100 Gbps direct
  links (no switch: traffic between non-neighbours crosses the GPUs between).

Every generated topology is built through the ``topology`` artifact (``from_data``),
so it passes the artifact's validation (names, endpoints, connectivity).

Specs (``topologies_of``): ``random:N`` is the N topologies of seeds 0..N-1,
``random:N:S`` those of seeds S..S+N-1; anything else is a topology file.

Limits: one GPU type per host; no CPU devices; one NIC per host; a spine with one
uplink per rack (no multi-path fabrics).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dl_nfv.artifacts import BadInput, DeviceKind, Topology, load
from dl_nfv.artifacts.devices import CATALOG
from dl_nfv.artifacts.records import from_data

MAX_DEVICES = 16
NVLINK_TYPES = ("V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100", "H200")
NIC_GBPS = (10, 25, 40, 100)
RING_GBPS = (10, 25, 40, 100)
OVERSUBSCRIPTION = (1, 2, 4)
SPEC = re.compile(r"random:(\d+)(?::(\d+))?")


def gpu_types() -> tuple[str, ...]:
    """The catalog's GPU types, in catalog order."""
    return tuple(name for name, t in CATALOG.items() if t.kind is DeviceKind.GPU)


def generate(seed: int) -> Topology:
    """The random topology of ``seed`` (module docstring), named ``random-<seed>``."""
    rng = np.random.default_rng(seed)
    while True:  # a cluster of one GPU has nothing to decide: draw again
        data = _ring(rng) if rng.random() < 0.25 else _racks(rng)
        if sum(d.get("count", 1) for h in data["hosts"] for d in h["devices"]) >= 2:
            break
    return from_data(Topology, {"kind": "topology", "schema_version": 1, "name": f"random-{seed}",
                                **data})


def _racks(rng: np.random.Generator) -> dict:
    types = gpu_types()
    hosts, switches, links, left = [], [], [], MAX_DEVICES
    racks = int(rng.integers(1, 4))
    for r in range(racks):
        nic_total = 0.0
        for h in range(int(rng.integers(1, 4))):
            count = min(int(rng.choice((1, 2, 4))), left)
            if count == 0:
                break
            left -= count
            kind = str(types[int(rng.integers(len(types)))])
            nvlink = kind in NVLINK_TYPES and count > 1
            nic = float(rng.choice(NIC_GBPS))
            nic_total += nic
            hosts.append({"name": f"r{r}h{h}", "devices": [{"type": kind, "count": count}],
                          "interconnect": ({"kind": "nvlink", "bandwidth_gbps": 800, "latency_us": 1}
                                           if nvlink else
                                           {"kind": "pcie", "bandwidth_gbps": 126, "latency_us": 1}),
                          "nics": [{"switch": f"tor{r}", "bandwidth_gbps": nic, "latency_us": 5}]})
        if nic_total == 0:
            break
        switches.append({"name": f"tor{r}"})
        if racks > 1:
            ratio = int(rng.choice(OVERSUBSCRIPTION))
            links.append({"endpoints": [f"tor{r}", "spine"], "bandwidth_gbps": nic_total / ratio,
                          "latency_us": 2})
    description = (f"generated: {len(hosts)} hosts in {len(switches)} rack(s), "
                   f"{MAX_DEVICES - left} GPUs")
    if links:
        switches.append({"name": "spine"})
    return {"description": description, "hosts": hosts, "switches": switches, "links": links}


def _ring(rng: np.random.Generator) -> dict:
    types = gpu_types()
    n = int(rng.integers(4, 9))
    hosts = [{"name": f"n{i}", "devices": [{"type": str(types[int(rng.integers(len(types)))])}]}
             for i in range(n)]
    links = [{"endpoints": [f"n{i}/gpu0", f"n{(i + 1) % n}/gpu0"],
              "bandwidth_gbps": float(rng.choice(RING_GBPS)), "latency_us": 3} for i in range(n)]
    return {"description": f"generated: a ring of {n} single-GPU hosts", "hosts": hosts,
            "links": links}


def seeds_of(spec: str) -> range | None:
    """The seeds a ``random:N[:S]`` spec names; None where ``spec`` is not ``random:``;
    ``BadInput`` naming a ``random:`` spec that does not parse or names no topology."""
    if not spec.startswith("random"):
        return None
    m = SPEC.fullmatch(spec)
    if m is None or int(m.group(1)) < 1:
        raise BadInput(f"topology spec {spec!r}: expected random:N or random:N:SEED with N >= 1")
    first = int(m.group(2) or 0)
    return range(first, first + int(m.group(1)))


def topologies_of(specs: Sequence[str]) -> list[tuple[str, Topology]]:
    """``(name, topology)`` for each spec: a file, or the topologies of a ``random:`` spec."""
    out = []
    for spec in specs:
        seeds = seeds_of(spec)
        if seeds is None:
            out.append((Path(spec).stem, load(spec, expect="topology")))
        else:
            out += [(f"random-{s}", generate(s)) for s in seeds]
    return out
