"""Import the JSON input of the NeurIPS 2020 device-placement algorithms
(Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph
Operators", msr-fiddle/dnn-partitioning) as an op graph.

Format::

    {"maxSizePerFPGA": 17185374208.0, "maxFPGAs": 6, "maxCPUs": 1,
     "nodes": [{"id": 4, "supportedOnFpga": 1, "cpuLatency": 1.4, "fpgaLatency": 0.14,
                "isBackwardNode": 0, "colorClass": 4, "size": 145489920.0, "name": "node4"}, ...],
     "edges": [{"sourceId": 4, "destId": 5, "cost": 0.0061, "size": 13107200.0}, ...]}

What the fields mean (the format's own definitions) and what each becomes:

* ``fpgaLatency``: the node's time on the accelerator ("FPGA" stands for any
  accelerator; the layer-level files were profiled on GPUs), in ms. A forward
  node's is its op's ``fwd_ms`` under ``device_type``; a backward node's is
  added to the ``bwd_ms`` of the forward ops of its colour class, shared in
  proportion to their forward times (evenly when those are all 0), and marks
  them ``runs_backward``: with no parameter bytes to go by, the simulator
  would otherwise skip the backward pass. A file without backward nodes (an
  inference workload) gives ops without ``bwd_ms``.
* ``colorClass`` (optional): nodes of one class must share a device. The
  forward ops of a class with two or more of them become a colocation group
  (``OpGraph.colocation``); a class's backward work runs with its forward ops.
  A node without ``colorClass`` is in a class of its own, as in the
  reference implementation.
* A backward node whose class has no forward node (an *orphaned* backward
  node; every backward node without ``colorClass`` is one): as the reference
  implementation does, the class gets an artificial forward op with zero
  time, and for every edge between backward nodes ``u -> v`` touching such a
  class, a forward edge ``forward(v) -> forward(u)`` (the mirror image, so
  the simulator's backward pass sends the gradient ``u -> v``).
* ``size`` (optional, default 0): the bytes the node takes on the
  accelerator. It is *not* parameter bytes: a forward node's size becomes its
  op's ``resident_bytes`` and the sizes of a class's backward nodes are added
  to its first forward op's (an artificial op's, for an orphaned class), held
  by every device that runs the op all iteration, as the format's memory limit
  counts every node's size. ``param_bytes`` and ``output_bytes`` stay 0: the file
  does not separate weights from activations, so no gradient synchronisation
  or optimizer step is charged.
* edge ``cost``: the time to move the source node's output between the
  accelerator and host memory (one figure per node: every edge leaving a node
  must carry the same cost). A forward edge keeps it as bytes,
  ``cost (ms) x transfer_gbps``, so that a link of ``transfer_gbps`` moves it
  in ``cost`` ms; the default, 2^31 bytes/s (17.18 Gbps), is the rate the
  published operator-level files computed their costs at (their edges' debug
  ``size`` equals ``cost x 2^31 / 1000``). Edges from forward to backward
  nodes (stashed activations stay with their class) and between backward
  nodes of paired classes (the mirror of a forward edge) add nothing.
* ``cpuLatency`` and ``supportedOnFpga`` are checked and dropped (the
  published files set the former to a fixed multiple of the accelerator time);
  ``name`` names the op (ids are the names when all are unique, else the node
  ids); ``layerId`` and an edge's ``size`` and ``isArtificial`` are debug
  fields; ``maxSizePerFPGA``, ``maxFPGAs`` and ``maxCPUs`` go to the model's
  options. Any other key is an error naming the node or edge.

The input must be acyclic and have no edge from a backward to a forward node
(as the reference implementation requires). Where mirror edges close a cycle
among the forward ops, its ops are fused into one colocation group and the
mirror edges among them dropped, as the reference implementation fuses the
strongly connected parts of its class graph.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

from dl_nfv.artifacts import (
    BadInput,
    Edge,
    InvalidArtifact,
    ModelRef,
    Op,
    OpGraph,
    ProfileInfo,
    lookup,
)

# 2^31 bytes per second, in Gbps: the rate behind the published files' edge costs
DEFAULT_TRANSFER_GBPS = 2**31 * 8 / 1e9

_TOP_KEYS = ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges")
_NODE_KEYS = ("id", "supportedOnFpga", "cpuLatency", "fpgaLatency", "isBackwardNode",
              "colorClass", "size", "name", "layerId")
_EDGE_KEYS = ("sourceId", "destId", "cost", "size", "isArtificial")


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _num(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise InvalidArtifact(f"expected a number >= 0, got {value!r}", field=_path(where, key))
    return float(value)


def _flag(value, key: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidArtifact(f"expected true/false or 0/1, got {value!r}", field=_path(where, key))


def _int(value, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArtifact(f"expected an integer, got {value!r}", field=_path(where, key))
    return value


def _keys(item, valid: tuple[str, ...], required: tuple[str, ...], where: str, what: str) -> None:
    if not isinstance(item, dict):
        raise InvalidArtifact("expected an object", field=where)
    for key in item:
        if key not in valid:
            raise InvalidArtifact(f"{what}: unknown key {key!r} (valid keys: {', '.join(valid)})",
                                  field=where)
    for key in required:
        if key not in item:
            raise InvalidArtifact(f"{what}: missing required key {key!r}", field=where)


@dataclass
class _Node:
    id: int
    latency: float
    size: float
    backward: bool
    color: tuple  # ("class", n) or ("own", node id): one key space, never colliding
    name: str
    where: str


@dataclass
class _Class:
    forward: list[int] = field(default_factory=list)
    backward: list[int] = field(default_factory=list)


def import_placement_json(path: str | Path, *, device_type: str = "V100-16GB", batch_size: int = 1,
                          transfer_gbps: float = DEFAULT_TRANSFER_GBPS,
                          name: str | None = None) -> OpGraph:
    """Read a placement-JSON workload into an ``OpGraph`` (see the module docstring).

    ``device_type`` names the catalog type the latencies were measured on,
    ``batch_size`` the batch they were measured at, ``transfer_gbps`` the rate
    that turns an edge's ``cost`` (ms) into bytes (the files say none of them).

    Raises ``InvalidArtifact`` naming the file, the field (``nodes[3].fpgaLatency``)
    and the node of malformed input: an unknown or missing key, a bad value, a
    duplicate node id, an edge naming a node that does not exist, a node with
    two different outgoing costs, an edge from a backward to a forward node, a
    cycle. O(nodes + edges).
    """
    from . import kind_of_description

    path = Path(path)
    lookup(device_type)
    if batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, got {batch_size}")
    if transfer_gbps <= 0:
        raise BadInput(f"--transfer-gbps must be > 0, got {transfer_gbps}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise InvalidArtifact(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                              file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read it as text: {exc}") from None
    try:
        return _build(doc, path, device_type, batch_size, transfer_gbps, name, kind_of_description)
    except InvalidArtifact as exc:
        raise exc.at(file=str(path)) from None


def _read_nodes(doc: dict) -> dict[int, _Node]:
    nodes: dict[int, _Node] = {}
    for i, item in enumerate(doc["nodes"]):
        where = f"nodes[{i}]"
        what = f"node {item.get('id')!r}" if isinstance(item, dict) else "node"
        _keys(item, _NODE_KEYS, ("id", "fpgaLatency", "isBackwardNode"), where, what)
        node_id = _int(item["id"], "id", where)
        for key in ("cpuLatency",):
            if key in item:
                _num(item[key], key, where)
        if "supportedOnFpga" in item:
            _flag(item["supportedOnFpga"], "supportedOnFpga", where)
        color = item.get("colorClass")
        if node_id in nodes:
            raise InvalidArtifact(f"duplicate node id {node_id} (first at {nodes[node_id].where})",
                                  field=f"{where}.id")
        nodes[node_id] = _Node(
            id=node_id, latency=_num(item["fpgaLatency"], "fpgaLatency", where),
            size=_num(item.get("size", 0.0), "size", where),
            backward=_flag(item["isBackwardNode"], "isBackwardNode", where),
            color=("own", node_id) if color is None else ("class", _int(color, "colorClass", where)),
            name=str(item.get("name", "")), where=where)
    if not any(not n.backward for n in nodes.values()):
        raise InvalidArtifact("no forward nodes (every node has isBackwardNode set)", field="nodes")
    return nodes


def _read_edges(doc: dict, nodes: dict[int, _Node]) -> list[tuple[int, int, float]]:
    """The edges as (source, destination, the source's cost), checked as the module says."""
    edges = []
    cost_of: dict[int, tuple[float, str]] = {}
    whole = nx.DiGraph()
    whole.add_nodes_from(nodes)
    for k, item in enumerate(doc["edges"]):
        where = f"edges[{k}]"
        what = (f"edge {item.get('sourceId')!r} -> {item.get('destId')!r}"
                if isinstance(item, dict) else "edge")
        _keys(item, _EDGE_KEYS, ("sourceId", "destId", "cost"), where, what)
        src, dst = _int(item["sourceId"], "sourceId", where), _int(item["destId"], "destId", where)
        for end, key in ((src, "sourceId"), (dst, "destId")):
            if end not in nodes:
                raise InvalidArtifact(f"edge {src} -> {dst} names node {end}, which no node has",
                                      field=f"{where}.{key}")
        if src == dst:
            raise InvalidArtifact(f"edge {src} -> {dst} is a self-loop on node {src}", field=where)
        if nodes[src].backward and not nodes[dst].backward:
            raise InvalidArtifact(f"edge {src} -> {dst} runs from backward node {src} to forward "
                                  f"node {dst}; the format allows none", field=where)
        cost = _num(item["cost"], "cost", where)
        if "size" in item:
            _num(item["size"], "size", where)
        if "isArtificial" in item:
            _flag(item["isArtificial"], "isArtificial", where)
        first = cost_of.setdefault(src, (cost, where))
        if abs(first[0] - cost) > 1e-6:
            raise InvalidArtifact(f"node {src} has two outgoing costs, {first[0]:g} ({first[1]}) "
                                  f"and {cost:g}; the format gives one per node", field=f"{where}.cost")
        whole.add_edge(src, dst)
        edges.append((src, dst, cost))
    if not nx.is_directed_acyclic_graph(whole):
        cycle = nx.find_cycle(whole)
        raise InvalidArtifact("the nodes form a cycle: " + " -> ".join(
            str(x) for x in [cycle[0][0], *(v for _, v in cycle)]), field="edges")
    return edges


def _build(doc, path, device_type, batch_size, transfer_gbps, name, kind_of) -> OpGraph:
    if not isinstance(doc, dict):
        raise InvalidArtifact("expected a JSON object with 'nodes' and 'edges'")
    for key in doc:
        if key not in _TOP_KEYS:
            raise InvalidArtifact(f"unknown key {key!r} (valid keys: {', '.join(_TOP_KEYS)})")
    for key in ("nodes", "edges"):
        if not isinstance(doc.get(key), list):
            raise InvalidArtifact(f"missing required list {key!r}", field=key)
    options: dict = {}
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs"):
        if key in doc:
            value = _num(doc[key], key, "")
            options[key] = value if key == "maxSizePerFPGA" else int(value)
    nodes = _read_nodes(doc)
    edges = _read_edges(doc, nodes)
    classes: dict[tuple, _Class] = defaultdict(_Class)
    for n in nodes.values():
        (classes[n.color].backward if n.backward else classes[n.color].forward).append(n.id)

    # op ids: the names when every forward node and every orphaned backward node has a
    # unique one, else the node ids; an orphaned class's artificial op is "fwd:" + the
    # label of its first backward node
    heads = [i for c in classes.values() for i in (c.forward or c.backward[:1])]
    names = [nodes[i].name for i in heads]
    use_names = all(names) and len(set(names)) == len(names)
    op_of_node = {}  # forward node, or an orphaned class's first backward node -> op id
    for c in classes.values():
        for i in c.forward or c.backward[:1]:
            label = nodes[i].name if use_names else str(i)
            op_of_node[i] = label if c.forward else f"fwd:{label}"
    if len(set(op_of_node.values())) != len(op_of_node):
        raise InvalidArtifact("an artificial forward op's id 'fwd:...' equals a node's name; "
                              "rename that node")

    ops = _ops(nodes, classes, op_of_node, device_type, kind_of)
    op_edges, mirrors = _op_edges(nodes, classes, edges, op_of_node, transfer_gbps)
    groups = [[op_of_node[i] for i in c.forward] for c in classes.values() if len(c.forward) >= 2]
    graph, colocation = _fuse_cycles(list(ops), op_edges, mirrors, groups)
    file_pos = {op: k for k, op in enumerate(ops)}
    order = list(nx.lexicographical_topological_sort(graph, key=file_pos.__getitem__))
    position = {op: k for k, op in enumerate(order)}
    ref = ModelRef(name=name or path.stem, source="placement-json", batch_size=batch_size,
                   options={"file": path.name, **options})
    info = ProfileInfo(device_type=device_type,
                       note=f"imported from placement JSON {path.name}; fpgaLatency as recorded, "
                            f"edge costs as bytes at {transfer_gbps:g} Gbps")
    try:
        return OpGraph(model=ref, granularity="layer", profile=info,
                       ops=tuple(ops[op] for op in order),
                       edges=tuple(Edge(src=s, dst=d, bytes=b) for (s, d), b in sorted(
                           op_edges.items(), key=lambda kv: (position[kv[0][1]], position[kv[0][0]]))),
                       colocation=colocation)
    except ValueError as exc:
        raise InvalidArtifact(str(exc)) from None


def _ops(nodes, classes, op_of_node, device_type, kind_of) -> dict[str, Op]:
    """One op per forward node and per orphaned class, in the file order of their nodes."""
    ops: dict[str, Op] = {}
    training = any(n.backward for n in nodes.values())  # else a forward-only (inference) file
    for n in nodes.values():
        c = classes[n.color]
        if n.id not in op_of_node:
            continue  # a backward node: its time and size go to its class's forward ops
        members = [nodes[i].latency for i in c.forward]
        k = c.forward.index(n.id) if c.forward else 0
        total = sum(members)
        share = members[k] / total if total > 0 else 1 / max(len(members), 1)
        bwd_ms = sum(nodes[b].latency for b in c.backward) * share
        # the class's backward sizes go to its first forward op: the class shares a device
        resident = (0.0 if n.backward else n.size) + (
            sum(nodes[b].size for b in c.backward) if k == 0 else 0.0)
        ops[op_of_node[n.id]] = Op(
            id=op_of_node[n.id], name=f"forward of {n.name or n.id}" if n.backward else n.name,
            kind=kind_of("" if n.backward else n.name), resident_bytes=int(round(resident)),
            fwd_ms={device_type: 0.0 if n.backward else n.latency},
            bwd_ms={device_type: round(bwd_ms, 12)} if training else {},
            runs_backward=bool(c.backward))
    return ops


def _op_edges(nodes, classes, edges, op_of_node,
              transfer_gbps) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """Op edges with bytes: forward edges, and the mirrors of orphaned backward edges; and
    which of them are mirrors only (no forward edge joins the same ops)."""
    bytes_per_ms = transfer_gbps * 1e9 / 8 / 1e3
    out: dict[tuple[str, str], int] = {}
    forward: set[tuple[str, str]] = set()

    def head(node: _Node) -> str:  # the op a backward node's class runs with
        c = classes[node.color]
        return op_of_node[(c.forward or c.backward)[0]]

    for src, dst, cost in edges:
        s, d = nodes[src], nodes[dst]
        if s.backward and d.backward and (classes[s.color].forward and classes[d.color].forward):
            continue  # the mirror of a forward edge, which carries it
        if s.backward != d.backward:
            continue  # forward -> backward: stashed activations stay with their class
        a, b = (op_of_node[src], op_of_node[dst]) if not s.backward else (head(d), head(s))
        # an orphaned gradient src -> dst runs the forward edge forward(dst) -> forward(src)
        if a != b:
            out[(a, b)] = max(out.get((a, b), 0), int(round(cost * bytes_per_ms)))
            if not s.backward:
                forward.add((a, b))
    return out, set(out) - forward


def _fuse_cycles(op_ids: list[str], op_edges: dict[tuple[str, str], int],
                 mirrors: set[tuple[str, str]], groups: list[list[str]]):
    """The op DiGraph and the colocation groups, with every cycle that mirror edges close
    fused as the reference implementation fuses the strongly connected components of its
    class graph: the cycle's ops share a device (one group, merged with the groups it
    touches) and the mirror edges among them go (the forward edges alone are acyclic)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(op_ids)
    graph.add_edges_from(op_edges)
    root = {op: op for op in op_ids}

    def find(op: str) -> str:
        while root[op] != op:
            root[op] = root[root[op]]
            op = root[op]
        return op

    cycles = [scc for scc in nx.strongly_connected_components(graph) if len(scc) >= 2]
    for members in [*cycles, *groups]:
        first, *rest = sorted(members)
        for op in rest:
            root[find(op)] = find(first)
    for scc in cycles:
        for a, b in sorted(mirrors):
            if a in scc and b in scc:
                del op_edges[(a, b)]
                graph.remove_edge(a, b)
    merged: dict[str, list[str]] = {}
    for op in op_ids:
        merged.setdefault(find(op), []).append(op)
    return graph, tuple(tuple(m) for m in merged.values() if len(m) >= 2)
