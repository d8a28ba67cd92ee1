"""Import the JSON input of the NeurIPS 2020 device-placement algorithms
(Tarnawski et al., msr-fiddle/dnn-partitioning) as an op graph.

Format::

    {"maxSizePerFPGA": 17185374208.0, "maxFPGAs": 6, "maxCPUs": 1,
     "nodes": [{"id": 4, "supportedOnFpga": 1, "cpuLatency": 1.4, "fpgaLatency": 0.14,
                "isBackwardNode": 0, "colorClass": 4, "size": 145489920.0, "name": "node4"}, ...],
     "edges": [{"sourceId": 4, "destId": 5, "cost": 0.0061, "size": 13107200.0}, ...]}

``fpgaLatency`` is the time on the accelerator (milliseconds; for layer
graphs it was profiled on a GPU), ``size`` the bytes the node takes on the
accelerator, ``cost`` the time to move a node's output between accelerator
and host memory. Forward and backward nodes are paired by ``colorClass``.

Each forward node becomes an op (id = its ``name`` when names are unique, else
its id): ``fwd_ms`` is its ``fpgaLatency`` under ``device_type``, ``bwd_ms``
the summed ``fpgaLatency`` of the backward nodes of its colour class (shared
in proportion to forward latency when a class has several forward nodes),
``param_bytes`` its ``size``. Edges between forward nodes keep their ``size``
(debug field) as bytes, or convert ``cost`` milliseconds at
``transfer_gbps``. ``cpuLatency`` is dropped (the published files set it to a
fixed multiple of the accelerator time, not a measurement); the memory limit
and device counts go to the model options.
"""

from __future__ import annotations

import json
from collections import defaultdict
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


