"""Symmetry of uniform clusters, and the nested sub-clusters the search starts from.

A cluster is **uniform** (``uniform_labels``) when every host is the same (one device
entry, so identical devices; the same interconnect, host links and a single NIC with the
same figures), every NIC switch (a *leaf*) holds the same number of hosts, and the
explicit links, if any, join each leaf once to one common other switch (a *spine*) with the
same figures. Such a cluster's graph is a tree of leaves above hosts, each host a mesh or
a bridge of interchangeable devices, so every permutation of the devices of a host, of the
hosts of a leaf and of the leaves is an automorphism of the topology that maps routes to
routes and links to links with equal figures. The A100 leaf-spine clusters of the scale
benchmark are uniform; a cluster of mixed hosts is not.

* ``canonical(labels, devices)``: a sequence of devices with each leaf and each host
  renamed by its first appearance. Two sequences with the same form are mapped onto each
  other, position by position, by such an automorphism. Every cost-model expression of a
  collective is a function of its devices in ring order (``NetworkCosts.ring_order``) and of
  the routes and link figures between them, so ``collective_key`` (the canonical form of
  the ring order) is an exact cache key of ``allreduce_affine``: one query per class of
  device groups instead of one per group.
* Device orderings whose canonical forms agree are explored once (``search.py``): their
  stage costs differ only where the cost model's rings visit hosts in name order rather
  than in the ordering's (the leaves a ring crosses between hosts of one group).
* ``sub_topology(topology, hosts)``: the first ``hosts`` hosts with the switches and links
  among them. In a uniform cluster every route between two of its devices stays inside
  it, so a plan on the sub-cluster runs and simulates identically on the whole cluster:
  ``planner.py`` plans the hosts of the first half of the leaves first (``nested_hosts``;
  on one leaf, its first host), recursively, and keeps that plan as the incumbent of the
  larger cluster.

Limits: only this shape of symmetry is recognised (no partial symmetry of mixed clusters,
no symmetry of explicit device-device links), and the checks are on the topology record,
so two equivalent files written differently (a host's devices in two entries) are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dl_nfv.artifacts import Topology

Labels = Mapping[str, tuple[str, str]]  # device -> (leaf switch, host)


def uniform_labels(topology: Topology) -> dict[str, tuple[str, str]] | None:
    """``device -> (leaf, host)`` when ``topology`` is uniform (module docstring), else None."""
    hosts = topology.hosts
    first = hosts[0]
    if len(first.devices) != 1 or len(first.nics) != 1:
        return None
    if any(not _same_host(h, first) for h in hosts[1:]):
        return None
    leaf_of = {h.name: h.nics[0].switch for h in hosts}
    leaves = sorted(set(leaf_of.values()))
    per_leaf = {leaf: 0 for leaf in leaves}
    for leaf in leaf_of.values():
        per_leaf[leaf] += 1
    if len(set(per_leaf.values())) != 1 or not _leaf_spine(topology, set(leaves)):
        return None
    return {d: (leaf_of[d.split("/", 1)[0]], d.split("/", 1)[0]) for d in topology.device_names}


def _same_host(a, b) -> bool:
    return (a.devices[0].type == b.devices[0].type and len(a.devices) == 1
            and _spec_figures(a.devices[0]) == _spec_figures(b.devices[0])
            and a.interconnect == b.interconnect and a.host_link_gbps == b.host_link_gbps
            and a.host_link_latency_us == b.host_link_latency_us and len(a.nics) == 1
            and (a.nics[0].bandwidth_gbps, a.nics[0].latency_us)
            == (b.nics[0].bandwidth_gbps, b.nics[0].latency_us))


def _spec_figures(spec) -> tuple:
    return (spec.type, spec.count, spec.prefix, spec.memory_gib, spec.fp32_tflops,
            spec.fp16_tflops, spec.memory_bandwidth_gb_per_s, spec.cores)


def _leaf_spine(topology: Topology, leaves: set[str]) -> bool:
    """No links with one leaf, or each leaf linked once to one common spine, same figures."""
    if not topology.links:
        return len(leaves) == 1
    spines, figures, linked = set(), set(), []
    for link in topology.links:
        a, b = link.endpoints
        leaf, spine = (a, b) if a in leaves else (b, a)
        if leaf not in leaves or spine in leaves:
            return False
        spines.add(spine)
        figures.add((link.bandwidth_gbps, link.latency_us))
        linked.append(leaf)
    switches = {s.name for s in topology.switches}
    return (len(spines) == 1 and len(figures) == 1 and spines <= switches
            and sorted(linked) == sorted(leaves))


def canonical(labels: Labels, devices: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """``devices`` with each leaf and host renamed by its first appearance."""
    leaves: dict[str, int] = {}
    hosts: dict[str, int] = {}
    return tuple((leaves.setdefault(labels[d][0], len(leaves)),
                  hosts.setdefault(labels[d][1], len(hosts))) for d in devices)


def collective_key(cm, labels: Labels | None, devices: Sequence[str]) -> tuple:
    """Cache key of a collective over ``devices``: the canonical form of their ring order
    on a uniform cluster (exact, see the module docstring), else the device set."""
    if labels is None:
        return tuple(sorted(devices))
    return canonical(labels, cm.ring_order(devices))


def sub_topology(topology: Topology, hosts: int) -> Topology:
    """The first ``hosts`` hosts of ``topology``, their NIC switches, the switches no other
    host hangs off, and the links among those (switches left unlinked dropped)."""
    from dataclasses import replace

    kept = topology.hosts[:hosts]
    nic_switches = {n.switch for h in topology.hosts for n in h.nics}
    mine = {n.switch for h in kept for n in h.nics}
    names = {*mine, *(s.name for s in topology.switches if s.name not in nic_switches)}
    names |= {h.name for h in kept} | {d for d in topology.device_names
                                       if d.split("/", 1)[0] in {h.name for h in kept}}
    links = tuple(link for link in topology.links if set(link.endpoints) <= names)
    used = mine | {e for link in links for e in link.endpoints}
    switches = tuple(s for s in topology.switches if s.name in used)
    return replace(topology, name=f"{topology.name}[:{hosts} hosts]", hosts=kept,
                   switches=switches, links=links)


def nested_hosts(topology: Topology) -> int:
    """Hosts of the sub-cluster a uniform cluster's plan starts from: the first half of its
    leaves' hosts, or on a single leaf its first host; 0 for a single host or a cluster that
    is not uniform."""
    labels = uniform_labels(topology)
    count = len(topology.hosts)
    if count < 2 or labels is None:
        return 0
    leaves = len({leaf for leaf, _ in labels.values()})
    return 1 if leaves == 1 else leaves // 2 * (count // leaves)
