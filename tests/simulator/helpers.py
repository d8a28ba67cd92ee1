"""Small graphs, clusters and plans built by hand, with op times measured on the device type."""

from __future__ import annotations

from collections.abc import Sequence

from dl_nfv.artifacts import (
    Edge,
    Group,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    Plan,
    Topology,
    fingerprint,
    from_data,
)

GPU = "V100-16GB"


def op(op_id: str, fwd_ms: float = 1.0, bwd_ms: float = 2.0, *, param_bytes: int = 0,
       output_bytes: int = 0, kind: OpKind = OpKind.OTHER, device_type: str = GPU) -> Op:
    return Op(id=op_id, name=op_id, kind=kind, param_bytes=param_bytes, output_bytes=output_bytes,
              fwd_ms={device_type: fwd_ms}, bwd_ms={device_type: bwd_ms})


def graph(ops: Sequence[Op], edges: Sequence[tuple[str, str, int]] = (), batch_size: int = 8,
          name: str = "hand") -> OpGraph:
    return OpGraph(model=ModelRef(name=name, batch_size=batch_size), ops=tuple(ops),
                   edges=tuple(Edge(src=a, dst=b, bytes=n) for a, b, n in edges))


def chain(n: int, fwd_ms: float = 1.0, bwd_ms: float = 2.0, *, param_bytes: int = 4,
          edge_bytes: int = 0, batch_size: int = 8) -> OpGraph:
    """``n`` ops in a line, each with parameters, joined by edges of ``edge_bytes``."""
    ops = [op(f"op{i}", fwd_ms, bwd_ms, param_bytes=param_bytes, output_bytes=edge_bytes)
           for i in range(n)]
    edges = [(f"op{i}", f"op{i + 1}", edge_bytes) for i in range(n - 1)]
    return graph(ops, edges, batch_size)


def mesh(n: int, *, bandwidth_gbps: float = 100.0, latency_us: float = 1.0,
         device_type: str = GPU, name: str = "mesh") -> Topology:
    """One host of ``n`` devices joined pairwise by direct links (NVLink-style full mesh).

    The PCIe links to the host bridge are made slow to reach, so routes use the mesh.
    """
    return from_data(Topology, {
        "name": name,
        "hosts": [{"name": "m", "devices": [{"type": device_type, "count": n}],
                   "host_link_latency_us": 1000.0,
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": bandwidth_gbps,
                                    "latency_us": latency_us}}]})


def star(hosts: int, *, per_host: int = 1, nic_gbps: float = 10.0, nic_latency_us: float = 5.0,
         device_type: str = GPU) -> Topology:
    """``hosts`` hosts, each with one NIC to a single switch."""
    return from_data(Topology, {
        "name": "star",
        "hosts": [{"name": f"h{i}", "devices": [{"type": device_type, "count": per_host}],
                   "nics": [{"switch": "sw", "bandwidth_gbps": nic_gbps,
                             "latency_us": nic_latency_us}]} for i in range(hosts)],
        "switches": [{"name": "sw"}]})


def plan(g: OpGraph, t: Topology, groups: Sequence[Group], **fields) -> Plan:
    return Plan(planner="hand", graph_sha256=fingerprint(g), topology_sha256=fingerprint(t),
                batch_size=g.model.batch_size, groups=tuple(groups), **fields)


def one_group(g: OpGraph, devices: Sequence[str], **fields) -> Group:
    return Group(id="all", ops=tuple(o.id for o in g.ops), devices=tuple(devices), **fields)