def _path(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _num(value, field: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise InvalidArtifact(f"expected a number >= 0, got {value!r}", field=_path(where, field))
    return float(value)


def _flag(value, field: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidArtifact(f"expected true/false or 0/1, got {value!r}", field=_path(where, field))


def _int(value, field: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArtifact(f"expected an integer, got {value!r}", field=_path(where, field))
    return value


def import_placement_json(path: str | Path, *, device_type: str = "V100-16GB", batch_size: int = 1,
                          transfer_gbps: float = 126.0, name: str | None = None) -> OpGraph:
    """Read a placement-JSON workload into an ``OpGraph`` (see the module docstring).

    ``device_type`` names the catalog type the latencies were measured on,
    ``batch_size`` the batch they were measured at (the files do not say).

    Raises ``InvalidArtifact`` naming the file and field (``nodes[3].fpgaLatency``)
    of malformed input, an unpaired backward node, an unknown edge end, or a
    cycle among forward nodes. O(nodes + edges).
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


def _build(doc, path, device_type, batch_size, transfer_gbps, name, kind_of) -> OpGraph:
    if not isinstance(doc, dict):
        raise InvalidArtifact("expected a JSON object with 'nodes' and 'edges'")
    for key in ("nodes", "edges"):
        if not isinstance(doc.get(key), list):
            raise InvalidArtifact(f"missing required list {key!r}", field=key)
    options: dict = {}
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs"):
        if key in doc:
            value = _num(doc[key], key, "")
            options[key] = value if key == "maxSizePerFPGA" else int(value)
    forward: dict[int, dict] = {}
    backward: list[dict] = []
    for i, node in enumerate(doc["nodes"]):
        where = f"nodes[{i}]"
        if not isinstance(node, dict):
            raise InvalidArtifact("expected an object", field=where)
        for key in ("id", "fpgaLatency", "size", "isBackwardNode"):
            if key not in node:
                raise InvalidArtifact(f"missing required key {key!r}", field=where)
        entry = {"id": _int(node["id"], "id", where),
                 "latency": _num(node["fpgaLatency"], "fpgaLatency", where),
                 "size": _num(node["size"], "size", where),
                 "backward": _flag(node["isBackwardNode"], "isBackwardNode", where),
                 "color": (_int(node["colorClass"], "colorClass", where)
                           if node.get("colorClass") is not None else None),
                 "name": str(node.get("name", "")), "where": where}
        if "cpuLatency" in node:
            _num(node["cpuLatency"], "cpuLatency", where)
        if entry["id"] in forward or any(b["id"] == entry["id"] for b in backward):
            raise InvalidArtifact(f"duplicate node id {entry['id']}", field=f"{where}.id")
        if entry["backward"]:
            backward.append(entry)
        else:
            forward[entry["id"]] = entry
    if not forward:
        raise InvalidArtifact("no forward nodes (every node has isBackwardNode set)", field="nodes")
    by_color: dict[int, list[dict]] = defaultdict(list)
    for f in forward.values():
        if f["color"] is not None:
            by_color[f["color"]].append(f)
    bwd_ms: dict[int, float] = defaultdict(float)
    for b in backward:
        if b["color"] is None or b["color"] not in by_color:
            why = ("no colorClass" if b["color"] is None
                   else f"colorClass {b['color']}, which no forward node has")
            raise InvalidArtifact(f"backward node {b['id']} has {why}, so it cannot be paired "
                                  f"with a forward node", field=b["where"])
        members = by_color[b["color"]]
        total = sum(m["latency"] for m in members)
        for m in members:
            share = m["latency"] / total if total > 0 else 1 / len(members)
            bwd_ms[m["id"]] += b["latency"] * share
    names = [f["name"] for f in forward.values()]
    use_names = all(names) and len(set(names)) == len(names)
    op_id = {i: (f["name"] if use_names else str(i)) for i, f in forward.items()}
    graph = nx.DiGraph()
    graph.add_nodes_from(forward)
    edge_bytes: dict[tuple[int, int], int] = {}
    known = set(forward) | {b["id"] for b in backward}
    for k, edge in enumerate(doc["edges"]):
        where = f"edges[{k}]"
        if not isinstance(edge, dict):
            raise InvalidArtifact("expected an object", field=where)
        for key in ("sourceId", "destId", "cost"):
            if key not in edge:
                raise InvalidArtifact(f"missing required key {key!r}", field=where)
        src, dst = _int(edge["sourceId"], "sourceId", where), _int(edge["destId"], "destId", where)
        cost = _num(edge["cost"], "cost", where)
        for end, key in ((src, "sourceId"), (dst, "destId")):
            if end not in known:
                raise InvalidArtifact(f"unknown node id {end}", field=f"{where}.{key}")
        if src not in forward or dst not in forward or src == dst:
            continue  # backward-pass edges mirror forward ones; activations stay on the device
        nbytes = (_num(edge["size"], "size", where) if "size" in edge
                  else cost / 1e3 * transfer_gbps * 1e9 / 8)
        graph.add_edge(src, dst)
        edge_bytes[(src, dst)] = max(edge_bytes.get((src, dst), 0), int(round(nbytes)))
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise InvalidArtifact("the forward nodes form a cycle: " + " -> ".join(
            str(x) for x in [cycle[0][0], *(v for _, v in cycle)]), field="edges")
    order = list(nx.lexicographical_topological_sort(graph))
    out_bytes = defaultdict(int)
    for (src, _), nbytes in edge_bytes.items():
        out_bytes[src] = max(out_bytes[src], nbytes)
    ops = tuple(Op(id=op_id[i], name=forward[i]["name"] or f"node {i}",
                   kind=kind_of(forward[i]["name"]),
                   param_bytes=int(round(forward[i]["size"])), output_bytes=out_bytes[i],
                   fwd_ms={device_type: forward[i]["latency"]},
                   bwd_ms={device_type: round(bwd_ms[i], 9)} if backward else {})
                for i in order)
    position = {i: n for n, i in enumerate(order)}
    edges = tuple(Edge(src=op_id[s], dst=op_id[d], bytes=b) for (s, d), b in
                  sorted(edge_bytes.items(), key=lambda kv: (position[kv[0][1]], position[kv[0][0]])))
    ref = ModelRef(name=name or path.stem, source="placement-json", batch_size=batch_size,
                   options={"file": path.name, **options})
    info = ProfileInfo(device_type=device_type,
                       note=f"imported from placement JSON {path.name}; fpgaLatency as recorded")
    try:
        return OpGraph(model=ref, granularity="layer", profile=info, ops=ops, edges=edges)
    except ValueError as exc:
        raise InvalidArtifact(str(exc)) from None
